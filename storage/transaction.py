"""A run's transaction: stage Arrow batches as parts, then land them with one commit.

The sequence is the decision "no representable torn publication": parts are written whole, the
run manifest is written whole (a small one rides in the commit itself, ``storage.manifest``), and
only then one catalog commit advances the table head. Until
that commit the run is invisible; after it, all of it is. A crash in between leaves unreferenced
objects for collection and nothing a reader can see. A run that aborts on a table its caller
just created for it (``Store.create_table(provisional=True)``) drops that table again while
nothing has committed to it. Runs on several tables that must be seen together (a relational
landing's root and child tables) land with :func:`commit_together`: one catalog commit advances
every head or none.

Staging refuses a batch for a keyed table that lacks a key column or holds a null or NaN key
(``storage.keys``), reconciles each batch's schema with the table's (``storage.reconcile``; a key
column never widens to a type that loses keys) and keeps the downgrade events; they reach the manifest only through the commit, so a stage that never commits
contributes none (``run.record.schema-diff-shape``).

On a local store, parts are written behind the caller: ``stage`` reconciles and conforms at once,
then hands each part to the store's writer threads (Parquet encoding releases the GIL) and returns,
so the next batch is produced while earlier ones are written. At most ``store.write_threads``
parts of one run are in flight (that bounds the memory held). Everything that needs the parts —
``commit``, ``savepoint``, ``rollback_to``, ``abort``, ``staged_*`` — first waits for them; a
failed write raises its ``StagingFailed`` there, and the run lands nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self

from contextful.storage.commits import (
    AddParts,
    AssertSchemaId,
    AssertStaging,
    AssertTableUUID,
    AssertWriter,
    CommitRequest,
    PartFile,
    RemoveAllParts,
    Requirement,
    SetCursor,
    SetSchema,
    Update,
)
from contextful.storage.cursors import check_cursor
from contextful.storage.errors import CommitConflict, CommitOutcomeUnknown, ContextfulError, StagingFailed
from contextful.storage.fence import current_fence, verify_current
from contextful.storage.keys import check_keys
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import (
    RunManifest,
    manifest_key,
    place_manifest,
    schema_from_text,
    schema_to_text,
)
from contextful.storage.parts import part_key, split_table, write_part
from contextful.storage.reach import check_reach
from contextful.storage.reconcile import DowngradeEvent, conform, reconcile
from contextful.storage.reserved import RESERVED_TABLES, check_modality
from contextful.storage.staging import StagingLease

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.storage.run_record import RunFailure
    from contextful.storage.table import Table
else:
    pa = lazy_module("pyarrow")

log = logging.getLogger(__name__)

KINDS = ("append", "replace")
PART_OVERHEAD_BOUND = 1 << 20
"""Bytes a part file may hold beyond its rows' Arrow size (footer, page headers, statistics)."""
MAX_COMMIT_ATTEMPTS = 20


@dataclass(frozen=True)
class CommitResult:
    table: str
    run_id: str
    commit_seq: int
    rows: int
    parts: int
    bytes: int
    downgrade_events: tuple[DowngradeEvent, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "run_id": self.run_id,
            "commit_seq": self.commit_seq,
            "rows": self.rows,
            "parts": self.parts,
            "bytes": self.bytes,
            "downgrade_events": [e.to_json() for e in self.downgrade_events],
        }


@dataclass(frozen=True)
class Savepoint:
    parts: int
    schema: pa.Schema | None
    events: int
    arrived: int


@dataclass(frozen=True)
class _InFlight:
    """A part being written on the writer pool."""

    written: Future[PartFile]
    """The write: the part once durable and in place, or the write's failure."""
    bound: int
    """Bytes its file cannot exceed (its Arrow size and a fixed file overhead)."""
    encoded: Future[PartFile]
    """Its counts, once its bytes are written (before its fsyncs), or the write's failure."""


def new_run_id() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"r{stamp}-{uuid.uuid4().hex[:12]}"


def as_arrow(data: Any) -> pa.Table:
    """An Arrow table from an Arrow table or batch, or anything with ``to_arrow()`` (Polars)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "to_arrow"):
        return data.to_arrow()
    raise TypeError(f"cannot land {type(data).__name__}: pass an Arrow table or batch, or a Polars frame")


class RunTransaction:
    """Stages one run on one table; :meth:`commit` lands it, :meth:`abort` drops it."""

    def __init__(self, table: Table, kind: str = "append", run_id: str | None = None,
                 meta: dict[str, Any] | None = None, record: bool = True, own_schema: bool = False) -> None:
        if kind not in KINDS:
            raise ValueError(f"run kind {kind!r} is not one of {', '.join(KINDS)}")
        if own_schema and kind != "replace":
            raise ValueError("only a replacing run can land in a schema of its own")
        check_reach(table.store.reach, "write", table.name)  # before anything is staged (storage.reach)
        self.table = table
        self.store = table.store
        self.kind = kind
        self.run_id = run_id or new_run_id()
        self.meta = dict(meta or {})
        # Known to the catalog before the first part exists, so collection never takes its parts; the
        # head is read in the same catalog transaction.
        self._lease = StagingLease(self.store, table.name, self.run_id, run=True)
        assert self._lease.head is not None
        head = table.head = self._lease.head
        self._uuid = head.uuid
        self._base_schema_id = head.schema_id
        self._order_by = head.order_by if head.primary_key else None  # guarded as keys are (storage.reconcile)
        # own_schema: a replacing run (a model build) lands in its result's schema, not merged with the table's
        self._schema: pa.Schema | None = schema_from_text(head.schema) if head.schema and not own_schema else None
        self._parts: list[PartFile] = []
        self._writing: list[_InFlight] = []  # parts in flight, in part order after _parts
        self._rows = 0  # rows staged (settled or in flight)
        self._orphans: list[str] = []
        self._part_schemas: list[pa.Schema] = []
        self._events: list[DowngradeEvent] = []
        self._arrived: list[str] = []
        self._cursor: dict[str, Any] | None = None
        self._extra_requirements: tuple[Requirement, ...] = ()
        self._fence = current_fence()  # the execution attempt this run writes for (storage.fence)
        self._extra_updates: tuple[Update, ...] = ()
        self._done = False
        self._outcome_unknown = False
        self._recorded = record and table.name not in RESERVED_TABLES  # record=False: no _runs rows
        if self._recorded:
            self.store.runs.plan(self.run_id, table.name, kind)

    # --- staging --------------------------------------------------------------------------------

    def stage(self, data: Any) -> None:
        """Reconcile, conform and write ``data`` (Arrow table/batch, Polars frame) as part(s)."""
        self._check_open()
        self._lease.renew()
        batch = as_arrow(data)
        name = self.table.name
        check_modality(name, batch)
        check_keys(name, self.table.primary_key, batch)
        rec = reconcile(name, self._schema, batch.schema, self.table.primary_key, self._order_by)
        landed = conform(batch, rec.schema, name)
        self._schema = rec.schema
        self._events.extend(rec.events)
        arrived = schema_to_text(batch.schema)
        if arrived not in self._arrived:
            self._arrived.append(arrived)
        for piece in split_table(landed):
            if piece.num_rows == 0:
                continue
            key = part_key(name, self.run_id, len(self._parts) + len(self._writing))
            encoded: Future[PartFile] = Future()
            write = self._writer(key, piece, rec.schema, encoded)
            pool = self.store.writer_pool()
            if pool is None:
                self._parts.append(write())
            else:
                if len(self._writing) >= self.store.write_threads:
                    self._settle(self._writing[0].written)
                self._writing.append(_InFlight(pool.submit(write), piece.nbytes + PART_OVERHEAD_BOUND, encoded))
            self._part_schemas.append(rec.schema)
            self._rows += piece.num_rows

    @property
    def schema_text(self) -> str | None:
        """The run's schema so far (``schema_to_text``; None before its first rows)."""
        return schema_to_text(self._schema) if self._schema is not None else None

    @property
    def merge_order_by(self) -> str | None:
        """The ``order_by`` column a keyed table's staged rows are guarded by (``storage.reconcile``)."""
        return self._order_by

    def adopt(self, arrived: pa.Schema, parts: Sequence[tuple[PartFile, pa.Schema]]) -> None:
        """Take into the run parts another process staged for one arriving table, as :meth:`stage`
        would have staged it: ``arrived`` is reconciled into the run's schema (its downgrade events
        recorded) and each part (with the schema it was written in, which the run's widens) joins
        the run in order. Collection keeps them meanwhile by a staging lease their writer
        named them by (``engine.land.input_landing``); its commit checks that lease
        (:meth:`add_to_commit`)."""
        self._check_open()
        self._lease.renew()
        rec = reconcile(self.table.name, self._schema, arrived, self.table.primary_key, self._order_by)
        self._settle()  # parts keep their order: the ones in flight are placed first
        self._schema = rec.schema
        self._events.extend(rec.events)
        text = schema_to_text(arrived)
        if text not in self._arrived:
            self._arrived.append(text)
        for part, written in parts:
            self._parts.append(part)
            self._part_schemas.append(written)
            self._rows += part.rows

    def _writer(self, key: str, piece: pa.Table, schema: pa.Schema,
                encoded: Future[PartFile]) -> Callable[[], PartFile]:
        """The write of one part; ``encoded`` is resolved with its counts before its fsyncs (the
        manifest is written meanwhile), or with the write's failure."""
        name, objects, durable = self.table.name, self.store.objects, self.store.durable

        def write() -> PartFile:
            try:
                return write_part(objects, key, piece.to_batches(), schema, durable=durable,
                                  encoded=encoded.set_result)
            except OSError as exc:  # disk full, permissions, a lost connection: nothing of it is visible
                failure = StagingFailed(name, self.run_id, key, exc.strerror or str(exc))
                if not encoded.done():
                    encoded.set_exception(failure)
                raise failure from exc
            except BaseException as exc:
                if not encoded.done():
                    encoded.set_exception(exc)
                raise

        return write

    def _counted_parts(self) -> list[PartFile]:
        """Every staged part's counts, waiting only until each part in flight is written (its
        fsyncs may still run); a failed write surfaces as :meth:`_settle` raises it."""
        counted = list(self._parts)
        for flight in self._writing:
            if flight.encoded.exception() is not None:
                self._settle()  # raises the first failure, every other write settled
            counted.append(flight.encoded.result())
        return counted

    def _settle(self, until: Future[PartFile] | None = None) -> None:
        """Wait for the parts in flight (up to and including ``until``); raise the first failure.

        On a failure every other write is still waited for, so nothing is written after the run
        is given up; the failed part itself left nothing behind.
        """
        failure: BaseException | None = None
        while self._writing:
            future = self._writing[0].written
            try:
                part = future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the rest settle
                failure = failure or exc
                rest = [f.written for f in self._writing[1:]]
                for other in rest:
                    other.exception()  # wait; their parts are deleted by the caller's abort
                self._orphans = [f.result().path for f in rest if f.exception() is None]
                self._writing.clear()
                break
            self._parts.append(part)
            self._writing.pop(0)
            if future is until:
                break
        if failure is not None:
            raise failure

    @property
    def staged_uris(self) -> list[str]:
        """Where a reader finds each staged part (checks run over them before the commit)."""
        self._settle()
        return [self.store.objects.uri(p.path) for p in self._parts]

    @property
    def staged_bytes(self) -> int:
        """Bytes of the staged part files (waits for the parts in flight)."""
        self._settle()
        return sum(p.bytes for p in self._parts)

    def staged_bytes_at_most(self) -> int:
        """An upper bound of :attr:`staged_bytes` that waits for nothing: the written parts' bytes
        plus, per part in flight, its Arrow size and a fixed file overhead (a zstd Parquet file of
        the same rows is smaller)."""
        written = sum(p.bytes for p in self._parts)
        pending = 0
        for flight in self._writing:
            done = flight.written.done() and flight.written.exception() is None
            pending += flight.written.result().bytes if done else flight.bound
        return written + pending

    def staged_bytes_written(self) -> int:
        """Bytes of the parts whose files are written so far (waits for nothing; for progress)."""
        done = [f.written.result().bytes for f in self._writing if f.written.done() and f.written.exception() is None]
        return sum(p.bytes for p in self._parts) + sum(done)

    @property
    def staged_rows(self) -> int:
        """Rows staged so far, parts in flight included (waits for nothing)."""
        return self._rows

    def savepoint(self) -> Savepoint:
        """A point to return to when what is staged after it must not land (one failed input).

        Waits for nothing: parts keep their order, so the point counts the parts in flight too.
        """
        return Savepoint(len(self._parts) + len(self._writing), self._schema, len(self._events), len(self._arrived))

    def rollback_to(self, point: Savepoint) -> None:
        """Forget and delete everything staged after ``point``; its events go with it."""
        self._check_open()
        try:
            self._settle()
        except StagingFailed as exc:  # the failed part wrote nothing; the rest are dropped below
            log.info("rollback of run %s drops a failed part write: %s", self.run_id, exc)
        dropped = [p.path for p in self._parts[point.parts:]] + self._take_orphans()
        del self._parts[point.parts:], self._part_schemas[point.parts:]
        self._rows = sum(p.rows for p in self._parts)
        del self._events[point.events:], self._arrived[point.arrived:]
        self._schema = point.schema
        if dropped:
            try:
                self.store.objects.delete(dropped)
            except OSError as exc:  # collection removes what is left
                log.warning("rollback of run %s left parts behind: %s", self.run_id, exc)

    def set_cursor(self, scope: str, value: Any) -> None:
        """Commit ``value`` as the position of ``scope`` together with this run's rows."""
        check_cursor(scope, value)
        self._cursor = {"scope": scope, "value": value}

    # --- landing --------------------------------------------------------------------------------

    def commit(self, extra_requirements: tuple[Requirement, ...] = (),
               extra_updates: tuple[Update, ...] = ()) -> CommitResult:
        """Land the run with one catalog commit; retry while only the head schema moved."""
        self.add_to_commit(extra_requirements, extra_updates)
        return commit_together([self])[0]

    def add_to_commit(self, requirements: tuple[Requirement, ...] = (), updates: tuple[Update, ...] = ()) -> None:
        """Check ``requirements`` and apply ``updates`` in this run's commit, beside its own."""
        self._check_open()
        self._extra_requirements += requirements
        self._extra_updates += updates

    def _request(self, refresh: bool) -> tuple[CommitRequest, RunManifest, list[DowngradeEvent]]:
        """The commit landing the run at the table's head; its manifest is written. ``refresh``: read
        the head first; else the head this handle last read (the run's opening at the latest), which
        the commit's requirements check (a schema moved since: AssertSchemaId, and a retry reads it)."""
        name = self.table.name
        head = self.table.refresh() if refresh else self.table.head
        if head.uuid != self._uuid:
            raise CommitConflict(name, f"table uuid is {head.uuid}, not {self._uuid}")
        landed, events = self._landed_against(head.schema_id, head.schema)
        parts = self._counted_parts()
        manifest = RunManifest(
            table=name, table_uuid=self._uuid, run_id=self.run_id, kind=self.kind,
            parts=tuple(parts), landed_schema=schema_to_text(landed),
            arrived_schemas=tuple(self._arrived), cursor=self._cursor,
            downgrade_events=tuple(events), created_us=self.store.clock.now_us(), meta=self.meta,
        )
        key, doc = place_manifest(self.store.objects, manifest, self.store.durable, self.store.inline_manifest_bytes)
        updates: list[Update] = []
        if self.kind == "replace":
            updates.append(RemoveAllParts())
        if len(landed) and manifest.landed_schema != head.schema:
            updates.append(SetSchema(manifest.landed_schema))
        if parts:
            updates.append(AddParts(tuple(
                PartFile(p.path, p.rows, p.bytes, ord_idx=i, exact_schema=written.equals(landed))
                for i, (p, written) in enumerate(zip(parts, self._part_schemas)))))
        if self._cursor is not None:
            updates.append(SetCursor(self._cursor["scope"], self._cursor["value"]))
        if self._recorded:
            updates.append(self.store.runs.commit_update(self.run_id, name, manifest, key))
        updates.extend(self._extra_updates)
        request = CommitRequest(
            table=name, run_id=self.run_id, kind=self.kind, manifest=key,
            requirements=(AssertTableUUID(self._uuid), AssertSchemaId(head.schema_id), AssertStaging(self.run_id),
                          *self._writers(), *self._extra_requirements),
            updates=tuple(updates), rows=manifest.rows, manifest_doc=doc,
        )
        return request, manifest, events

    def _writers(self) -> tuple[AssertWriter, ...]:
        """The fences this run's commit carries: the one it was begun under and the one in force
        where it commits (``storage.fence``; usually one and the same). A fence over a journal
        outside this store's catalog cannot ride in the commit: it is verified against its journal
        now, immediately before the commit (check-then-act)."""
        fences = dict.fromkeys(f for f in (self._fence, current_fence()) if f is not None)
        local = self.store.catalog.journal_location
        if any(fence.journal != local for fence in fences):
            verify_current()
        return tuple(AssertWriter(fence) for fence in fences if fence.journal == local)

    def _landed_against(self, head_schema_id: int, head_schema: str | None) -> tuple[pa.Schema, list[DowngradeEvent]]:
        """The schema the run lands in and its events, given where the head is now."""
        staged = self._schema if self._schema is not None else pa.schema([])
        if head_schema_id == self._base_schema_id or head_schema is None:
            return staged, list(self._events)
        rec = reconcile(self.table.name, schema_from_text(head_schema), staged, self.table.primary_key, self._order_by)
        return rec.schema, self._events + list(rec.events)

    @property
    def outcome_unknown(self) -> bool:
        """Whether the commit was sent and its outcome could not be learned (nothing is deleted)."""
        return self._outcome_unknown

    def abort(self, failure: RunFailure | None = None) -> None:
        """Drop the staged parts; the run lands nothing. After an unknown commit outcome, nothing.

        ``failure``: why the run is given up; a recorded run writes it as its fail row
        (``storage.run_record``), so its history shows it failed.
        """
        if self._done:
            return
        self._done = True
        if failure is not None and self._recorded:
            self.store.runs.fail(self.run_id, self.table.name, self.kind, failure)
        try:
            self._settle()
        except Exception as exc:  # noqa: BLE001 - giving the run up anyway; its written parts go below
            log.info("abort of run %s: a part write had failed: %s", self.run_id, exc)
        keys = [p.path for p in self._parts] + self._take_orphans() + [manifest_key(self.table.name, self.run_id)]
        try:
            self.store.objects.delete([k for k in keys if self.store.objects.exists(k)])
        except OSError as exc:  # collection removes what is left once the lease lapses
            log.warning("abort of run %s left objects behind: %s", self.run_id, exc)
            self._lease.release()
        else:
            self._lease.end()
        if self.table.created:
            self._forget_table()

    def _forget_table(self) -> None:
        """Drop the table this run's caller created, unless a commit landed on it since (commit_seq 0,
        same incarnation): a failed first run leaves no empty table behind. A catalog that cannot be
        reached leaves it, and the run's own error is the one reported."""
        try:
            self.store.catalog.drop_table(self.table.name, self._uuid, at_seq=0)
        except ContextfulError as exc:
            log.warning("abort of run %s left its new table %s behind (empty): %s", self.run_id,
                        self.table.name, exc)

    def _take_orphans(self) -> list[str]:
        """Parts written after a failed one: never in ``_parts``, deleted with the run."""
        orphans, self._orphans = self._orphans, []
        return orphans

    def _check_open(self) -> None:
        if self._done:
            raise RuntimeError(f"run {self.run_id} is already committed or aborted")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.commit()


def commit_together(transactions: Sequence[RunTransaction]) -> list[CommitResult]:
    """Land every run of ``transactions`` (one per table, one store) with one catalog commit.

    Every table's requirements are checked and every head advances, or none does: a reader never
    sees some of the runs without the others (a relational landing's root and child tables). The
    whole commit is built again and retried while only a head schema moved. A CommitOutcomeUnknown
    leaves every run's parts, manifest and lease in place, as :meth:`RunTransaction.commit` does.
    """
    if not transactions:
        return []
    store = transactions[0].store
    if any(t.store is not store for t in transactions):
        raise ValueError("runs committed together must be on one store")
    for txn in transactions:
        txn._check_open()
    for attempt in range(MAX_COMMIT_ATTEMPTS):
        # Each manifest is written while its parts' fsyncs may still run; all of them finish
        # before the commit that makes the parts reachable. The first attempt lands at the heads
        # the runs opened at (no read when nothing moved); a retry reads them.
        built = [txn._request(refresh=attempt > 0) for txn in transactions]
        for txn in transactions:
            txn._settle()
        try:
            seqs = store.catalog.commit_many([request for request, _, _ in built], store.clock)
        except CommitOutcomeUnknown:
            # It may have landed: keep every part, the manifests and the staging leases; an
            # abort after this deletes nothing (the next run or collection settles it).
            for txn in transactions:
                txn._outcome_unknown = txn._done = True
                txn._lease.release()  # left to lapse: collection settles what the run left
            raise
        except CommitConflict as exc:
            if exc.failed != "AssertSchemaId":
                raise
            continue
        break
    else:
        names = ", ".join(txn.table.name for txn in transactions)
        raise CommitConflict(names, "the head schema kept moving", attempts=MAX_COMMIT_ATTEMPTS)
    results = []
    for txn, seq, (_request, manifest, events) in zip(transactions, seqs, built):
        txn._done = True
        txn._lease.release()  # the commit ended it
        txn.table.refresh()
        results.append(CommitResult(txn.table.name, txn.run_id, seq, manifest.rows, len(txn._parts),
                                    manifest.bytes, tuple(events)))
    if any(txn._recorded for txn in transactions):
        store.runs.after_commit()
    # compaction folds, and storage.fold imports this module: imported here
    from contextful.storage.compaction import compact_after_commit

    compact_after_commit(store, [txn.table for txn in transactions])
    return results
