"""The dependent run: which pipelines, landing steps and derive tiers form one unit, in which order,
and what a failed member means for the rest of it.

Implements ``surface.dispatch.not-a-head`` (a pipeline naming ``after`` is a landing step of its
head's dependent run; the run is the unit and its cadence rides the head), ``run.select.derive-order``
and ``run.select.parent-outcome`` (a derive tier runs after its parents, on their run, once each
produced a run outcome, a failed one included), and ``run.cancel.distinct-terminal-status`` (a
canceled upstream on a healthy table fails nothing after it). The one home above the stages that
``contextful pipeline run``, ``serve``, ``--cycle`` and ``/wake`` share: landing lands one pipeline
(``engine.land.pipeline``), derive derives one (``engine.derive.run``); neither knows the other.

A *head* is a pipeline following nothing: a landing pipeline with no ``after`` (or a derive
pipeline reading no table a pipeline of the manifest lands, and naming no ``after``). A member
joins a head's unit when it follows one of the unit's members — a *step* through its ``after``, a
*tier* (a derive pipeline) through its derive parents — so a step naming several pipelines in
``after`` is a step of each unit it reaches, and a derive tier of each unit holding one of its
parents (decision documented in docs/manifest.md, "Units"). Within a unit a member waits only for
the members it follows: the others are not run by this unit, and it reads their committed rows, as
a job without ``after`` reads committed inputs. Landing is incremental, so a second unit re-running
a shared step lands only what is new since.

    >>> from contextful.engine.config.manifest import Manifest, PipelineSpec, SourceSpec
    >>> from contextful.engine.project import Project
    >>> from pathlib import Path
    >>> files = SourceSpec("files", {"paths": ["x/*.ndjson"]})
    >>> manifest = Manifest(Path("."), Project(Path("."), "p", ".contextful/store", None),
    ...     (PipelineSpec("a", files, "a"), PipelineSpec("b", files, "b"), PipelineSpec("s", files, "s", after=("a", "b"))))
    >>> [(u.head, u.members) for u in units_of(manifest)]
    [('a', ('a', 's')), ('b', ('b', 's'))]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.engine.config.manifest import Manifest, PipelineSpec
from contextful.engine.land.decode import Decoder
from contextful.engine.land.pipeline import CHECKPOINT_BYTES, run_pipeline
from contextful.engine.land.results import InputFailure, PipelineResult, Progress, TableLanding
from contextful.storage import Store
from contextful.storage.errors import ContextfulError, DispatchUnitNotAHead

if TYPE_CHECKING:
    from contextful.engine.derive.bind import MachineConfig


@dataclass(frozen=True)
class Unit:
    """One dependent run: a head and what runs after it on its run."""

    head: str
    """The pipeline whose cadence the unit rides."""
    steps: tuple[str, ...]
    """The landing steps (pipelines naming ``after``), in run order."""
    tiers: tuple[str, ...]
    """The derive pipelines, in run order."""
    members: tuple[str, ...]
    """The head, then the steps and tiers in one dependency order (ties: higher priority, then id)."""


@dataclass(frozen=True)
class RanElsewhere:
    """A unit's landing members that ran outside this process (on serve's workers,
    ``engine.control.relay``), and how they ended: its derive tiers then run alone, after them."""

    failed: frozenset[str] = frozenset()
    """Landing members that failed (a completed run outcome, or none)."""
    unlaunched: frozenset[str] = frozenset()
    """Of those, the ones that produced no run outcome at all (a worker dispatch error): the tiers
    reading them are not run (``run.select.parent-outcome``)."""


@dataclass(frozen=True)
class UnitResult:
    head: str
    results: list[PipelineResult]
    """One per member, in run order."""
    failed: tuple[str, ...] = ()
    """The members that failed (a canceled run over a healthy table is not one)."""

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def canceled(self) -> tuple[str, ...]:
        """The members whose run was canceled (``RunCanceled``): failed or not, they landed nothing."""
        return tuple(r.pipeline for r in self.results if any(f.error == "RunCanceled" for f in r.failures))


def units_of(manifest: Manifest) -> list[Unit]:
    """One unit per head, the heads in dependency-order ties (higher priority first, then id)."""
    return [_unit(manifest, head.id) for head in manifest.in_dependency_order() if not head.follows]


def unit_of(manifest: Manifest, pipeline_id: str) -> Unit:
    """The unit headed by ``pipeline_id``; a step or tier raises :class:`DispatchUnitNotAHead`
    naming the first head it rides (``KeyError`` for an id the manifest lacks)."""
    if not manifest.pipeline(pipeline_id).follows:
        return _unit(manifest, pipeline_id)
    head = next(u.head for u in units_of(manifest) if pipeline_id in u.members)
    raise DispatchUnitNotAHead(pipeline_id, head)


def _unit(manifest: Manifest, head: str) -> Unit:
    members = {head}
    grew = True
    while grew:  # bounded by the pipeline count: each pass adds a member or ends
        more = {p.id for p in manifest.pipelines if members.intersection(p.follows)} - members
        members |= more
        grew = bool(more)
    ordered = manifest.in_dependency_order(sorted(members))
    return Unit(head, tuple(p.id for p in ordered if p.id != head and p.source.kind != "derive"),
                tuple(p.id for p in ordered if p.id != head and p.source.kind == "derive"),
                tuple(p.id for p in ordered))


def run_unit(store: Store, manifest: Manifest, unit: Unit, *, decoder: Decoder | None = None,
             progress: Callable[[Progress], None] | None = None, cancel: threading.Event | None = None,
             machine: MachineConfig | None = None, checkpoint_bytes: int = CHECKPOINT_BYTES,
             elsewhere: RanElsewhere | None = None) -> UnitResult:
    """Run ``unit``'s members in order, sharing one decoder, under the rules of :func:`run_pipelines`;
    with ``elsewhere``, only its derive tiers, its landing members having run as it says."""
    members = unit.tiers if elsewhere is not None else unit.members
    results, failed = _run_in_order(store, manifest, [manifest.pipeline(m) for m in members],
                                    checkpoint_bytes=checkpoint_bytes, decoder=decoder, progress=progress,
                                    cancel=cancel, machine=machine, elsewhere=elsewhere)
    return UnitResult(unit.head, results, tuple(m for m in unit.members if m in failed))


def run_pipelines(store: Store, manifest: Manifest, ids: list[str] | None = None, *,
                  checkpoint_bytes: int = CHECKPOINT_BYTES, decoder: Decoder | None = None,
                  progress: Callable[[Progress], None] | None = None,
                  cancel: threading.Event | None = None,
                  machine: MachineConfig | None = None) -> list[PipelineResult]:
    """Run the named pipelines (default: all) in dependency order, each derive pipeline after the
    pipelines it reads, on their run, sharing one decoder server. A JavaScript engine importable
    here, or a derive pipeline whose engine the machine configuration does not bind, refuses them
    all first (``engine.run.script_runtime``, ``engine.derive.bind``): nothing runs.

    A pipeline runs after its ``after`` pipelines only when they succeeded; a derive pipeline runs
    after its derive parents once each produced a run outcome, a failed one included, and reads
    their committed rows (``run.select.parent-outcome``); one whose parent could not start at all
    is not run. Pipelines outside the selection are not waited for: their committed rows are read."""
    results, _failed = _run_in_order(store, manifest, manifest.in_dependency_order(ids),
                                     checkpoint_bytes=checkpoint_bytes, decoder=decoder, progress=progress,
                                     cancel=cancel, machine=machine)
    return results


def run_landing_step(store: Store, manifest: Manifest, pipeline_id: str, *,
                     cancel: threading.Event | None = None) -> PipelineResult:
    """Land one landing member alone, none of its derive descendants: what a worker runs for
    serve's relay (``engine.control.worker``), the tiers running after it in serve's unit child."""
    [result], _failed = _run_in_order(store, manifest, [manifest.pipeline(pipeline_id)],
                                      checkpoint_bytes=CHECKPOINT_BYTES, decoder=None, progress=None,
                                      cancel=cancel, machine=None)
    return result


def _run_in_order(store: Store, manifest: Manifest, specs: Sequence[PipelineSpec], *, checkpoint_bytes: int,
                  decoder: Decoder | None, progress: Callable[[Progress], None] | None,
                  cancel: threading.Event | None, machine: MachineConfig | None,
                  elsewhere: RanElsewhere | None = None) -> tuple[list[PipelineResult], set[str]]:
    """Run ``specs`` (in dependency order) and say which failed, counting what ran ``elsewhere``
    as if it ran first; the rules are :func:`run_pipelines`'."""
    from contextful.engine.run.script_runtime import refuse_script_runtime

    refuse_script_runtime()
    if any(spec.source.kind == "derive" for spec in specs):
        machine = _armed_machine(manifest, specs, machine)
    owned = decoder is None
    decoder = decoder or Decoder()
    results: list[PipelineResult] = []
    failed: set[str] = set(elsewhere.failed) if elsewhere is not None else set()
    # pipelines that produced no run outcome at all
    unlaunched: set[str] = set(elsewhere.unlaunched) if elsewhere is not None else set()
    try:
        for spec in specs:
            upstream = sorted(failed.intersection(spec.after) | unlaunched.intersection(spec.derive_parents))
            if upstream:  # its inputs did not land: running it would build on stale rows
                failed.add(spec.id)
                unlaunched.add(spec.id)
                results.append(PipelineResult(spec.id, [TableLanding(spec.table)], failures=[InputFailure(
                    spec.id, "UpstreamFailed", f"not run: pipeline(s) {', '.join(upstream)} it runs after failed",
                    1)]))
                continue
            try:
                result = _run_member(store, manifest, spec, decoder, checkpoint_bytes=checkpoint_bytes,
                                     progress=progress, cancel=cancel, machine=machine)
            except ContextfulError as exc:  # this pipeline fails by name; the others still run
                from contextful.engine.guard import mask_message

                unlaunched.add(spec.id)
                result = PipelineResult(spec.id, [TableLanding(spec.table)], failures=[
                    InputFailure(spec.id, exc.name, mask_message(exc.detail), exc.exit_code)])
            if not result.ok and not _canceled_upon_health(store, spec, result):
                failed.add(spec.id)
            results.append(result)
        return results, failed
    finally:
        if owned:
            decoder.close()


def _run_member(store: Store, manifest: Manifest, spec: PipelineSpec, decoder: Decoder, *, checkpoint_bytes: int,
                progress: Callable[[Progress], None] | None, cancel: threading.Event | None,
                machine: MachineConfig | None) -> PipelineResult:
    """One member's run: a derive pipeline derives its outstanding units with ``machine``'s engine
    bindings (``engine.derive.run``); any other lands its source's new rows (``engine.land``)."""
    if spec.source.kind == "derive":
        from contextful.engine.derive.run import run_derive

        assert machine is not None  # armed by _run_in_order before any member runs
        return run_derive(store, manifest, spec, machine, progress=progress)
    return run_pipeline(store, manifest, spec, decoder, checkpoint_bytes=checkpoint_bytes, progress=progress,
                        cancel=cancel)


def _armed_machine(manifest: Manifest, specs: Sequence[PipelineSpec],
                   machine: MachineConfig | None) -> MachineConfig:
    """The machine configuration, every derive pipeline of ``specs`` resolved against it first."""
    from contextful.engine.derive.bind import machine_path, read_machine
    from contextful.engine.derive.run import check_tiers

    if machine is None:
        machine, problems = read_machine(machine_path(manifest.root))
        if problems:
            raise problems[0]
    problems = check_tiers(specs, machine)
    if problems:
        raise problems[0]
    return machine


def _canceled_upon_health(store: Store, spec: PipelineSpec, result: PipelineResult) -> bool:
    """Whether ``result`` is a canceled run of a healthy upstream: health observations skip a
    canceled run (``run.cancel.distinct-terminal-status``), so what runs after it reads the rows
    its last settled run left, unless that run failed."""
    from contextful.engine.run.health import upstream_health
    from contextful.storage.errors import RunCanceled

    if [f.error for f in result.failures] != [RunCanceled.__name__]:
        return False
    observed = upstream_health(store, [spec.table])[spec.table]
    return observed is None or observed.healthy
