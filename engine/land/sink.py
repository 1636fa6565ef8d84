"""Where a pipeline run's rows go: typed landing, the secret guard, normalization, staging, commits.

Every source runner (files, http, receive, seed) hands its decoded batches to one
:class:`LandingSink`, which applies the landing path of DESIGN.md to each batch, in order:

1. typed landing (the pipeline's ``types``);
2. the secret guard (``engine.guard``): every string and binary cell, nested ones included, and
   every column, field and map-key name is scanned and credentials are masked before anything is
   staged; the masked-cell counts per column are kept per table and logged per pull
   (``run.guard-secrets.mask-only``). The guard runs after typed landing on purpose: it sees the
   batch exactly as it will be staged, so no ``types`` declaration (binary, a map) can move a value
   or a name past it;
3. normalization: ``nested`` keeps the batch as it is; ``relational`` shreds it into the root table
   and one child table per list (``engine.normalize``), each child checked for its list index
   before it is staged (``run.normalize.list-index-missing``);
4. names that differ only in case from another in the same table, at any depth, refuse the batch
   (``engine.land.names``): a reader resolving names case-insensitively would answer one for the other;
5. staging into one :class:`RunTransaction` per touched table. Small batches (an HTTP page) are
   buffered per table until :data:`BUFFER_ROWS` rows or :data:`BUFFER_BYTES`, so pages do not
   become tiny parts.

:meth:`LandingSink.commit` lands every touched table in one catalog commit
(``storage.transaction.commit_together``), the pipeline's root table carrying the cursor: a
reader sees the root rows, their child rows and the position together or none of them, and a
failure or a crash leaves none of them, so the re-run lands each table's rows once.
Under a keyed root the ids follow the key, and child tables are keyed on ``_cf_id``: a re-run
of the same rows lands them with the same ids, so they replace those rows; under an unkeyed root
it lands them with fresh ids. A sink of kind ``replace`` (``write_disposition = "replace"``,
``engine.land.disposition``) commits replacing runs: its rows become the root table and every
relational child table ``<root>__…`` in that one commit, a child table it staged nothing for emptied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contextful.engine.config.manifest import PipelineSpec
from contextful.engine.land.declaration import table_declaration
from contextful.engine.land.names import LandedNames
from contextful.engine.land.results import TableLanding
from contextful.engine.land.typed import apply_types, read_types
from contextful.storage import Store, Table
from contextful.storage.commits import AssertStaging, Requirement
from contextful.storage.keys import check_keys
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import schema_from_text
from contextful.storage.run_record import RunFailure
from contextful.storage.staging import StagingLease
from contextful.storage.transaction import (
    CommitResult,
    RunTransaction,
    Savepoint,
    commit_together,
    new_run_id,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.land.input_landing import LandRequest
    from contextful.storage.objects import ObjectStore
else:
    pa = lazy_module("pyarrow")

log = logging.getLogger(__name__)

BUFFER_ROWS = 1_000_000
BUFFER_BYTES = 64 * 1024 * 1024


def table_merge(spec: PipelineSpec, name: str) -> tuple[tuple[str, ...], str | None]:
    """The primary key and ``order_by`` table ``name`` of ``spec`` is created with: the pipeline's for
    its table; for a relational child table of a keyed root ``_cf_id``, and ``_cf_order`` when the root
    merges by ``order_by`` (``engine.normalize``: elements merge as their root rows do); else none."""
    if name == spec.table:
        return spec.primary_key, spec.order_by
    from contextful.engine.normalize import child_order_by, child_primary_key

    return child_primary_key(spec.primary_key), child_order_by(spec.primary_key, spec.order_by)


def landing_table(store: Store, spec: PipelineSpec, name: str) -> Table:
    """Table ``name`` of ``spec``, created for the run about to land on it (provisionally) with its
    merge (:func:`table_merge`) and, for a relational child table of a keyed root, its lifetime rule:
    its rows follow the root row versions that landed them (``storage.follows``; a table landed
    before the rule takes it by a declaration of its own)."""
    follows = None
    if name != spec.table and spec.normalize == "relational":
        from contextful.engine.normalize import child_follows

        follows = child_follows(spec.table, spec.primary_key)
    declared = table_declaration(spec) if name == spec.table else None
    return store.create_table(name, *table_merge(spec, name), provisional=True, follows=follows, declared=declared)


def load_staging(spec: PipelineSpec) -> None:
    """Import what staging ``spec``'s first batch needs, now: called while the decoder's server
    starts (``Decoder.start``), these imports overlap the server's own on another core instead of
    adding to a small run's latency. pyarrow imports pandas at its first array built from Python
    or NumPy values (its pandas shim): the guard's first batch would pay that 0.3 s otherwise."""
    import contextful.engine.guard.arrow
    import contextful.engine.guard.key_cells
    import pyarrow.compute
    import pyarrow.parquet  # noqa: F401

    if spec.normalize == "relational":
        import contextful.engine.normalize  # noqa: F401
    pa.array([0])


def prepare_batch(spec: PipelineSpec, batch: pa.Table, id_prefix: str, *, types: dict[str, pa.DataType] | None,
                  guard: bool = True, pull: str = "", first_row: int = 0,
                  renamed: list[str] | None = None) -> tuple[dict[str, pa.Table], dict[str, int]]:
    """One decoded batch as the tables it lands in, and the cells the guard masked per column.

    Typed landing (when ``types`` is given), then the pipeline's transform chain
    (``engine.run.transform``), then the secret guard, then normalization: ``nested``
    gives ``{root: batch}``; ``relational`` the root table then its child tables, each checked for
    its list index. ``id_prefix`` makes the relational row ids of an unkeyed root unique (a run id
    and a counter). A keyed root's rows are checked for their key (``storage.keys``): a missing key
    column or a null key fails the batch naming ``pull`` and the row (``first_row`` is the batch's
    first row's position in the pull). The guard's counts are logged for ``pull``, unless
    ``renamed`` is given: then the paths whose names it masked are appended to it and the caller
    logs (a landing child reports them to its parent, which logs).
    """
    table = apply_types(spec.table, batch, types, first_row) if types is not None else batch
    if spec.transform:
        from contextful.engine.run.transform import run_chain

        table = run_chain(spec.id, spec.table, list(spec.transform), table)
    masked: dict[str, int] = {}
    if guard:
        from contextful.engine.guard import guard_table, log_masked
        from contextful.engine.guard.key_cells import distinct_key_cells

        guarded = guard_table(table)
        table, masked = distinct_key_cells(table, guarded.table, spec.primary_key), dict(guarded.masked)
        if renamed is None:
            log_masked(spec.id, pull, masked, guarded.renamed)
        else:
            renamed.extend(guarded.renamed)
    if spec.normalize != "relational":
        check_keys(spec.table, spec.primary_key, table, input=pull or None, first_row=first_row)
        return {spec.table: table}, masked
    from contextful.engine.normalize import shred, write_relational

    tables: dict[str, pa.Table] = {}
    write_relational(shred(table, spec.table, id_prefix=id_prefix, primary_key=spec.primary_key,
                           order_by=spec.order_by, input=pull or None, first_row=first_row), tables.__setitem__)
    return tables, masked


@dataclass
class _Staging:
    txn: RunTransaction
    buffered: list[pa.Table] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0

    def flush(self) -> None:
        if not self.buffered:
            return
        pending, self.buffered = self.buffered, []
        self.buffered_rows = self.buffered_bytes = 0
        for table in pending:  # each keeps its own schema: the transaction reconciles them
            self.txn.stage(table)


@dataclass(frozen=True)
class SinkPoint:
    points: dict[str, Savepoint]
    masked: dict[str, dict[str, int]]


class LandingSink:
    """Stages one pipeline run's batches into its tables and commits them together."""

    def __init__(self, store: Store, spec: PipelineSpec, *, meta: dict[str, Any] | None = None,
                 guard: bool = True, run_id: Callable[[str], str | None] | None = None, kind: str = "append") -> None:
        self.store = store
        self.spec = spec
        self.kind = kind
        """``append``, or ``replace``: each commit's rows become its tables, the root's and every
        relational child table's (one the run staged nothing for is emptied)."""
        self.meta = dict(meta or {"pipeline": spec.id})
        self.guard = guard
        self.types = read_types(spec.types)
        self.run_id = run_id
        self.landings: dict[str, TableLanding] = {spec.table: TableLanding(spec.table)}
        self._staging: dict[str, _Staging] = {}
        self._masked: dict[str, dict[str, int]] = {}
        self._names: dict[str, LandedNames] = {}
        self._batches = 0
        self._pull = ("", 0)  # the last pull staged and the rows staged from it so far
        self._leases: list[StagingLease] = []  # inputs their children staged, adopted since the last commit
        self._landing: dict[str, StagingLease] = {}  # inputs their children are staging, by lease run id
        self._failures: set[RunFailure] = set()  # the failures some run of this sink recorded

    # --- staging --------------------------------------------------------------------------------

    def stage(self, batch: pa.Table, pull: str = "", *, typed: bool = False) -> None:
        """Type (unless ``typed``), guard, normalize and stage one batch of the root table."""
        if batch.num_rows == 0:
            return
        self._batches += 1
        id_prefix = f"{self._transaction(self.spec.table).run_id}.{self._batches}"
        label = pull or f"batch {self._batches}"
        first_row = self._pull[1] if self._pull[0] == label else 0  # an input arrives as consecutive batches
        self._pull = (label, first_row + batch.num_rows)
        tables, masked = prepare_batch(self.spec, batch, id_prefix, types=None if typed else self.types,
                                       guard=self.guard, pull=label, first_row=first_row)
        for name, table in tables.items():  # every table checked before any is created or buffered
            self._names_of(name).admit(table.schema, label)
        if masked:
            counts = self._masked.setdefault(self.spec.table, {})
            for column, n in masked.items():
                counts[column] = counts.get(column, 0) + n
        for name, table in tables.items():
            self._buffer(name, table)

    # --- inputs landed by their children (engine.land.input_landing) ------------------------------

    def land_request(self, label: str, objects: ObjectStore) -> LandRequest:
        """A request for a child to land one input (``label``: ``input <path>``) into this sink's
        run, under a staging lease of its own taken now on the root table (before any part exists).
        The lease is the caller's to :meth:`adopt` (the commit that lands the input ends it) or to
        :meth:`drop` (the input failed)."""
        from contextful.engine.land import input_landing
        from contextful.engine.land.input_landing import LandRequest, TableSeed

        tables = {}
        for name, staging in self._staging.items():
            staging.flush()
            txn = staging.txn
            tables[name] = TableSeed(txn.schema_text, txn.table.primary_key, txn.merge_order_by)
        for name in self.store.table_names():
            if name not in tables and (name == self.spec.table or name.startswith(self.spec.table + "__")):
                table = self.store.table(name)
                head = table.head
                tables[name] = TableSeed(head.schema, head.primary_key, head.order_by if head.primary_key else None)
        lease = StagingLease(self.store, self.spec.table, new_run_id())
        self._landing[lease.run_id] = lease
        return LandRequest(spec=self.spec, root=objects.url, storage_options=objects.options,
                           durable=self.store.durable, run_id=lease.run_id, label=label, types=self.types,
                           guard=self.guard, tables=tables, group_rows=input_landing.STAGE_ROWS)

    def adopt(self, request: LandRequest, report: dict[str, Any]) -> None:
        """Take what a child staged for one input (its :meth:`land_request`) into this sink's runs,
        group by group in order, as :meth:`stage` would have staged those groups: names admitted,
        the guard's counts kept and logged, each table's arrived schema reconciled (its events
        recorded) and its parts adopted. A refusal raises before anything of the group is taken; the
        caller rolls the input back (:meth:`rollback_to`) and :meth:`drop` s it."""
        from contextful.engine.guard import log_masked
        from contextful.storage.commits import PartFile

        label = request.label
        for group in report["groups"]:
            arrived = {name: schema_from_text(staged["arrived"]) for name, staged in group["tables"].items()}
            for name, schema in arrived.items():  # every table checked before any is taken
                self._names_of(name).admit(schema, label)
            masked = group["masked"]
            if self.guard:
                log_masked(self.spec.id, label, masked, group["renamed"])
            if masked:
                counts = self._masked.setdefault(self.spec.table, {})
                for column, n in masked.items():
                    counts[column] = counts.get(column, 0) + n
            for name, staged in group["tables"].items():
                if staged["parts"]:
                    self._transaction(name).adopt(arrived[name], [
                        (PartFile(p["path"], p["rows"], p["bytes"]), schema_from_text(p["schema"]))
                        for p in staged["parts"]])
        self._leases.append(self._lease_of(request))

    def drop(self, request: LandRequest, report: dict[str, Any] | None = None) -> None:
        """An input its child staged does not land: delete its parts (those its report names; with
        no report, a child that failed or was killed, every part its lease's run id names) and end
        its lease (collection takes anything left)."""
        from contextful.engine.land.input_landing import landed_parts

        paths = list(landed_parts(report)) if report is not None else self._parts_named(request.run_id)
        if paths:
            try:
                self.store.objects.delete(paths)
            except OSError as exc:
                log.warning("parts of %s left for collection: %s", request.label, exc)
        self._lease_of(request).end()

    def _parts_named(self, run_id: str) -> list[str]:
        """The part objects of run ``run_id`` on the pipeline's tables (its root and child tables)."""
        from contextful.storage.collect import run_of
        from contextful.storage.manifest import table_prefix

        tables = [t for t in self.store.objects.children("tables")
                  if t == self.spec.table or t.startswith(self.spec.table + "__")]
        return [o.key for t in tables for o in self.store.objects.list(f"{table_prefix(t)}/parts")
                if run_of(o.key) == run_id]

    def _lease_of(self, request: LandRequest) -> StagingLease:
        return self._landing.pop(request.run_id)

    def _buffer(self, name: str, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        staging = self._staging_for(name)
        staging.buffered.append(table)
        staging.buffered_rows += table.num_rows
        staging.buffered_bytes += table.nbytes
        if staging.buffered_rows >= BUFFER_ROWS or staging.buffered_bytes >= BUFFER_BYTES:
            staging.flush()

    def _staging_for(self, name: str) -> _Staging:
        if name not in self._staging:
            run_id = self.run_id(name) if self.run_id is not None else None
            txn = landing_table(self.store, self.spec, name).transaction(self.kind, run_id=run_id,
                                                                          meta=dict(self.meta))
            self._staging[name] = _Staging(txn)
            self.landings.setdefault(name, TableLanding(name))
        return self._staging[name]

    def _names_of(self, name: str) -> LandedNames:
        """The names table ``name`` holds: landed, and staged by this run so far."""
        if name not in self._names:
            landed = self.store.table(name).schema if name in self.store.table_names() else None
            self._names[name] = LandedNames(name, landed)
        return self._names[name]

    def _transaction(self, name: str) -> RunTransaction:
        return self._staging_for(name).txn

    @property
    def staged_bytes(self) -> int:
        """Bytes staged as parts plus those buffered, across every table since the last commit
        (waits for the parts being written)."""
        return sum(s.txn.staged_bytes + s.buffered_bytes for s in self._staging.values())

    def staged_reach(self, threshold: int) -> bool:
        """Whether :attr:`staged_bytes` reaches ``threshold``; waits for part writes only when an
        upper bound of it (no waiting) says it might."""
        bound = sum(s.txn.staged_bytes_at_most() + s.buffered_bytes for s in self._staging.values())
        return bound >= threshold and self.staged_bytes >= threshold

    @property
    def staged_bytes_written(self) -> int:
        """Bytes staged so far as far as written files and buffers show (waits for nothing; progress)."""
        return sum(s.txn.staged_bytes_written() + s.buffered_bytes for s in self._staging.values())

    @property
    def staged_rows(self) -> int:
        return sum(s.txn.staged_rows + s.buffered_rows for s in self._staging.values())

    @property
    def pending(self) -> bool:
        return bool(self._staging)

    # --- savepoints -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Stage what is buffered: a batch the table cannot take (``SchemaIrreconcilable``) fails here,
        so a caller flushing at the end of an input fails that input, not the one after it."""
        for staging in self._staging.values():
            staging.flush()

    def savepoint(self) -> SinkPoint:
        """A point to roll back to when what follows must not land (one failed input)."""
        self.flush()
        return SinkPoint({name: s.txn.savepoint() for name, s in self._staging.items()},
                         {t: dict(c) for t, c in self._masked.items()})

    def rollback_to(self, point: SinkPoint, failure: RunFailure | None = None) -> None:
        """Forget what was staged after ``point``; a run first opened after it is given up on ``failure``."""
        for name in list(self._staging):
            staging = self._staging[name]
            staging.buffered, staging.buffered_rows, staging.buffered_bytes = [], 0, 0
            if name in point.points:
                staging.txn.rollback_to(point.points[name])
            else:  # a table first touched after the point
                self._give_up(staging.txn, failure)
                del self._staging[name]
        self._masked = {t: dict(c) for t, c in point.masked.items()}
        self._names = {name: LandedNames(name, p.schema) for name, p in point.points.items()}

    # --- landing --------------------------------------------------------------------------------

    def commit(self, scope: str | None = None, position: Any = None,
               meta: dict[str, Any] | None = None, requirements: tuple[Requirement, ...] = ()) -> CommitResult | None:
        """Commit every touched table in one catalog commit, the root with ``position`` and
        ``requirements`` (checked in that commit).

        A position with nothing staged still commits (an empty run on the root table): it moved.
        Returns the root table's commit (None when nothing was staged and no position given).
        """
        if not self._staging and scope is None:
            return None
        if scope is not None or self.kind == "replace":
            self._staging_for(self.spec.table)
        if self.kind == "replace" and self.spec.normalize == "relational":
            children = self.spec.table + "__"
            for name in self.store.table_names():
                if name.startswith(children):
                    self._staging_for(name)
        return commit_sinks([self], meta, {self.spec.table: requirements}, scope=scope, position=position)[0]

    def _prepare(self, meta: dict[str, Any] | None, requirements: tuple[Requirement, ...], scope: str | None,
                 position: Any) -> list[RunTransaction]:
        """Stage what is buffered and ready each run for the commit: its meta, masked counts, the
        root's position and ``requirements``."""
        names = list(self._staging)
        for name in names:
            staging = self._staging[name]
            staging.flush()
            staging.txn.meta.update(meta or {})
            if self._masked.get(name):
                staging.txn.meta["masked_cells"] = self._masked[name]
            if name == self.spec.table and scope is not None:
                staging.txn.set_cursor(scope, position)
            if name == self.spec.table and requirements:
                staging.txn.add_to_commit(requirements)
            if name == self.spec.table and self._leases:  # every adopted input's parts are still there
                staging.txn.add_to_commit(tuple(AssertStaging(lease.run_id) for lease in self._leases))
        return [self._staging[name].txn for name in names]

    def _landed(self, committed: list[CommitResult]) -> CommitResult | None:
        """Record the commits of this sink's runs (in :meth:`_prepare`'s order); the root's, if any."""
        names = list(self._staging)
        self._staging.clear()
        leases, self._leases = self._leases, []
        for lease in leases:  # its parts are the commit's now
            lease.end()
        result: CommitResult | None = None
        for name, landed in zip(names, committed):
            landing = self.landings[name]
            landing.add(landed)
            for column, n in self._masked.pop(name, {}).items():
                landing.masked_cells[column] = landing.masked_cells.get(column, 0) + n
            if name == self.spec.table:
                result = landed
        return result

    def abort(self, failure: RunFailure | None = None) -> None:
        """Drop everything staged since the last commit.

        ``failure``: why. Each dropped run records it; when no run of this sink holds it (the
        pipeline failed before staging a row), a fail row of its own on the pipeline's table does,
        so the run history shows every failed pipeline run.
        """
        for staging in self._staging.values():
            self._give_up(staging.txn, failure)
        for lease in self._leases:  # the adopted inputs' parts go with their runs: their leases end
            lease.end()
        self._leases = []
        if failure is not None and failure not in self._failures:
            self.store.runs.fail(new_run_id(), self.spec.table, self.kind, failure)
            self._failures.add(failure)
        self._staging.clear()
        self._masked.clear()
        self._names.clear()

    def _give_up(self, txn: RunTransaction, failure: RunFailure | None) -> None:
        txn.abort(failure)
        if failure is not None:
            self._failures.add(failure)

    def results(self) -> list[TableLanding]:
        """The root table's landing first, then each child table's."""
        return [self.landings[self.spec.table]] + [t for n, t in self.landings.items() if n != self.spec.table]


def commit_sinks(sinks: Sequence[LandingSink], meta: dict[str, Any] | None = None,
                 requirements: Mapping[str, tuple[Requirement, ...]] | None = None, *, scope: str | None = None,
                 position: Any = None) -> list[CommitResult | None]:
    """Commit the runs staged by every sink of ``sinks`` (one store) in one catalog commit.

    Each sink's root table checks its ``requirements`` (by table name) in that commit; the first
    sink's root carries ``position`` under ``scope``. Every requirement holds and every head
    advances, or nothing lands and every sink's staged runs are dropped (a host task's content
    tables and its marker table, ``engine.derive.run``: a reader never sees one without the other).
    Returns each sink's root-table commit (None for a sink that staged nothing).
    """
    from contextful.engine.guard import masked_failure

    wanted = requirements or {}
    counts: list[int] = []
    txns: list[RunTransaction] = []
    try:
        for n, sink in enumerate(sinks):
            prepared = sink._prepare(meta, wanted.get(sink.spec.table, ()), scope if n == 0 else None, position)
            counts.append(len(prepared))
            txns.extend(prepared)
        if len(txns) > 1:  # each run names the runs it landed with (``contextful run show``)
            for txn in txns:
                txn.meta["tables"] = {t.table.name: t.run_id for t in txns}
        committed = commit_together(txns)
    except BaseException as exc:
        failure = masked_failure(exc)
        for sink in sinks:
            sink.abort(failure)
        raise
    results: list[CommitResult | None] = []
    for sink, count in zip(sinks, counts):
        results.append(sink._landed(committed[:count]))
        committed = committed[count:]
    return results
