"""Running a derive pipeline: select the outstanding units, run their engine, land their rows.

One run of a derive pipeline (``contextful pipeline run``; decisions "derive-work-set",
"derivation-key-decides", "host-registered-derive"):

1. resolve the build: a built-in task's engine binding from the machine configuration
   (``engine.derive.bind``: DeriveEngineUnbound, DeriveDriverMismatch) or the registered host
   task; the build's part of every key (``engine.derive.keys``);
2. open or resume the pipeline's execution (``engine.run.execution``): a resumed run replays the
   answers its engines gave before it was killed (one journal step per unit), so a unit whose
   engine already answered is not run again;
3. select the outstanding units (``engine.derive.select``) and run them, up to the binding's
   ``parallelism`` at once (default: the machine's cores): a built-in unit through its engine
   chain (``engine.derive.exec``) or fetch driver, a host unit through its callable;
4. retire the units whose parent left (``engine.derive.retire``: decision "derived-unit-follows"),
   so their rows leave before anything is derived;
5. land each unit's rows (``engine.derive.emit``) through the landing sink (the secret guard
   masks passages like every landing), committing every :data:`FLUSH_UNITS` units or
   :data:`FLUSH_SECONDS`. Before each commit the output table's head is read again: a unit another
   run settled under the same key meanwhile lands nothing from this run
   (``run.emit.settled-revived``), and the commit requires that head, so the check and the commit
   are one step. A host task's content tables and its marker table land in that one catalog
   commit (``storage.transaction.commit_together``; each table its own run, ``run.emit.marker-last``):
   a unit's content never shows without its marker, and a run losing the race to another run or
   a content table failing publishes none of the flush's rows, so the units run again.

A transient failure of the run (a flush's ``StagingFailed``, ``CatalogUnavailable``,
``CommitOutcomeUnknown``) leaves its execution pending, as a kill does (``engine.land.journal``):
the next run resumes it and replays the journaled answers instead of calling the engines again.

Per-unit failures are marker rows, not run failures: the run completes, reports them (counts,
the first errors, masked) and a later run retries a failed unit until ``max_attempts``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from contextful.engine.derive.config import DeriveConfig
from contextful.engine.derive.emit import (
    KEY_COLUMNS,
    Answer,
    builtin_rows,
    builtin_schema,
    failed,
    host_answer,
    host_content_schema,
    host_marker_schema,
    host_rows,
    parse_engine_output,
)
from contextful.engine.derive.keys import canonical, is_address, local_path, static_digest
from contextful.engine.derive.retire import retire
from contextful.engine.derive.select import Selection, SelectionCounts
from contextful.engine.derive.tasks import HostTask, TaskUnit
from contextful.engine.land.results import InputFailure, PipelineResult, Progress, TableLanding
from contextful.storage.errors import (
    CommitConflict,
    ContextfulError,
    DeriveMediaUnreadable,
    DeriveSettledUnitRevived,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest, PipelineSpec
    from contextful.engine.derive.bind import Binding, MachineConfig
    from contextful.engine.run.execution import Execution
    from contextful.storage import Store

log = logging.getLogger(__name__)

FLUSH_UNITS = 500
FLUSH_SECONDS = 30.0
REVIVE_ATTEMPTS = 8
"""Commits retried while other runs keep moving the output table's head."""
ERRORS_SHOWN = 3
WARNINGS_KEPT = 20
"""Unit warnings a run's result carries (every one is logged)."""


def unit_exit_code(error: str) -> int:
    """The exit code a unit failed on ``error`` (a class name) gives its run: the catalogue error's
    own, else (a host task's own exception) incompatible's, as a unit's media or output that cannot land."""
    from contextful.storage import errors

    found = getattr(errors, error, None)
    if isinstance(found, type) and issubclass(found, errors.ContextfulError):
        return errors.EXIT_CODES[found.category]
    return errors.EXIT_CODES["incompatible"]


@dataclass
class DeriveStats:
    """What one derive run did, by unit."""

    eligible: int = 0
    derived: int = 0
    outstanding: int = 0
    ok: int = 0
    empty: int = 0
    unavailable: int = 0
    failed: int = 0
    replayed: int = 0
    """Units whose answer an earlier, killed attempt had journaled (not run again)."""
    retired: int = 0
    """Units whose parent left, retired before deriving (``engine.derive.retire``)."""
    revived: int = 0
    errors: list[str] = field(default_factory=list)
    """The first failures' text (masked)."""
    first_failures: list[InputFailure] = field(default_factory=list)
    """The first failures, as a failed input reports its failure (``pipeline run`` prints them)."""

    def count(self, unit: str, answer: Answer) -> None:
        setattr(self, answer.status, getattr(self, answer.status) + 1)
        if answer.status == "failed" and answer.error and len(self.errors) < ERRORS_SHOWN:
            name, detail = answer.error["name"], answer.error["detail"]
            self.errors.append(f"unit {unit}: {name}: {detail}")
            self.first_failures.append(InputFailure(f"unit {unit}", name, f"unit {unit}: {detail}", unit_exit_code(name)))

    @property
    def done(self) -> int:
        return self.ok + self.empty + self.unavailable + self.failed

    def to_json(self) -> dict[str, Any]:
        return {"eligible": self.eligible, "derived": self.derived, "outstanding": self.outstanding, "done": self.done,
                "ok": self.ok,
                "empty": self.empty, "unavailable": self.unavailable, "failed": self.failed,
                "replayed": self.replayed, "revived": self.revived, "retired": self.retired, "errors": self.errors}


@dataclass(frozen=True)
class Tier:
    """A derive pipeline's build: what it reads, what runs each unit, and its key's static part."""

    spec: PipelineSpec
    config: DeriveConfig
    static: str
    version: str
    binding: Binding | None = None
    task: HostTask | None = None

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables it lands: the output table, or a host task's content tables then its marker table."""
        if self.task is None:
            return (self.spec.table,)
        return (*self.task.content_tables, self.task.marker_table)

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The output tables' primary key (with ``task_version`` when versions are retained: the
        supersede rule's unit columns are key columns)."""
        return KEY_COLUMNS + (("task_version",) if self.config.retain_versions else ())

    def landing_spec(self, table: str) -> PipelineSpec:
        """The pipeline spec its rows of ``table`` land under: keyed, nested, typed as built."""
        return replace(self.spec, table=table, primary_key=self.key_columns, normalize="nested", types={},
                       transform=(), order_by=None)

    @property
    def parallelism(self) -> int:
        bound = self.binding.parallelism if self.binding is not None else None
        return max(1, bound or os.cpu_count() or 1)


def build_tier(spec: PipelineSpec, machine: MachineConfig) -> Tier:
    """Resolve a derive pipeline against the machine configuration and the task registry."""
    from contextful.engine.derive.bind import binding_for, check_driver
    from contextful.engine.derive.tasks import host_task, unknown_task

    config = DeriveConfig.from_config(spec.source.config)
    columns = sorted(set(config.columns))
    if config.builtin:
        binding = binding_for(machine, spec.id, str(config.engine))
        problems = check_driver(spec.id, config.task, config.engine, machine, False)
        if problems:
            raise problems[0]
        static = static_digest({"task": config.task, "engine": config.engine, "binding": binding.identity(),
                                "columns": columns})
        return Tier(spec, config, static, static[:16], binding=binding)
    task = host_task(config.task)
    if task is None:
        raise unknown_task(spec.id, config.task)
    problems = check_driver(spec.id, config.task, config.engine, machine, True)
    if problems:
        raise problems[0]
    static = static_digest({"task": task.name, "task_version": task.task_version, "columns": list(task.columns)})
    return Tier(spec, config, static, task.task_version, task=task)


def check_tiers(pipelines: Sequence[PipelineSpec], machine: MachineConfig) -> list[ContextfulError]:
    """Every derive pipeline's build problem against ``machine`` (validate, and a run before anything
    is armed): an unbound engine, a driver behind the wrong task, an unregistered task."""
    problems: list[ContextfulError] = []
    for spec in pipelines:
        if spec.source.kind == "derive":
            try:
                build_tier(spec, machine)
            except ContextfulError as exc:
                problems.append(exc)
    return problems


def _selection(store: Store | None, tier: Tier, root: Path) -> Selection:
    return Selection(store, tier.spec.id, tier.task.marker_table if tier.task else tier.spec.table, tier.config,
                     tier.static, root, task=tier.task, version=tier.version)


def dry_run(store: Store | None, manifest: Manifest, spec: PipelineSpec, machine: MachineConfig) -> SelectionCounts:
    """``run.select.dry-run``: eligible, already-derived and outstanding units from one selection;
    no engine is called and nothing lands (None store: nothing has landed, so there are no units)."""
    tier = build_tier(spec, machine)
    if store is None or tier.config.source_table not in store.table_names():
        return SelectionCounts(0, 0, 0)
    with _selection(store, tier, manifest.root) as selection:
        return selection.counts()


def ensure_tables(store: Store, tier: Tier) -> None:
    """Create the tier's tables keyed on (unit_ref, derivation_key, cue_seq) with the supersede rule
    (the unit is (unit_ref, task_version) under ``retain_versions``, ``run.emit.version-retained``)."""
    from contextful.storage.supersede import Supersede

    unit = ("unit_ref", "task_version") if tier.config.retain_versions else ("unit_ref",)
    for table in tier.tables:
        store.create_table(table, tier.key_columns, supersede=Supersede(unit))


def run_derive(store: Store, manifest: Manifest, spec: PipelineSpec, machine: MachineConfig, *,
               progress: Callable[[Progress], None] | None = None) -> PipelineResult:
    """One run of the derive pipeline ``spec``."""
    from contextful.engine.land.journal import PullJournal
    from contextful.engine.land.pipeline import cursor_scope

    tier = build_tier(spec, machine)
    result = PipelineResult(spec.id, [TableLanding(t) for t in tier.tables])
    if tier.config.source_table not in store.table_names():
        result.warnings.append(f"pipeline {spec.id!r}: its source table {tier.config.source_table!r} has no rows "
                               "yet; nothing to derive")
        return result
    ensure_tables(store, tier)
    journal = PullJournal.open(store, spec, cursor_scope(spec), replay=True)
    try:
        with journal.writing():  # every content and marker commit carries this attempt (storage.fence)
            runner = _Runner(store, manifest.root, tier, journal.execution, result, progress)
            runner.run()
    except ContextfulError as exc:
        journal.settle(exc)
        raise
    journal.close(ok=True)
    result.execution = journal.execution_id
    return result


class _Runner:
    def __init__(self, store: Store, root: Path, tier: Tier, execution: Execution, result: PipelineResult,
                 progress: Callable[[Progress], None] | None) -> None:
        self.store = store
        self.root = root
        self.tier = tier
        self.execution = execution
        self.result = result
        self.progress = progress
        self.stats = DeriveStats()
        self.started = time.monotonic()
        self.replayed = {label: Answer.from_json(value) for label, value in execution.replay_recorded()
                         if isinstance(value, dict)}
        self.pending: dict[str, list[dict[str, Any]]] = {t: [] for t in tier.tables}
        self.pending_units: list[tuple[Any, str]] = []
        self.last_flush = time.monotonic()
        self.landings = {landing.table: landing for landing in result.tables}
        self.unit_type: pa.DataType | None = None

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        with _selection(self.store, self.tier, self.root) as selection:
            self.selection = selection
            counts = selection.units()  # joined once: the outstanding units below read the same table
            self.stats.eligible, self.stats.derived, self.stats.outstanding = (
                counts.eligible, counts.derived, counts.outstanding)
            self.stats.retired, waits = retire(self.store, self.tier, selection, self.landings)
            if waits is not None:
                self.result.warnings.append(waits)
            with ThreadPoolExecutor(self.tier.parallelism, thread_name_prefix=f"derive-{self.tier.spec.id}") as pool:
                inflight: dict[Future[Answer], dict[str, Any]] = {}
                for unit in self._units(selection):
                    label = _label(unit)
                    answer = self.replayed.pop(label, None)
                    if answer is not None:
                        self.stats.replayed += 1
                        self._complete(unit, answer, journaled=True)
                        continue
                    while len(inflight) >= 2 * self.tier.parallelism:
                        self._collect(inflight, wait(inflight, return_when=FIRST_COMPLETED).done)
                    inflight[pool.submit(self._derive, unit)] = unit
                while inflight:
                    self._collect(inflight, wait(inflight, return_when=FIRST_COMPLETED).done)
            self._flush()
        self.result.derive = self.stats.to_json()
        self.result.seconds = time.monotonic() - self.started
        if self.stats.failed:  # each stays a marker row (it retries); the run fails as a failed input does
            self.result.failures += self.stats.first_failures
            self.result.failures_not_shown = self.stats.failed - len(self.stats.first_failures)

    def _units(self, selection: Selection) -> Iterator[dict[str, Any]]:
        for batch in selection.outstanding():
            if self.unit_type is None:
                self.unit_type = batch.schema.field("unit_ref").type
            rows = batch.to_pylist()
            if self.tier.task is not None and self.tier.task.joins:
                refs = [r["unit_ref"] for r in rows]
                joined = {j.table: selection.joined_rows(j.table, j.column, refs) for j in self.tier.task.joins}
                for row in rows:
                    row["__joined"] = {t: by_value.get(row["unit_ref"], []) for t, by_value in joined.items()}
            yield from rows

    def _collect(self, inflight: dict[Future[Answer], dict[str, Any]], done: set[Future[Answer]]) -> None:
        for future in done:
            unit = inflight.pop(future)
            self._complete(unit, future.result(), journaled=False)

    def _derive(self, unit: dict[str, Any]) -> Answer:
        """Run one unit (in a pool thread); every failure of the unit is its answer. An attempt known
        to be fenced (its lease renewal found another holder) starts no unit's engine or task."""
        self.execution.raise_if_fenced("effect dispatch")
        if self.tier.task is not None:
            return self._host(unit)
        return self._builtin(unit)

    def _builtin(self, unit: dict[str, Any]) -> Answer:
        from contextful.engine.derive.exec import run_chain

        tier = self.tier
        assert tier.binding is not None
        ref = str(unit["unit_ref"])
        media = unit["media"]
        if media is None:
            return failed(DeriveMediaUnreadable(ref, "", "the media value is null"), retry=False)
        if tier.binding.driver == "fetch":
            return self._fetch(ref, media)
        located = media if is_address(media) else str(local_path(media, self.root))
        with tempfile.TemporaryDirectory(prefix="contextful-derive-") as work:
            try:
                output = run_chain(tier.binding, ref, located, Path(work), cancel=self.execution.cancel_token,
                                   project=self.root)
            except InterruptedError:  # the run was canceled while this unit's step ran: it stops here
                self.execution.raise_if_canceled(durable=True)
                raise
            except ContextfulError as exc:
                return failed(exc)
        return parse_engine_output(str(tier.config.engine), tier.spec.id, ref, output.output, tier.config.columns)

    def _fetch(self, ref: str, media: str) -> Answer:
        import json

        from contextful.engine.derive.engines.link_preview import fetch_preview

        binding = self.tier.binding
        assert binding is not None
        try:
            passages = fetch_preview(media, endpoint_host=binding.endpoint_host or "", allow_hosts=binding.allow_hosts,
                                     deadline_s=binding.deadline_s, cap_bytes=binding.output_cap_bytes)
        except ContextfulError as exc:
            return failed(exc)
        data = "\n".join(json.dumps(p) for p in passages).encode()
        return parse_engine_output(str(self.tier.config.engine), self.tier.spec.id, ref, data, self.tier.config.columns)

    def _host(self, unit: dict[str, Any]) -> Answer:
        task = self.tier.task
        assert task is not None
        parent = {k[2:]: v for k, v in unit.items() if k.startswith("p_")}
        handed = TaskUnit(unit["unit_ref"], unit["derivation_key"], task.task_version, parent, unit.get("__joined", {}))
        try:
            returned = task.fn(handed)
        except Exception as exc:  # noqa: BLE001 - a host task's failure is its unit's answer
            return failed(exc)
        return host_answer(self.tier.spec.id, task.name, task.content_tables, str(unit["unit_ref"]), returned)

    # --- landing ----------------------------------------------------------------------------------

    def _complete(self, unit: dict[str, Any], answer: Answer, *, journaled: bool) -> None:
        if not journaled:
            self.execution.step(_label(unit), lambda: answer.to_json())
        self.execution.raise_if_canceled()
        ref, key = unit["unit_ref"], unit["derivation_key"]
        attempts = int(unit.get("attempts") or 0) + 1
        tier = self.tier
        self.stats.count(str(ref), answer)
        for warning in answer.warnings:
            log.warning("pipeline %s: %s", tier.spec.id, warning)
            if len(self.result.warnings) < WARNINGS_KEPT:
                self.result.warnings.append(warning)
        if tier.task is None:
            rows = {tier.spec.table: builtin_rows(ref, key, tier.version, unit.get("media"), answer, attempts,
                                                  tier.config.max_attempts, tier.config.columns,
                                                  retained=tier.config.retain_versions)}
        else:
            rows = host_rows(ref, key, tier.version, answer, attempts, tier.config.max_attempts,
                             tier.task.marker_table, tier.task.content_tables, retained=tier.config.retain_versions)
        for table, table_rows in rows.items():
            self.pending[table].extend(table_rows)
        self.pending_units.append((ref, key))
        if self.progress is not None:
            self.progress(Progress(tier.spec.id, self.stats.done, self.stats.outstanding,
                                   sum(t.rows for t in self.result.tables) + sum(map(len, self.pending.values())), 0,
                                   len(tier.tables),
                                   time.monotonic() - self.started, unit="units", failed=self.stats.failed))
        if len(self.pending_units) >= FLUSH_UNITS or time.monotonic() - self.last_flush >= FLUSH_SECONDS:
            self._flush()

    def _flush(self) -> None:
        """Commit the pending units' rows: every table of the tier (a host task's content tables and
        its marker table) in one catalog commit, which requires the marker table's head the revival
        check read (``run.emit.settled-revived``): the units' rows all land, or none do."""
        self.last_flush = time.monotonic()
        if not self.pending_units:
            return
        self.execution.raise_if_canceled(durable=True)
        marker_table = self.tier.tables[-1]
        for _attempt in range(REVIVE_ATTEMPTS):
            head = self.store.table(marker_table).refresh().commit_seq
            self._drop_revived()
            try:
                self._commit(head)
            except CommitConflict as exc:
                if exc.failed != "AssertHeadSeq":
                    raise
                continue  # another run committed meanwhile: check again against its head
            break
        else:
            raise CommitConflict(marker_table, "other runs kept committing to it", attempts=REVIVE_ATTEMPTS)
        self.pending = {t: [] for t in self.tier.tables}
        self.pending_units = []
        self.execution.cache_cursor({"kind": "derive", "units": self.stats.done})
        self.execution.collect_steps()

    def _drop_revived(self) -> None:
        """``run.emit.settled-revived``: units settled under their current key since selection."""
        refs = [ref for ref, _ in self.pending_units]
        pairs = pa.table({"unit_ref": pa.array(refs, self.unit_type), "derivation_key": [k for _, k in self.pending_units]})
        revived = self.selection.settled_now(pairs)
        if not revived:
            return
        for ref, key in sorted(revived, key=str):
            error = DeriveSettledUnitRevived(self.tier.spec.id, str(ref), key)
            self.result.failures.append(InputFailure(f"unit {ref}", error.name, error.detail, error.exit_code))
            self.stats.revived += 1
        self.pending_units = [u for u in self.pending_units if u not in revived]
        for table, rows in self.pending.items():
            self.pending[table] = [r for r in rows if (r["unit_ref"], r["derivation_key"]) not in revived]

    def _commit(self, head: int) -> None:
        """Stage each table's pending rows and land them all with one catalog commit, the marker
        table's run requiring ``head`` (the decision "no representable torn publication": no reader
        sees a unit's content without its marker, nor a marker over another run's content)."""
        from contextful.engine.land.sink import LandingSink, commit_sinks
        from contextful.storage.commits import AssertHeadSeq

        marker_table = self.tier.tables[-1]
        meta = {"pipeline": self.tier.spec.id, "derive": {
            "units": len(self.pending_units), "failed": self.stats.failed, "errors": self.stats.errors}}
        sinks: list[LandingSink] = []
        try:
            for table in self.tier.tables:
                rows = self.pending[table]
                if not rows:
                    continue
                sinks.append(LandingSink(self.store, self.tier.landing_spec(table), meta=meta))
                sinks[-1].stage(pa.Table.from_pylist(rows, schema=self._schema(table, rows)),
                                f"derive {self.tier.spec.id}", typed=True)
        except BaseException as exc:  # a table refused its rows: none of the tables' runs lands
            from contextful.engine.guard import masked_failure

            for sink in sinks:
                sink.abort(masked_failure(exc))
            raise
        committed = commit_sinks(sinks, requirements={marker_table: (AssertHeadSeq(head),)})
        for sink, landed in zip(sinks, committed):
            if landed is not None:
                self.landings[sink.spec.table].add(landed)

    def _schema(self, table: str, rows: list[dict[str, Any]]) -> pa.Schema:
        unit_type = self.unit_type or pa.string()
        tier = self.tier
        if tier.task is None:
            return builtin_schema(unit_type, tier.config.columns)
        if table == tier.task.marker_table:
            return host_marker_schema(unit_type)
        return host_content_schema(rows, unit_type)


def _label(unit: dict[str, Any]) -> str:
    return f"unit {canonical(unit['unit_ref'])} {unit['derivation_key']}"

