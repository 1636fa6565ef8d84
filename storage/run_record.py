"""The durable run record: the reserved ``_runs`` table, with the catalog as a cache in front.

Implements the decision "run-record-folds":

- ``run.record.reserved-table``: every run writes two rows, one at plan and one at commit. The
  plan row enters the catalog cache when the run opens; the commit row enters it inside the run's
  own catalog commit, so it exists exactly when the run landed. A run given up on an error (its
  transaction aborted with a :class:`RunFailure`) writes a third kind, the fail row: the error's
  name and one line of its message, masked by the caller (the engine's secret guard), so history
  shows the run as failed rather than forever planned; a run given up on the Canceled tag
  (``RunCanceled``) writes its fail row with status ``canceled`` instead
  (``run.cancel.distinct-terminal-status``). Cached rows are flushed to
  ``_runs`` — an ordinary store table keyed on ``(run_id, phase)``, latest row winning — as one
  append once ``flush_rows`` rows wait or the oldest has waited ``flush_age_seconds``, and when
  the store closes; a flush another process already made is not repeated. Batching keeps the
  record's upkeep off each run's latency: a lone append would otherwise pay a second append.
- ``run.record.record-folds``: an append to ``_runs`` runs a fold pass once ``_runs`` holds
  ``FOLD_TRIGGER_PARTS`` small live parts. A failing pass is logged and swallowed: the row stays
  appended, the run succeeds, and the next append's trigger retries the pass. Parts of
  ``FOLD_SMALL_BYTES`` or more are left as they are, so a pass never rewrites the whole history.

Readers of run history get ``_runs`` merged with rows still only in the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from contextful.storage.commits import AssertRecordsPending, MarkRecordsFlushed, RecordRun
from contextful.storage.errors import CommitConflict, ContextfulError, first_line
from contextful.storage.fold import fold_table
from contextful.storage.manifest import RunManifest
from contextful.storage.reserved import RUNS_TABLE

if TYPE_CHECKING:
    from contextful.storage.store import Store

log = logging.getLogger(__name__)

FOLD_TRIGGER_PARTS = 16
FOLD_SMALL_BYTES = 1024 * 1024
FLUSH_LIMIT = 10_000
FLUSH_ROWS = 256
FLUSH_AGE_SECONDS = 30.0
PRIMARY_KEY = ("run_id", "phase")

RUNS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("phase", pa.string()),
    ("table_name", pa.string()),
    ("kind", pa.string()),
    ("status", pa.string()),
    ("recorded_at", pa.timestamp("us", tz="UTC")),
    ("commit_seq", pa.int64()),
    ("rows", pa.int64()),
    ("parts", pa.int64()),
    ("bytes", pa.int64()),
    ("manifest", pa.string()),
    ("downgrade_events", pa.int64()),
    ("bound_hits", pa.list_(pa.struct([("step", pa.string()), ("attempt", pa.int64()), ("bound", pa.string())]))),
    ("error", pa.string()),
    ("detail", pa.string()),
])
"""``error`` and ``detail`` (fail rows): the name of the error the run was given up on and one line
of its message, masked.
``bound_hits`` (``run.retry.bound-hit-recorded``): every connector bound the run's pulls struck,
with the pull's step label and attempt, a hit a later attempt recovered from included; a run
records them in its manifest's ``meta["bound_hits"]``."""


FAILED, CANCELED = "failed", "canceled"


@dataclass(frozen=True)
class RunFailure:
    """Why a run landed nothing: its error's name and one line of its message."""

    error: str
    detail: str
    status: str = FAILED
    """The status its fail row records: ``failed``, or ``canceled`` for the Canceled tag
    (``run.cancel.distinct-terminal-status``: a terminal status apart from failed)."""

    @classmethod
    def of(cls, exc: BaseException, mask: Callable[[str], str]) -> RunFailure:
        """The failure ``exc`` stands for, its message on one line through ``mask`` (the secret guard)."""
        name = exc.name if isinstance(exc, ContextfulError) else type(exc).__name__
        text = exc.detail if isinstance(exc, ContextfulError) else first_line(exc)
        status = CANCELED if isinstance(exc, ContextfulError) and exc.category == CANCELED else FAILED
        return cls(name, mask(" ".join(part.strip() for part in text.splitlines() if part.strip())), status)


class RunRecord:
    def __init__(self, store: Store, flush_rows: int = FLUSH_ROWS,
                 flush_age_seconds: float = FLUSH_AGE_SECONDS) -> None:
        self.store = store
        self.flush_rows = flush_rows
        """Flush once this many cached rows wait (1: after every commit)."""
        self.flush_age_seconds = flush_age_seconds
        """Flush once the oldest cached row has waited this long."""
        self.wrote = False
        """Whether this store handle recorded a run (closing then flushes; a reader's close writes nothing)."""

    # --- writing --------------------------------------------------------------------------------

    def plan(self, run_id: str, table: str, kind: str) -> None:
        now = self.store.clock.now_us()
        self.wrote = True
        payload = {"kind": kind, "status": "planned", "recorded_us": now}
        self.store.catalog.record_run(run_id, "plan", table, payload, now)

    def fail(self, run_id: str, table: str, kind: str, failure: RunFailure) -> None:
        """The fail row of a run given up on ``failure`` (it landed nothing); a failure to write it is
        logged, never raised: the caller is raising the run's own error."""
        now = self.store.clock.now_us()
        payload = {"kind": kind, "status": failure.status, "recorded_us": now, "error": failure.error,
                   "detail": failure.detail}
        try:
            self.store.catalog.record_run(run_id, "fail", table, payload, now)
        except Exception as exc:  # noqa: BLE001 - must not hide the error the run failed on
            log.warning("recording the failure of run %s failed: %s", run_id, exc)
            return
        self.wrote = True

    def commit_update(self, run_id: str, table: str, manifest: RunManifest, manifest_path: str) -> RecordRun:
        """The commit row, to ride inside the run's own catalog commit."""
        payload = {
            "kind": manifest.kind,
            "status": "committed",
            "recorded_us": self.store.clock.now_us(),
            "rows": manifest.rows,
            "parts": len(manifest.parts),
            "bytes": manifest.bytes,
            "manifest": manifest_path,
            "downgrade_events": len(manifest.downgrade_events),
            "bound_hits": list(manifest.meta.get("bound_hits", [])),
        }
        return RecordRun(run_id, "commit", table, payload)

    def after_commit(self) -> None:
        """Flush the cache to ``_runs`` when due; never fails the run that called it."""
        try:
            waiting, oldest_us = self.store.catalog.pending_run_summary()
            age_us = self.store.clock.now_us() - (oldest_us or 0)
            if waiting >= self.flush_rows or (waiting and age_us >= self.flush_age_seconds * 1_000_000):
                self.flush()
        except Exception as exc:  # noqa: BLE001 - the run landed; a later append flushes what is left
            log.warning("flushing run records to %s failed: %s", RUNS_TABLE, exc)

    def flush_quietly(self) -> None:
        """Flush whatever waits (closing the store); a failure is logged, the rows stay cached."""
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - closing never fails on the record's upkeep
            log.warning("flushing run records to %s failed: %s", RUNS_TABLE, exc)

    def flush(self) -> int:
        """Append every cached row not yet in ``_runs`` as one run; return how many."""
        pending = self.store.catalog.pending_run_records(FLUSH_LIMIT)
        if not pending:
            return 0
        table = self.store.reserved_table(RUNS_TABLE, PRIMARY_KEY)
        rows = [_row(r.run_id, r.phase, r.table, r.payload) for r in pending]
        keys = tuple((r.run_id, r.phase) for r in pending)
        txn = table.transaction("append")
        try:
            txn.stage(pa.Table.from_pylist(rows, schema=RUNS_SCHEMA))
            txn.commit(extra_requirements=(AssertRecordsPending(keys),),
                       extra_updates=(MarkRecordsFlushed(keys),))
        except CommitConflict:
            txn.abort()  # another process flushed these rows first
            return 0
        except BaseException:
            txn.abort()
            raise
        self.fold_if_due()
        return len(rows)

    def fold_if_due(self) -> None:
        """``run.record.record-folds``: fold ``_runs`` once its trigger fires; a failure is logged."""
        head = self.store.catalog.load_head(RUNS_TABLE)
        assert head is not None
        small = [p for p in self.store.catalog.live_parts(RUNS_TABLE, head.commit_seq) if p.bytes < FOLD_SMALL_BYTES]
        if len(small) < FOLD_TRIGGER_PARTS:
            return
        try:
            fold_table(self.store, RUNS_TABLE, small_bytes=FOLD_SMALL_BYTES, min_parts=2)
        except Exception as exc:  # noqa: BLE001 - a run's row never fails on the record's upkeep
            log.warning("fold pass on %s failed; the next append retries it: %s", RUNS_TABLE, exc)

    # --- reading --------------------------------------------------------------------------------

    def history(self) -> pa.Table:
        """Every run's plan, commit and fail rows: ``_runs`` merged with the cache, latest row winning."""
        cached = pa.Table.from_pylist(
            [_row(r.run_id, r.phase, r.table, r.payload) for r in self.store.catalog.run_records()],
            schema=RUNS_SCHEMA,
        )
        names = self.store.table_names(include_reserved=True)
        durable = self.store.table(RUNS_TABLE).to_arrow() if RUNS_TABLE in names else RUNS_SCHEMA.empty_table()
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for row in durable.to_pylist() + cached.to_pylist():  # bounded by the run count, not data
            key = (row["run_id"], row["phase"])
            if key not in merged or row["recorded_at"] >= merged[key]["recorded_at"]:
                merged[key] = row
        ordered = sorted(merged.values(), key=lambda r: (r["recorded_at"], r["run_id"], r["phase"] != "plan"))
        return pa.Table.from_pylist(ordered, schema=RUNS_SCHEMA)


def _row(run_id: str, phase: str, table: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "phase": phase,
        "table_name": table,
        "kind": payload.get("kind"),
        "status": payload.get("status"),
        "recorded_at": pa.scalar(int(payload.get("recorded_us", 0)), pa.timestamp("us", tz="UTC")).as_py(),
        "commit_seq": payload.get("commit_seq"),
        "rows": payload.get("rows"),
        "parts": payload.get("parts"),
        "bytes": payload.get("bytes"),
        "manifest": payload.get("manifest"),
        "downgrade_events": payload.get("downgrade_events"),
        "bound_hits": payload.get("bound_hits") or [],
        "error": payload.get("error"),
        "detail": payload.get("detail"),
    }
