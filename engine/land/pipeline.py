"""Running a pipeline: pull its source's new inputs, decode each in a bounded child, land them.

One ``contextful pipeline run`` of a ``files`` pipeline:

0. a pipeline declaring its table otherwise than it landed (``primary_key``, ``order_by``,
   ``normalize``) is refused first, by name (``engine.land.declaration``): nothing is read;
1. list the source's inputs and plan them against the pipeline's cursor (``engine.land.files``:
   inputs named relative to the project, fingerprinted by content): those landed in this form —
   renamed ones included — are skipped, an appended NDJSON input pulls only its new bytes, and an
   input changed otherwise fails by name (:class:`InputChanged`) under the ``append`` write
   disposition, or is pulled whole under ``merge`` (its rows merge by key); under ``replace`` a run
   that finds any input new, changed or gone pulls every input (``engine.land.disposition``); a
   re-run with nothing new lands nothing;
2. decode each remaining input in its own child (``engine.land.decode``: 60 s, 512 MiB), which also
   lands it (``engine.land.input_landing``: the pull's ``types``, the guard, normalization, Parquet
   parts under a staging lease of the input's own), up to ``CONTEXTFUL_LAND_CHILDREN`` inputs at
   once (``input_landing.land_children``: none by default on two cores or fewer); the run takes them in input order and adopts each one's parts into its transactions
   (``LandingSink.adopt``: names, schema reconcile and downgrade events). With
   ``CONTEXTFUL_LAND_CHILDREN=0`` the child hands its batches back and the run stages them itself,
   the next input decoding ahead (``engine.land.ahead``);
3. an input that fails — parse-crashed, malformed, unreadable, or a value its table's column cannot
   take (``SchemaIrreconcilable``, checked before the next input starts) — fails by name alone:
   everything it staged is rolled back and it stays out of the cursor, so a re-run after the fix
   pulls exactly it. Under ``replace`` a failed input fails the whole run: nothing lands, the
   table keeps its rows;
4. commit the rows with the cursor (the inputs landed so far) in one commit. When the parts staged
   since the last commit reach ``checkpoint_bytes`` (512 MiB by default) the run commits at that
   input boundary and keeps pulling, so a crash loses at most the work since the last checkpoint
   and the re-run resumes from the committed cursor. A ``replace`` run commits once, at its end:
   its rows become the table together or not at all.

The per-pipeline cursor lives on the destination table under the scope ``pipeline:<id>``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextful.engine.config.manifest import Manifest, PipelineSpec
from contextful.engine.land.ahead import DecodeAhead, LandAhead
from contextful.engine.land.chunks import coalesce
from contextful.engine.land.csv_options import csv_options
from contextful.engine.land.declaration import refuse_changed_declaration
from contextful.engine.land.decode import Decoder
from contextful.engine.land.files import InputFile, InputPlan, list_inputs, plan_inputs, plan_replace
from contextful.engine.land.input_landing import LandRequest, land_children, lands_in_children
from contextful.engine.land.journal import PullJournal
from contextful.engine.land.results import InputFailure, PipelineResult, Progress
from contextful.engine.land.sink import LandingSink, load_staging
from contextful.storage import Store
from contextful.storage.errors import (
    ContextfulError,
    Incompatible,
    NotFound,
    PrimaryKeyNull,
    TypedLandingFailed,
)
from contextful.storage.run_record import RunFailure

CHECKPOINT_BYTES = 512 * 1024 * 1024
STAGE_ROWS = 1_000_000


@dataclass(frozen=True)
class PipelinePlan:
    pipeline: str
    table: str
    pull: list[InputFile]
    """files: the inputs a run would pull."""
    skip: list[InputFile]
    """files: the inputs already landed in this form."""
    changed: list[InputFile] = field(default_factory=list)
    """files: the inputs whose landed form changed otherwise (a run fails each by name)."""
    source: str = "files"
    position: dict[str, Any] | None = None
    """http: the stored position a run starts from (checked against the declared field)."""
    first_request: str | None = None
    """http: the URL a run would ask first."""
    rereads_all: bool = False
    """http: without an incremental field every run reads the whole source and lands every row again."""

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "table": self.table, "source": self.source,
                "pull": [{"input": i.path, "bytes": i.size - i.offset, "from_byte": i.offset} for i in self.pull],
                "skip": [i.path for i in self.skip], "changed": [i.path for i in self.changed],
                "position": self.position,
                "first_request": self.first_request, "rereads_all": self.rereads_all}


def cursor_scope(spec: PipelineSpec) -> str:
    return f"pipeline:{spec.id}"


def _landed_inputs(store: Store | None, spec: PipelineSpec) -> dict[str, Any]:
    if store is None or spec.table not in store.table_names():
        return {}
    committed = store.table(spec.table).cursor(cursor_scope(spec))
    if committed is None or committed[0] is None:  # never landed, or reset (engine.land.reset)
        return {}
    value, _seq = committed
    return dict(value.get("inputs", {}))


def _plan_files(manifest: Manifest, spec: PipelineSpec, stored: dict[str, Any]) -> InputPlan:
    """The inputs to pull, skip and refuse against the ``stored`` ones, by the pipeline's write
    disposition (``engine.land.disposition``)."""
    inputs = list_inputs(spec.source.config, manifest.root)
    planned = plan_inputs(inputs, stored, spec.source.config.get("format"), reland=spec.disposition != "append",
                          pipeline=spec.id)
    return plan_replace(inputs, planned, stored) if spec.disposition == "replace" else planned


def plan_pipeline(store: Store | None, manifest: Manifest, spec: PipelineSpec) -> PipelinePlan:
    """What a run would pull (inputs new or appended since the cursor), skip, and refuse as changed
    (``store`` None: the project has no store yet, so nothing has landed). A declaration its landed
    table does not hold is refused (``engine.land.declaration``)."""
    if store is not None:
        refuse_changed_declaration(store, spec)
    if spec.source.kind == "http":
        return _plan_http(store, manifest.root, spec)
    if spec.source.kind == "receive":
        return PipelinePlan(spec.id, spec.table, [], [], source="receive")
    if spec.source.kind == "derive":  # what a run would derive: `pipeline run --dry-run` counts it
        return PipelinePlan(spec.id, spec.table, [], [], source="derive")
    planned = _plan_files(manifest, spec, _landed_inputs(store, spec))
    return PipelinePlan(spec.id, spec.table, planned.pull, planned.skip, changed=[i for i, _ in planned.changed])


def _plan_http(store: Store | None, root: Path, spec: PipelineSpec) -> PipelinePlan:
    from contextful.engine.land.http import HttpConfig, resolved_headers
    from contextful.engine.land.position import open_position, since_text

    # a reference the run could not resolve refuses the plan; the plan shows no header value
    resolved_headers(spec.id, HttpConfig.from_config(spec.source.config), root)

    scope = cursor_scope(spec)
    stored = (store.table(spec.table).cursor(scope)
              if store is not None and spec.table in store.table_names() else None)
    position = open_position(scope, stored[0] if stored else None, spec.incremental)
    config = HttpConfig.from_config(spec.source.config)
    since = since_text(position.since, position.clock) if position.since is not None else None
    first = (config.page_url(since, position.token) if config.walk_kind(spec.incremental) == "watermark"
             else config.first_url(since))
    return PipelinePlan(spec.id, spec.table, [], [], source="http", position=position.to_json() if stored else None,
                        first_request=first, rereads_all=not spec.incremental)


def run_pipeline(store: Store, manifest: Manifest, spec: PipelineSpec, decoder: Decoder, *,
                 checkpoint_bytes: int = CHECKPOINT_BYTES,
                 progress: Callable[[Progress], None] | None = None,
                 cancel: threading.Event | None = None,
                 sleep: Callable[[float], None] | None = None) -> PipelineResult:
    """One run of the landing pipeline ``spec``: its seed first (once), then its source's new rows.
    A derive pipeline is not landed here: ``engine.run.units`` runs it, with its parents."""
    if spec.source.kind == "derive":
        raise TypeError(f"pipeline {spec.id!r} derives; engine.run.units runs it, not the landing stage")
    refuse_changed_declaration(store, spec)  # before the seed, the journal or any read: nothing lands under a mix
    seeded = None
    if spec.seed is not None:
        from contextful.engine.land.seed import land_seed

        seeded = land_seed(store, manifest.root, spec.id, spec.table, spec.primary_key, spec.order_by, spec.seed,
                           decoder, types=spec.types, normalize=spec.normalize)
    journal = PullJournal.open(store, spec, cursor_scope(spec)) if spec.source.kind in ("files", "http") else None
    try:
        with journal.writing() if journal is not None else nullcontext():
            result = _land_source(store, manifest, spec, decoder, journal, checkpoint_bytes=checkpoint_bytes,
                                  progress=progress, cancel=cancel, sleep=sleep)
    except ContextfulError as exc:
        if journal is not None:
            journal.settle(exc)  # failed or canceled by name: settled; a killed run stays pending instead
        raise
    if journal is not None:
        journal.close(ok=result.ok)
        result.execution = journal.execution_id
    if seeded is not None:
        result.seed = seeded.to_json()
        if seeded.commit is not None:
            result.tables[0].add(seeded.commit)
        if seeded.warning:
            result.warnings.append(seeded.warning)
    return result


def _land_source(store: Store, manifest: Manifest, spec: PipelineSpec, decoder: Decoder,
                 journal: PullJournal | None, *, checkpoint_bytes: int, progress: Callable[[Progress], None] | None,
                 cancel: threading.Event | None, sleep: Callable[[float], None] | None) -> PipelineResult:
    """Land what ``spec``'s source has that the store lacks (an http walk, a receive queue, files)."""
    if spec.source.kind == "http":
        from contextful.engine.land.walk import run_http_pipeline

        if cancel is None and journal is not None:
            cancel = journal.execution.cancel_token  # a retry wait ends once the run is canceled
        return run_http_pipeline(store, spec, decoder, root=manifest.root, scope=cursor_scope(spec),
                                 checkpoint_bytes=checkpoint_bytes,
                                 progress=progress, cancel=cancel, sleep=sleep, journal=journal)
    if spec.source.kind == "receive":
        from contextful.engine.land.receive.group import drain_queue

        return drain_queue(store, manifest, spec, decoder)
    return _run_files(store, manifest, spec, decoder, checkpoint_bytes=checkpoint_bytes, progress=progress,
                      journal=journal)


def _run_files(store: Store, manifest: Manifest, spec: PipelineSpec, decoder: Decoder, *,
               checkpoint_bytes: int, progress: Callable[[Progress], None] | None,
               journal: PullJournal | None = None) -> PipelineResult:
    started = time.monotonic()
    stored = _landed_inputs(store, spec)
    plan = _plan_files(manifest, spec, stored)
    replacing = spec.disposition == "replace"
    sink = LandingSink(store, spec, kind="replace" if replacing else "append")
    result = PipelineResult(spec.id, [], inputs_skipped=len(plan.skip))
    if replacing and stored and not plan.pull and not plan.skip:
        result.warnings.append(f"pipeline {spec.id!r}: its paths match no file; under write_disposition = "
                               "\"replace\" the table keeps its rows (a source listing nothing never empties it)")
    for item, changed in plan.changed:  # fails by name; its entry stays as it landed
        result.failures.append(_failure(item, changed))
    landed = dict(plan.cursor)
    fmt = spec.source.config.get("format")
    csv = csv_options(spec.id, spec.source.config)[0]  # validated with the manifest
    notes: dict[str, list[str]] = {}  # per input: what its decode decided (a sniffed delimiter)
    pending = int(landed != stored)  # renames and old entries carried forward commit too
    children = land_children() if plan.pull and lands_in_children(store) else 0
    if plan.pull:
        decoder.start()  # its imports and the ones below run side by side
        if not children:  # else the server imports the landing chain, once, for every child
            load_staging(spec)
    reading = _Reading(spec.id, plan, started, progress)
    since_commit: list[str] = []  # the inputs the next commit lands: its runs' manifests name them

    def decode_ahead(item: InputFile) -> DecodeAhead:
        said = notes.setdefault(item.path, [])
        return DecodeAhead(lambda: decoder.decode(item.path, fmt, declared=sink.types, window=item.window(), csv=csv,
                                                  notes=said,
                                                  on_read=reading.on_read(item) if progress is not None else None))

    def land_ahead(item: InputFile) -> tuple[LandRequest, LandAhead]:
        said = notes.setdefault(item.path, [])
        request = sink.land_request(f"input {item.path}", store.objects)
        on_read = reading.on_read(item) if progress is not None else None
        return request, LandAhead(lambda abandon: decoder.land(
            item.path, request, fmt, window=item.window(), csv=csv, notes=said, on_read=on_read, abandon=abandon))

    ahead = decode_ahead(plan.pull[0]) if plan.pull and not children else None
    landing: deque[tuple[LandRequest, LandAhead]] = deque(land_ahead(i) for i in plan.pull[:children])
    try:
        for done, item in enumerate(plan.pull):
            current = ahead
            if not children:
                assert current is not None
                # the next input decodes while this one is guarded and staged (engine.land.ahead)
                ahead = decode_ahead(plan.pull[done + 1]) if done + 1 < len(plan.pull) else None
            point = sink.savepoint()
            reading.begin(item)
            report: dict[str, Any] | None = None
            try:
                if children:  # its child landed it; the ones after it are landing meanwhile
                    request, child = landing.popleft()
                    try:
                        try:
                            report = child.report()
                        finally:  # its child is done: the next input's starts
                            if done + children < len(plan.pull):
                                landing.append(land_ahead(plan.pull[done + children]))
                        sink.adopt(request, report)
                    except BaseException:
                        sink.drop(request, report)  # none of it lands: its parts go, its lease ends
                        raise
                else:
                    assert current is not None
                    for chunk in coalesce(current.batches(), STAGE_ROWS):
                        sink.stage(chunk, f"input {item.path}")
                    sink.flush()  # its rows meet the table's schema now, while a clash is still this input's
            except (Incompatible, NotFound) as exc:  # this input alone fails, by name
                reading.end(item)
                failed = _failure(item, exc)
                sink.rollback_to(point, RunFailure(failed.error, failed.detail))
                result.failures.append(failed)
                if replacing:  # all or nothing: the table keeps its rows
                    break
                continue
            landed[item.name] = item.entry()
            result.inputs_landed.append(item.path)
            result.notes += [f"{item.name}: {note}" for note in notes.pop(item.path, ())]
            if journal is not None:
                journal.pulled(f"input {item.path}", {"input": item.name, "entry": item.entry(), "from": item.offset})
            pending += 1
            since_commit.append(item.path)
            reading.end(item, sink.landings[spec.table].rows + sink.staged_rows, len(sink.landings))
            if not replacing and sink.staged_reach(checkpoint_bytes):  # a checkpoint, at an input boundary
                position = {"kind": "files", "inputs": dict(landed)}
                if journal is not None:
                    journal.before_commit()
                committed = sink.commit(cursor_scope(spec), position, {"inputs": since_commit})
                pending, since_commit = 0, []
                if journal is not None and committed is not None:
                    journal.checkpoint(position, committed)
        if pending and not (replacing and result.failures):
            if journal is not None:
                journal.before_commit()
            sink.commit(cursor_scope(spec), {"kind": "files", "inputs": dict(landed)}, {"inputs": since_commit})
    except BaseException as exc:
        from contextful.engine.guard import masked_failure

        sink.abort(masked_failure(exc))  # what is still staged did not commit, and why
        raise
    finally:
        if ahead is not None:
            ahead.close()
        for request, child in landing:  # inputs not taken (a failure, a replace run's first failed input)
            sink.drop(request, child.close())
    first = result.failures[0] if result.failures else None  # an input failed: the run records it
    sink.abort(RunFailure(first.error, first.detail) if first is not None else None)
    result.tables = sink.results()
    result.seconds = time.monotonic() - started
    return result


class _Reading:
    """A files run's progress: a report as each input lands, and from within the input being
    landed as its decoder reads it (``Decoder.decode``'s ``on_read``). The input decoding ahead
    reports from its own thread before its turn; what it read shows once it is the one landing."""

    def __init__(self, pipeline: str, plan: InputPlan, started: float,
                 progress: Callable[[Progress], None] | None) -> None:
        self.pipeline, self.started, self.progress = pipeline, started, progress
        self.inputs = len(plan.pull)
        self.total = sum(item.size - item.offset for item in plan.pull)
        self.done = self.landed_bytes = self.rows = self.tables = 0
        self.current: InputFile | None = None
        self.read: dict[str, tuple[int, bool]] = {}  # per input: its newest offset and phase
        self._lock = threading.Lock()

    def on_read(self, item: InputFile) -> Callable[[int, bool], None]:
        def told(offset: int, scanning: bool) -> None:
            with self._lock:
                last, was_scanning = self.read.get(item.path, (0, scanning))
                # a CSV read once that grew past its hold is read again: its count does not go back
                self.read[item.path] = (offset if scanning != was_scanning else max(last, offset), scanning)
                if item is self.current:
                    self._report(item)
        return told

    def begin(self, item: InputFile) -> None:
        with self._lock:
            self.current = item
            if item.path in self.read:
                self._report(item)

    def end(self, item: InputFile, rows: int | None = None, tables: int = 0) -> None:
        """``item`` landed (``rows``: the run's rows so far) or failed (None)."""
        with self._lock:
            self.current = None
            self.read.pop(item.path, None)
            self.done += 1
            self.landed_bytes += item.size - item.offset
            if rows is None or self.progress is None:
                return
            self.rows, self.tables = rows, tables
            self.progress(Progress(self.pipeline, self.done, self.inputs, rows, self.landed_bytes, tables,
                                   time.monotonic() - self.started, bytes_total=self.total))

    def _report(self, item: InputFile) -> None:
        offset, scanning = self.read[item.path]
        if self.progress is not None:
            self.progress(Progress(self.pipeline, self.done, self.inputs, self.rows,
                                   self.landed_bytes + min(offset, item.size - item.offset), self.tables,
                                   time.monotonic() - self.started, bytes_total=self.total, closes=False,
                                   scanning=scanning))


def _failure(item: InputFile, exc: ContextfulError) -> InputFailure:
    """One input's failure; its detail names the input (a schema clash names only the table and column),
    and a row it names is counted in the file, for an input read from an offset too."""
    from contextful.engine.guard import mask_message

    if item.offset and isinstance(exc, PrimaryKeyNull):
        exc = PrimaryKeyNull(exc.table, exc.column, exc.row + item.records_landed(), exc.input, exc.fields["value"])
    elif item.offset and isinstance(exc, TypedLandingFailed) and exc.row is not None:
        exc = TypedLandingFailed(exc.table, exc.column, exc.spelling, exc.reason, exc.row + item.records_landed())

    detail = exc.detail if item.path in exc.detail else f"input {item.path}: {exc.detail}"
    return InputFailure(item.path, exc.name, mask_message(detail), exc.exit_code)
