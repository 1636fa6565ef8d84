"""A store table: its head, its history, its snapshots and the runs that append to it.

``append()`` and ``replace()`` are shorthand for a :class:`RunTransaction` that stages and
commits. Reading resolves a snapshot — the head, a ``commit_seq``, or ``as_of`` a transaction
time — to its live parts; a table declaring a primary key answers one row per key by the merge rule
in force at that snapshot (merge on read, storage.snapshot) until a fold compacts it, less the rows
its supersede rule withholds (storage.supersede), and, for a table following a root table's row
versions (storage.follows), less the rows whose root row version the root, read at the same point,
does not answer. :meth:`Table.declare_order_by` and :meth:`Table.declare_follows` are commits of
their own: snapshots below them answer as before.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from contextful.storage.catalog import CommitRow, TableHead
from contextful.storage.clock import to_us
from contextful.storage.commits import AssertTableUUID, CommitRequest, DeclareFollows, DeclareOrderBy, Update
from contextful.storage.errors import (
    CommitConflict,
    SnapshotCollected,
    SnapshotNotFound,
    TableNameInvalid,
    TableNotFound,
)
from contextful.storage.follows import Follows
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import RunManifest, read_manifest, schema_from_text
from contextful.storage.reach import check_reach
from contextful.storage.reconcile import conform
from contextful.storage.snapshot import Snapshot, snapshot_sql
from contextful.storage.transaction import CommitResult, RunTransaction, new_run_id

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.storage.store import Store
else:
    pa = lazy_module("pyarrow")


class Table:
    def __init__(self, store: Store, head: TableHead, created: bool = False,
                 pin: tuple[int, int] | None = None) -> None:
        self.store = store
        self.name = head.name
        self.head = head
        self.created = created
        """Whether this handle's :meth:`Store.create_table` call created the table provisionally (a
        run aborting on it drops it again while nothing has committed to it)."""
        self.pin = pin
        """For a handle :meth:`Store.pin` made of a table following a root: the commit_seq it pinned
        and its root's at the same point (0: the root had no commit, or no longer exists)."""

    def refresh(self) -> TableHead:
        head = self.store.catalog.load_head(self.name)
        if head is None:
            raise TableNotFound(self.name)
        self.head = head
        return head

    @property
    def primary_key(self) -> tuple[str, ...]:
        return self.head.primary_key

    @property
    def schema(self) -> pa.Schema | None:
        return schema_from_text(self.head.schema) if self.head.schema else None

    # --- writing --------------------------------------------------------------------------------

    def transaction(self, kind: str = "append", run_id: str | None = None,
                    meta: dict[str, Any] | None = None, record: bool = True,
                    own_schema: bool = False) -> RunTransaction:
        return RunTransaction(self, kind=kind, run_id=run_id, meta=meta, record=record, own_schema=own_schema)

    def append(self, data: Any, *, run_id: str | None = None, cursor: tuple[str, Any] | None = None,
               meta: dict[str, Any] | None = None) -> CommitResult:
        """Land ``data`` as one run appended to the table."""
        return self._run("append", data, run_id, cursor, meta)

    def replace(self, data: Any, *, run_id: str | None = None, cursor: tuple[str, Any] | None = None,
                meta: dict[str, Any] | None = None) -> CommitResult:
        """Land ``data`` as one run that replaces every row the table answers."""
        return self._run("replace", data, run_id, cursor, meta)

    def declare_order_by(self, column: str) -> int | None:
        """Merge keys by ``column`` from a new commit on; return its commit_seq (None when the table
        already declares one: the first declaration stays).

        Snapshots below the declaration answer as before. From it on, the rows committed before it
        count only through each key's commit-order winner, which competes with later rows by
        ``column`` (docs/store.md); a fold therefore never needs a row it dropped.
        """
        head = self.refresh()
        if not head.primary_key:
            raise ValueError(f"table {self.name!r} has no primary key to merge by {column!r}")
        if head.supersede is not None:
            raise TableNameInvalid(self.name, f"declares a supersede rule; its rows merge by commit order,"
                                              f" never by {column!r}")
        if head.order_by is not None:
            return None
        return self._declare(DeclareOrderBy(head.primary_key, column), "DeclareOrderBy")

    def declare_follows(self, rule: Follows) -> int | None:
        """Answer only rows whose root row version ``rule.root`` answers from a new commit on
        (``storage.follows``); return its commit_seq (None when the table already declares it).

        Snapshots below the declaration answer as before. Another rule held already raises
        ``TableNameInvalid`` naming both.
        """
        head = self.refresh()
        if not head.primary_key:
            raise TableNameInvalid(self.name, f"{rule.describe()} needs a primary key")
        if head.follows is None:
            seq = self._declare(DeclareFollows(rule), "DeclareFollows")
            if seq is not None:
                return seq
        if self.head.follows != rule:
            assert self.head.follows is not None
            raise TableNameInvalid(self.name, f"the existing table holds {self.head.follows.describe()},"
                                              f" not {rule.describe()}")
        return None

    def _declare(self, update: Update, name: str) -> int | None:
        """Commit the declaration ``update``; None when another one landed first (``name`` failed)."""
        check_reach(self.store.reach, "write", self.name)
        head = self.head
        request = CommitRequest(table=self.name, run_id="declare-" + new_run_id(), kind="declare", manifest=None,
                                requirements=(AssertTableUUID(head.uuid),), updates=(update,))
        try:
            seq = self.store.catalog.commit(request, self.store.clock)
        except CommitConflict as exc:
            if exc.failed != name:
                raise
            self.refresh()
            return None
        self.refresh()
        return seq

    def _run(self, kind: str, data: Any, run_id: str | None, cursor: tuple[str, Any] | None,
             meta: dict[str, Any] | None) -> CommitResult:
        txn = self.transaction(kind, run_id=run_id, meta=meta)
        try:
            txn.stage(data)
            if cursor is not None:
                txn.set_cursor(*cursor)
            return txn.commit()
        except BaseException:
            txn.abort()
            raise

    # --- history --------------------------------------------------------------------------------

    def commits(self) -> list[CommitRow]:
        return self.store.catalog.commits(self.name)

    def manifest(self, run_id: str) -> RunManifest:
        return read_manifest(self.store.catalog, self.store.objects, self.name, run_id)

    def cursor(self, scope: str) -> tuple[Any, int] | None:
        """The committed position of ``scope`` at the head and the commit_seq that landed it
        (``storage.cursors.resolve_cursor`` resolves one at an earlier snapshot)."""
        return self.store.catalog.cursor(self.name, scope)

    # --- reading --------------------------------------------------------------------------------

    def resolve_seq(self, commit_seq: int | None = None, as_of: datetime | int | None = None) -> int:
        head = self.refresh()
        if commit_seq is not None and as_of is not None:
            raise ValueError("pass commit_seq or as_of, not both")
        if as_of is not None:
            as_of_us = to_us(as_of) if isinstance(as_of, datetime) else int(as_of)
            seq = self.store.catalog.seq_as_of(self.name, as_of_us)
            if seq is None:
                raise SnapshotNotFound(self.name, f"as of {as_of} (no commit landed by then)")
            return seq
        if commit_seq is None:
            return head.commit_seq
        if not 0 <= commit_seq <= head.commit_seq:
            raise SnapshotNotFound(self.name, f"at commit_seq {commit_seq} (head is {head.commit_seq})")
        return commit_seq

    def snapshot(self, commit_seq: int | None = None, as_of: datetime | int | None = None) -> Snapshot:
        """The snapshot at the head, at ``commit_seq`` or ``as_of`` a transaction time.

        A table following a root (``storage.follows``) reads its root at the same point: at the head,
        both heads read in one catalog statement; ``as_of``, the root as of that instant; at a
        ``commit_seq``, the root as of that commit's time.
        """
        follows = self.refresh().follows
        if follows is None:
            return self.snapshot_at(self.resolve_seq(commit_seq, as_of))
        if commit_seq is None and as_of is None:
            pinned = self.store.catalog.pin_heads([self.name, follows.root])
            if self.name not in pinned:
                raise TableNotFound(self.name)
            self.head = pinned[self.name].head
            root = pinned.get(follows.root)
            seq = self.head.commit_seq
            return self.snapshot_at(seq, root_seq=(root.commit_seq or 0) if root is not None else 0)
        seq = self.resolve_seq(commit_seq, as_of)
        if as_of is None:
            return self.snapshot_at(seq)
        as_of_us = to_us(as_of) if isinstance(as_of, datetime) else int(as_of)
        return self.snapshot_at(seq, root_seq=self.store.catalog.seq_as_of(follows.root, as_of_us) or 0)

    def snapshot_at(self, seq: int, root_seq: int | None = None) -> Snapshot:
        """The snapshot at ``seq`` (at most the head this table last read; not checked again).

        For a table following a root, ``root_seq`` is the root's commit at the same point (0: the
        root had none); when not given, the one :meth:`Store.pin` pinned with ``seq``, else the
        root's newest commit at or before the time commit ``seq`` landed. Reading is within the
        store handle's reach (``storage.reach``) or ReachRefused.
        """
        check_reach(self.store.reach, "read", self.name)
        return self._snapshot_at(seq, root_seq)

    def _snapshot_at(self, seq: int, root_seq: int | None = None) -> Snapshot:
        catalog = self.store.catalog
        schema_id, schema = self._schema_at(seq)
        parts = catalog.live_parts(self.name, seq)
        for part in parts:
            if part.collected_us is not None:
                raise SnapshotCollected(self.name, seq, part.path)
        head = self.head
        follows = head.follows if head.follows is not None and seq >= head.follows_seq else None
        return Snapshot(
            table=self.name,
            commit_seq=seq,
            schema=schema,
            primary_key=self.primary_key,
            order_by=head.order_by_at(seq),
            order_by_seq=head.order_by_seq,
            parts=tuple(parts),
            uris=tuple(self.store.objects.uri(p.path) for p in parts),
            mixed_schemas=any(p.schema_id != schema_id for p in parts),
            schema_id=schema_id,
            supersede=head.supersede,
            follows=follows,
            root=self._root_snapshot(follows, seq, root_seq) if follows is not None else None,
        )

    def schema_at(self, seq: int) -> pa.Schema | None:
        """The table's schema at commit ``seq`` (None before its first): what a snapshot there
        answers, asked of the catalog alone (its parts may be gone)."""
        return self._schema_at(seq)[1]

    def _schema_at(self, seq: int) -> tuple[int, pa.Schema | None]:
        catalog = self.store.catalog
        schema_id = catalog.schema_id_at(self.name, seq) if seq else 0
        return schema_id, schema_from_text(catalog.schema_at(self.name, schema_id)) if schema_id else None

    def _root_snapshot(self, follows: Follows, seq: int, root_seq: int | None) -> Snapshot | None:
        """The root's snapshot at the point this table is read at ``seq`` (None: it answers no row)."""
        catalog = self.store.catalog
        if root_seq is None and self.pin is not None and self.pin[0] == seq:
            root_seq = self.pin[1]
        if root_seq is None:
            landed = catalog.committed_us(self.name, seq) if seq else None
            root_seq = (catalog.seq_as_of(follows.root, landed) or 0) if landed is not None else 0
        head = catalog.load_head(follows.root)
        if head is None or not root_seq:
            return None
        # the root's row versions filter this table's answer: reading this table is what was admitted
        return Table(self.store, head)._snapshot_at(root_seq)

    def to_arrow(self, commit_seq: int | None = None, as_of: datetime | int | None = None) -> pa.Table:
        """Every row the snapshot answers, in the table's Arrow schema."""
        snap = self.snapshot(commit_seq, as_of)
        con = self.store.duckdb()
        try:
            sql = snapshot_sql(snap, con)
            if sql is None:
                return (snap.schema or pa.schema([])).empty_table()
            result = con.sql(sql).to_arrow_table()
        finally:
            con.close()
        assert snap.schema is not None
        return conform(result, snap.schema, self.name)

    def count(self, commit_seq: int | None = None, as_of: datetime | int | None = None) -> int:
        snap = self.snapshot(commit_seq, as_of)
        if not snap.primary_key:
            return snap.rows_stored
        con = self.store.duckdb()
        try:
            sql = snapshot_sql(snap, con)
            if sql is None:
                return 0
            row = con.execute(f"SELECT count(*) FROM ({sql})").fetchone()
            return int(row[0]) if row else 0
        finally:
            con.close()
