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

Readers of run history get ``_runs`` merged with rows still only in the cache (:func:`history_sql`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.commits import AssertRecordsPending, MarkRecordsFlushed, RecordRun
from contextful.storage.duck_types import duckdb_types
from contextful.storage.errors import CommitConflict, ContextfulError, first_line
from contextful.storage.fold import fold_table
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import RunManifest
from contextful.storage.reserved import RUNS_TABLE
from contextful.storage.snapshot import Snapshot, quote, snapshot_sql, sql_literal
from contextful.storage.table import Table

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from contextful.storage.store import Store
else:
    pa = lazy_module("pyarrow")

log = logging.getLogger(__name__)

FOLD_TRIGGER_PARTS = 16
FOLD_SMALL_BYTES = 1024 * 1024
FLUSH_LIMIT = 10_000
FLUSH_ROWS = 256
FLUSH_AGE_SECONDS = 30.0
PRIMARY_KEY = ("run_id", "phase")
HISTORY = "__cf_history"
"""What :meth:`RunRecord.select`'s query calls the run history."""


@functools.cache
def runs_schema() -> pa.Schema:
    """The ``_runs`` table's schema (built on first use: the module loads without pyarrow).

    Also importable as ``RUNS_SCHEMA``. ``error`` and ``detail`` (fail rows): the name of the error
    the run was given up on and one line of its message, masked.
    ``bound_hits`` (``run.retry.bound-hit-recorded``): every connector bound the run's pulls struck,
    with the pull's step label and attempt, a hit a later attempt recovered from included; a run
    records them in its manifest's ``meta["bound_hits"]``.
    """
    return pa.schema([
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


def __getattr__(name: str) -> Any:
    if name == "RUNS_SCHEMA":
        return runs_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")




FAILED, CANCELED, INTERRUPTED = "failed", "canceled", "interrupted"


@dataclass(frozen=True)
class RunFailure:
    """Why a run landed nothing: its error's name and one line of its message."""

    error: str
    detail: str
    status: str = FAILED
    """The status its fail row records: ``failed``, ``canceled`` for the Canceled tag
    (``run.cancel.distinct-terminal-status``: a terminal status apart from failed), or
    ``interrupted`` for a run its user stopped (Ctrl-C, SIGINT: ``KeyboardInterrupt``), which did
    not fail."""

    @classmethod
    def of(cls, exc: BaseException, mask: Callable[[str], str]) -> RunFailure:
        """The failure ``exc`` stands for, its message on one line through ``mask`` (the secret guard)."""
        if isinstance(exc, KeyboardInterrupt):
            return cls("KeyboardInterrupt", "interrupted (Ctrl-C or SIGINT) before it committed", INTERRUPTED)
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
        rows = [_row(r.run_id, r.phase, r.table, r.payload) for r in pending]  # bounded: FLUSH_LIMIT
        keys = tuple((r.run_id, r.phase) for r in pending)
        texts = tuple(json.dumps(r.payload) for r in pending)  # the text the catalog stored
        txn = table.transaction("append")
        try:
            txn.stage(pa.Table.from_pylist(rows, schema=runs_schema()))
            txn.commit(extra_requirements=(AssertRecordsPending(keys),),
                       extra_updates=(MarkRecordsFlushed(keys, texts),))
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
        """Every run's plan, commit and fail rows: ``_runs`` merged with the cache, latest row winning
        (:func:`history_sql`), ordered by time."""
        return self.select(f"SELECT * FROM {HISTORY}").cast(runs_schema())

    def select(self, query: str, params: Sequence[Any] = ()) -> pa.Table:
        """The answer of ``query``, a DuckDB SELECT reading the history as ``__cf_history`` (``?``
        placeholders bound to ``params``), run where the history is built: only what it selects
        leaves DuckDB."""
        cached = self.store.catalog.pending_run_texts()  # before the pin: a flush between is in _runs
        pinned = self.store.catalog.pin_heads([RUNS_TABLE]).get(RUNS_TABLE)
        con = self.store.duckdb()
        try:
            durable = None
            if pinned is not None and pinned.commit_seq:
                durable = Table(self.store, pinned.head).snapshot_at(pinned.commit_seq)
            sql = f"WITH {HISTORY} AS ({history_sql(con, cached, durable)}) {query}"
            return con.sql(sql, params=list(params)).to_arrow_table()
        finally:
            con.close()


def history_sql(con: duckdb.DuckDBPyConnection, cached: list[tuple[str, str, str, str]],
                durable: Snapshot | None) -> str:
    """One DuckDB SELECT answering run history: the rows of ``durable`` (``_runs`` at a snapshot;
    None: none yet) merged with the ``cached`` rows still awaiting a flush
    (:meth:`Catalog.pending_run_texts`, read before ``durable`` was pinned, so a flush landing in
    between is in one or the other), one row per ``(run_id, phase)``: the latest ``recorded_at``,
    a cached row winning a tie; ordered by ``recorded_at``, ``run_id``, plan rows first, phase.

    A flush removes from the cache only the payloads it appended (``MarkRecordsFlushed``), so the
    cache holds just the pending rows and they alone need reading: the cost is the size of
    ``_runs`` and the pending rows, never a walk over every record. Nothing here hands DuckDB a
    Python object: the cached rows reach it as JSON text literals (``from_json``), so the read path
    never imports pandas.
    """
    types = dict(zip(runs_schema().names, duckdb_types(runs_schema())))
    columns = ", ".join(quote(n) for n in runs_schema().names)

    def cast(read: dict[str, str]) -> str:
        return ", ".join(f"CAST({read.get(n, 'NULL')} AS {types[n]}) AS {quote(n)}" for n in runs_schema().names)

    sources = []
    sql = snapshot_sql(durable, con) if durable is not None else None
    if sql is not None and durable is not None and durable.schema is not None:
        stored = {n: f"{_RUNS}.{quote(n)}" for n in runs_schema().names if n in durable.schema.names}
        sources.append(f"SELECT {cast(stored)}, 0 AS {_SOURCE} FROM ({sql}) AS {_RUNS}")
    if cached:
        ids, phases, tables, payloads = (list(column) for column in zip(*cached))
        fields = {"run_id": ids, "phase": phases, "table_name": tables}
        unnested = ", ".join(f"unnest(from_json({sql_literal(json.dumps(v))}, '[\"VARCHAR\"]')) AS {quote(n)}"
                             for n, v in fields.items())
        payload = sql_literal("[" + ",".join(payloads) + "]")
        scanned = (f"SELECT {unnested}, unnest(from_json({payload}, {sql_literal(json.dumps([_PAYLOAD_JSON]))}))"
                   f" AS {_PAYLOAD}")
        read = {n: f"{_PAYLOAD}.{quote(n)}" for n in runs_schema().names} | {n: quote(n) for n in fields}
        read |= {"recorded_at": f"make_timestamptz(coalesce({_PAYLOAD}.recorded_us, 0))",
                 "bound_hits": f"coalesce({_PAYLOAD}.bound_hits, [])"}
        sources.append(f"SELECT {cast(read)}, 1 AS {_SOURCE} FROM ({scanned}) AS {_CACHED}")
    if not sources:
        return f"SELECT {cast({})} WHERE false"
    merged = " UNION ALL ".join(sources)
    return (f"SELECT {columns} FROM ({merged}) AS {_RUNS}"
            f" QUALIFY row_number() OVER (PARTITION BY run_id, phase ORDER BY recorded_at DESC, {_SOURCE} DESC) = 1"
            " ORDER BY recorded_at, run_id, phase <> 'plan', phase")


_RUNS, _CACHED, _PAYLOAD, _SOURCE = "__cf_runs", "__cf_cached", "__cf_payload", "__cf_source"
_PAYLOAD_JSON = {
    "kind": "VARCHAR", "status": "VARCHAR", "recorded_us": "BIGINT", "commit_seq": "BIGINT", "rows": "BIGINT",
    "parts": "BIGINT", "bytes": "BIGINT", "manifest": "VARCHAR", "downgrade_events": "BIGINT",
    "bound_hits": [{"step": "VARCHAR", "attempt": "BIGINT", "bound": "VARCHAR"}], "error": "VARCHAR",
    "detail": "VARCHAR",
}
"""The JSON structure of a cached row's payload, as ``from_json`` reads it (see :func:`_row`)."""


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
