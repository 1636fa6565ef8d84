"""Running a pipeline: pull its source's new inputs, decode each in a bounded child, land them.

One ``contextful pipeline run`` of a ``files`` pipeline:

1. list the source's inputs and drop those the pipeline's cursor already holds (same path and
   fingerprint): a re-run with nothing new lands nothing;
2. decode each remaining input in its own child (``engine.land.decode``: 60 s, 512 MiB), apply the
   pull's ``types`` (``engine.land.typed``), and stage the batches into the run's transaction;
3. an input that fails — parse-crashed, malformed, unreadable — fails by name alone: everything it
   staged is rolled back and it stays out of the cursor, so a re-run after the fix pulls exactly it;
4. commit the rows with the cursor (the inputs landed so far) in one commit. When the parts staged
   since the last commit reach ``checkpoint_bytes`` (512 MiB by default) the run commits at that
   input boundary and keeps pulling, so a crash loses at most the work since the last checkpoint
   and the re-run resumes from the committed cursor.

The per-pipeline cursor lives on the destination table under the scope ``pipeline:<id>``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.config.manifest import Manifest, PipelineSpec
from engine.land.chunks import coalesce
from engine.land.decode import Decoder
from engine.land.files import InputFile, list_inputs
from engine.land.typed import apply_types, read_types
from storage import Store
from storage.errors import Incompatible, ManifestValueInvalid, NotFound
from storage.reconcile import DowngradeEvent
from storage.transaction import CommitResult, RunTransaction

CHECKPOINT_BYTES = 512 * 1024 * 1024
STAGE_ROWS = 1_000_000


@dataclass(frozen=True)
class InputFailure:
    input: str
    error: str
    detail: str
    exit_code: int

    def to_json(self) -> dict[str, str]:
        return {"input": self.input, "error": self.error, "detail": self.detail}


@dataclass
class TableLanding:
    """What one pipeline run landed in one table, across its checkpoint commits."""

    table: str
    run_ids: list[str] = field(default_factory=list)
    commit_seqs: list[int] = field(default_factory=list)
    rows: int = 0
    parts: int = 0
    bytes: int = 0
    downgrade_events: list[DowngradeEvent] = field(default_factory=list)

    def add(self, result: CommitResult) -> None:
        self.run_ids.append(result.run_id)
        self.commit_seqs.append(result.commit_seq)
        self.rows += result.rows
        self.parts += result.parts
        self.bytes += result.bytes
        self.downgrade_events.extend(result.downgrade_events)

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "run_ids": self.run_ids, "commit_seqs": self.commit_seqs, "rows": self.rows,
                "parts": self.parts, "bytes": self.bytes,
                "downgrade_events": [e.to_json() for e in self.downgrade_events]}


@dataclass
class PipelineResult:
    pipeline: str
    tables: list[TableLanding]
    inputs_landed: list[str] = field(default_factory=list)
    inputs_skipped: int = 0
    failures: list[InputFailure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "ok": self.ok, "tables": [t.to_json() for t in self.tables],
                "inputs_landed": self.inputs_landed, "inputs_skipped": self.inputs_skipped,
                "failures": [f.to_json() for f in self.failures], "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class Progress:
    pipeline: str
    inputs_done: int
    inputs_total: int
    rows: int
    bytes_read: int
    tables: int
    seconds: float


@dataclass(frozen=True)
class PipelinePlan:
    pipeline: str
    table: str
    pull: list[InputFile]
    skip: list[InputFile]

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "table": self.table,
                "pull": [{"input": i.path, "bytes": i.size} for i in self.pull],
                "skip": [i.path for i in self.skip]}


def cursor_scope(spec: PipelineSpec) -> str:
    return f"pipeline:{spec.id}"


def _landed_inputs(store: Store, spec: PipelineSpec) -> dict[str, str]:
    if spec.table not in store.table_names():
        return {}
    committed = store.table(spec.table).cursor(cursor_scope(spec))
    if committed is None:
        return {}
    value, _seq = committed
    return dict(value.get("inputs", {}))


def plan_pipeline(store: Store, manifest: Manifest, spec: PipelineSpec) -> PipelinePlan:
    """What a run would pull (inputs new or changed since the cursor) and what it would skip."""
    landed = _landed_inputs(store, spec)
    inputs = list_inputs(spec.source.config, manifest.root)
    pull = [i for i in inputs if landed.get(i.path) != i.fingerprint]
    skip = [i for i in inputs if landed.get(i.path) == i.fingerprint]
    return PipelinePlan(spec.id, spec.table, pull, skip)


def run_pipeline(store: Store, manifest: Manifest, spec: PipelineSpec, decoder: Decoder, *,
                 checkpoint_bytes: int = CHECKPOINT_BYTES,
                 progress: Callable[[Progress], None] | None = None) -> PipelineResult:
    if spec.normalize != "nested":
        raise ManifestValueInvalid(f"[[pipeline]] {spec.id!r}", "normalize",
                                   f"{spec.normalize!r} normalization is not available in this version; use 'nested'")
    started = time.monotonic()
    types = read_types(spec.types)
    plan = plan_pipeline(store, manifest, spec)
    table = store.create_table(spec.table, spec.primary_key)
    landing = TableLanding(spec.table)
    result = PipelineResult(spec.id, [landing], inputs_skipped=len(plan.skip))
    landed = _landed_inputs(store, spec)
    fmt = spec.source.config.get("format")
    meta = {"pipeline": spec.id}
    txn: RunTransaction | None = None
    pending = 0  # inputs staged since the last commit
    bytes_read = 0
    try:
        for done, item in enumerate(plan.pull):
            if txn is None:
                txn = table.transaction("append", meta=meta)
            point = txn.savepoint()
            try:
                for chunk in coalesce(decoder.decode(item.path, fmt), STAGE_ROWS):
                    txn.stage(apply_types(spec.table, chunk, types))
            except (Incompatible, NotFound) as exc:  # this input alone fails, by name
                txn.rollback_to(point)
                result.failures.append(InputFailure(item.path, exc.name, exc.detail, exc.exit_code))
                continue
            landed[item.path] = item.fingerprint
            result.inputs_landed.append(item.path)
            pending += 1
            bytes_read += item.size
            if progress is not None:
                progress(Progress(spec.id, done + 1, len(plan.pull), landing.rows + txn.staged_rows, bytes_read, 1,
                                  time.monotonic() - started))
            if txn.staged_bytes >= checkpoint_bytes:  # a checkpoint, at an input boundary
                txn.set_cursor(cursor_scope(spec), {"kind": "files", "inputs": dict(landed)})
                landing.add(txn.commit())
                txn, pending = None, 0
        if txn is not None and pending:
            txn.set_cursor(cursor_scope(spec), {"kind": "files", "inputs": dict(landed)})
            landing.add(txn.commit())
        elif txn is not None:
            txn.abort()
        txn = None
    except BaseException:
        if txn is not None:
            txn.abort()
        raise
    result.seconds = time.monotonic() - started
    return result


def run_pipelines(store: Store, manifest: Manifest, ids: list[str] | None = None, *,
                  checkpoint_bytes: int = CHECKPOINT_BYTES, decoder: Decoder | None = None,
                  progress: Callable[[Progress], None] | None = None) -> list[PipelineResult]:
    """Run the named pipelines (default: all) in dependency order, sharing one decoder server."""
    specs = manifest.in_dependency_order(ids)
    owned = decoder is None
    decoder = decoder or Decoder()
    try:
        return [run_pipeline(store, manifest, spec, decoder, checkpoint_bytes=checkpoint_bytes, progress=progress)
                for spec in specs]
    finally:
        if owned:
            decoder.close()

