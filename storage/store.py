"""The store: a root of immutable objects plus the catalog that publishes them.

``Store.open(root)`` binds an object root (a path or fsspec URL) to its catalog: the SQLite file
``<root>/catalog.sqlite`` for a local root under the ``local`` profile (the default), or the PostgreSQL
catalog under ``CONTEXTFUL_STORAGE_PROFILE=postgres``, or D1's under ``cloudflare-d1`` (the root
then the working copy of the corpus in R2, ``storage.d1.profile``). ``store.json`` at the root names the store's
uuid; a catalog bound to another store refuses to serve it.

Layout under the root (docs/store.md)::

    store.json
    catalog.sqlite                       (local profile, local root)
    tables/<table>/parts/<run id>-<n>.parquet
    tables/<table>/runs/<run id>.json    run manifests over 64 KiB (smaller ones ride in their commits)
    blobs/<aa>/<sha256>                  content-addressed blobs
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self

from contextful.storage.awakeables import AwakeableStore, awakeable_store_beside
from contextful.storage.blobs import BlobStore, open_blob_store
from contextful.storage.blobs.files import FileBlobStore
from contextful.storage.catalog import Catalog, PinnedHead, open_catalog, storage_profile
from contextful.storage.clock import Clock, SystemClock, to_us
from contextful.storage.collect import CollectResult, collect
from contextful.storage.container import ContainerBindings, admit, container_bindings, require_corpus_state
from contextful.storage.corpus import CorpusMirror, corpus_objects
from contextful.storage.duck import connect
from contextful.storage.errors import (
    CatalogPathMissing,
    CommitConflict,
    StoreFormatNewer,
    StoreNotFound,
    TableNameInvalid,
    TableNotFound,
)
from contextful.storage.fold import FoldResult, fold_table
from contextful.storage.follows import Follows
from contextful.storage.journal import JournalStore, open_journal_store
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import INLINE_MANIFEST_BYTES, table_prefix
from contextful.storage.objects import ObjectStore
from contextful.storage.outbox import OutboxStore, open_outbox_store
from contextful.storage.reach import Reach, check_reach, readable
from contextful.storage.reserved import RESERVED_TABLES, check_table_name
from contextful.storage.run_record import RunRecord
from contextful.storage.snapshot import Snapshot
from contextful.storage.supersede import Supersede
from contextful.storage.table import Table
from contextful.storage.transaction import CommitResult

if TYPE_CHECKING:
    import duckdb
    from contextful.storage.d1.client import D1Binding
else:
    duckdb = lazy_module("duckdb")

log = logging.getLogger(__name__)

STORE_FORMAT = 2
"""The store format this build writes and the newest it opens (docs/store.md, "Store format"): 2 keeps
a small run's manifest in its commit's catalog row; a format-1 store keeps every manifest an object."""
DEFAULT_STORE = os.path.join(".contextful", "store")


@dataclass(frozen=True)
class DropResult:
    table: str
    uuid: str
    commit_seq: int
    """The head the dropped table was at."""
    objects: int
    """Objects of the table listed for deletion."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def write_threads() -> int:
    """``CONTEXTFUL_WRITE_THREADS``, default the CPU count up to 4 (0 writes parts inline)."""
    raw = os.environ.get("CONTEXTFUL_WRITE_THREADS")
    if raw is not None and raw.strip().isdigit():
        return int(raw)
    return min(4, os.cpu_count() or 1)


_CREATE_ATTEMPTS = 5


class Store:
    container: ContainerBindings | None = None
    """The container profile's bindings when the store opened under it (``storage.container``)."""
    d1: D1Binding | None = None
    """The D1 profile's Worker binding when the store opened under it (``storage.d1.profile``)."""
    reach: Reach | None = None
    """The tables this handle may read and write when it opened under a credential (``storage.reach``;
    None: every table)."""

    def __init__(self, objects: ObjectStore, catalog: Catalog, clock: Clock, store_uuid: str,
                 durable: bool = True) -> None:
        self.objects = objects
        self.catalog = catalog
        self.clock = clock
        self.uuid = store_uuid
        self.durable = durable
        self.runs = RunRecord(self)
        self._closed = False
        self._blobs: BlobStore | None = None
        self._journal: JournalStore | None = None
        self._awakeables: AwakeableStore | None = None
        self._outbox: OutboxStore | None = None
        self.write_threads = write_threads()
        """Parts one run writes behind its caller at once (``CONTEXTFUL_WRITE_THREADS``; 0: write inline)."""
        self.inline_manifest_bytes = INLINE_MANIFEST_BYTES
        """A run manifest of at most this many bytes rides in its commit's catalog row; a larger one
        is an object of its own (``storage.manifest``; 0: every manifest is an object)."""
        self._writers: ThreadPoolExecutor | None = None
        self._writers_lock = threading.Lock()
        self._duck: duckdb.DuckDBPyConnection | None = None

    def writer_pool(self) -> ThreadPoolExecutor | None:
        """The threads runs write their parts on (a local store only; None: write inline)."""
        if self.write_threads < 1 or not self.objects.is_local:
            return None
        with self._writers_lock:
            if self._writers is None:
                self._writers = ThreadPoolExecutor(self.write_threads, thread_name_prefix="part-writer")
            return self._writers

    @property
    def blobs(self) -> BlobStore:
        """The blob store: the execution database's ``cf_blobs`` under the container profile (a
        recorded value and the blob it names share one home and one backup), R2 beside a D1 catalog
        (``storage.d1.blobs``), else ``blobs/`` under the root."""
        if self._blobs is None:
            from contextful.storage.catalog.postgres import PostgresCatalog
            from contextful.storage.d1.catalog import D1Catalog

            if self.container is not None and isinstance(self.catalog, PostgresCatalog):
                self._blobs = open_blob_store("postgres", dsn=self.catalog.dsn, schema=self.catalog.schema)
            elif isinstance(self.catalog, D1Catalog):  # the D1 profile: R2 content, D1 references
                from contextful.storage.d1.blobs import D1BlobStore

                self._blobs = D1BlobStore(self.catalog.client)
            else:
                self._blobs = FileBlobStore(self.objects)
        return self._blobs

    @property
    def outbox(self) -> OutboxStore:
        """The exporters' outbox in the execution database (``storage.outbox``); a profile without
        one raises ``StorageCapabilityMissing``. Under the container profile, admitted first."""
        if self._outbox is None:
            from contextful.storage.catalog.postgres import PostgresCatalog
            from contextful.storage.d1.catalog import D1Catalog

            self._admit()
            if isinstance(self.catalog, PostgresCatalog):
                self._outbox = open_outbox_store("postgres", dsn=self.catalog.dsn, schema=self.catalog.schema)
            elif isinstance(self.catalog, D1Catalog):
                from contextful.storage.d1.outbox import D1OutboxStore

                self._outbox = D1OutboxStore(self.catalog.client)
            else:
                self._outbox = open_outbox_store(self.catalog.backend)
        return self._outbox

    @property
    def journal(self) -> JournalStore:
        """The journal store beside this store's catalog: the same SQLite file or PostgreSQL schema
        (one transactional home for owners, journal rows and table heads). Under the container
        profile the execution is admitted first (``storage.container.admit``)."""
        if self._journal is None:
            from contextful.storage.catalog.postgres import PostgresCatalog
            from contextful.storage.catalog.sqlite import SqliteCatalog
            from contextful.storage.d1.catalog import D1Catalog

            self._admit()
            if isinstance(self.catalog, SqliteCatalog):
                self._journal = open_journal_store("sqlite", path=self.catalog.path)
            elif isinstance(self.catalog, PostgresCatalog):
                self._journal = open_journal_store("postgres", dsn=self.catalog.dsn, schema=self.catalog.schema)
            elif isinstance(self.catalog, D1Catalog):
                from contextful.storage.d1.journal import D1JournalStore

                self._journal = D1JournalStore(self.catalog.client)
            else:
                raise ValueError(f"no journal store for a {type(self.catalog).__name__} catalog")
        return self._journal

    def _admit(self) -> None:
        """Admit an execution under the container or D1 profile (their recovery identity), or raise."""
        if self.container is not None:
            admit(self)
        elif self.d1 is not None:
            from contextful.storage.d1.recovery import admit as admit_d1

            admit_d1(self)

    @property
    def awakeables(self) -> AwakeableStore:
        """The awakeable store beside :attr:`journal`: the same SQLite file or PostgreSQL schema."""
        if self._awakeables is None:
            self._awakeables = awakeable_store_beside(self.journal)
        return self._awakeables

    @classmethod
    def open(cls, root: str | os.PathLike[str] = DEFAULT_STORE, *, catalog: Catalog | None = None,
             profile: str | None = None, catalog_path: str | None = None, clock: Clock | None = None,
             storage_options: dict[str, Any] | None = None, durable: bool = True, create: bool = True,
             reach: Reach | None = None) -> Store:
        """Open the store at ``root``, creating it when new unless ``create`` is False.

        ``catalog`` overrides the profile's catalog; ``catalog_path`` places the local profile's
        SQLite file (required when the root is remote: ``CatalogPathMissing`` otherwise). ``reach``
        limits the handle to the tables a credential reaches (``storage.reach``). With
        ``create=False`` (a reader or maintainer) nothing is written: a root without ``store.json``,
        or a local profile without its catalog file, raises ``StoreNotFound`` naming it.
        """
        owned = catalog is None
        # The D1 profile's Worker binding, or StorageCapabilityMissing before anything is made.
        binding = None
        if owned and storage_profile(profile) == "cloudflare-d1":
            from contextful.storage.d1.profile import d1_binding

            binding = d1_binding()
        objects = ObjectStore(str(root), storage_options, create=create)
        container = None
        if owned and storage_profile(profile) == "postgres":
            container = container_bindings(objects.is_local, objects.url)
            if container.bucket is not None and objects.is_local:  # the root is the bucket's working copy
                objects = corpus_objects(objects.root, container.bucket, create=create)
        if binding is not None and objects.is_local:  # the root is the working copy of the corpus in R2
            from contextful.storage.d1.profile import d1_corpus

            objects = d1_corpus(objects.root, binding, create=create)
        if owned and storage_profile(profile) == "local":
            if catalog_path is None and not objects.is_local:
                raise CatalogPathMissing(objects.url)
            catalog_path = catalog_path or os.path.join(objects.root, "catalog.sqlite")
        if not create:
            _require_existing(objects, catalog_path if owned else None)
        if catalog is None:
            catalog = open_catalog(profile, sqlite_path=catalog_path)
        try:
            if container is not None:
                require_corpus_state(objects.remote if isinstance(objects, CorpusMirror) else objects, catalog)
            elif binding is not None and isinstance(objects, CorpusMirror):
                from contextful.storage.d1.profile import require_d1_corpus_state

                require_d1_corpus_state(objects, catalog)
            store_uuid, store_format = _store_doc(objects)
            catalog.bind_store(store_uuid, objects.url)
        except BaseException:
            if owned:
                catalog.close()
            raise
        store = cls(objects, catalog, clock or SystemClock(), store_uuid, durable)
        if store_format < 2:  # an older build reads this store: its manifests stay objects it can read
            store.inline_manifest_bytes = 0
        store.container = container
        store.d1 = binding
        store.reach = reach
        return store

    def close(self) -> None:
        """Close the catalog, first flushing the run-record cache if this handle recorded runs."""
        if self._closed:
            return
        self._closed = True
        if self.runs.wrote:
            self.runs.flush_quietly()
        if self._journal is not None:
            self._journal.close_store()
        if self._awakeables is not None:
            self._awakeables.close_store()
        if self._blobs is not None:
            self._blobs.close()
        if self._outbox is not None:
            self._outbox.close()
        self.catalog.close()
        if self._writers is not None:  # after the record's flush, which writes a part too
            self._writers.shutdown(wait=True)
        if self._duck is not None:
            self._duck.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- tables ---------------------------------------------------------------------------------

    def table_names(self, include_reserved: bool = False) -> list[str]:
        names = [h.name for h in self.catalog.list_heads()]
        return names if include_reserved else [n for n in names if n not in RESERVED_TABLES]

    def table(self, name: str) -> Table:
        head = self.catalog.load_head(name)
        if head is None:
            raise TableNotFound(name)
        return Table(self, head)

    def create_table(self, name: str, primary_key: tuple[str, ...] | list[str] = (),
                     order_by: str | None = None, *, provisional: bool = False,
                     supersede: Supersede | None = None, follows: Follows | None = None,
                     declared: Mapping[str, str] | None = None) -> Table:
        """Create ``name`` (or return it when it exists; its primary key is fixed at creation).

        ``provisional``: the table is created only for the run about to land on it (a load, a
        pipeline's or a model's first run, :meth:`append`), so when this call created it, the
        first of its runs to abort drops it again while nothing committed to it
        (:meth:`RunTransaction.abort`): a failed first run leaves no table. A table created on
        purpose (the default) stays, empty, whatever its runs do.

        ``declared`` is what else the creator declares of the table (a pipeline's ``normalize``), kept
        with its head as it was first declared (``TableHead.declared``).

        ``order_by`` names the column whose larger value wins a primary-key merge (docs/store.md);
        a keyed table created without one takes it the first time one is declared, by a commit of
        its own (:meth:`Table.declare_order_by`: earlier snapshots answer as before), and keeps it.

        ``supersede`` (``storage.supersede``, a derive output table's rule) is declared with the table
        and kept: its unit and key columns must be primary-key columns (so a key merge never joins
        two units), and it takes no ``order_by``. A table created without one keeps none. Asking
        for a rule on an existing table that holds another rule, or none, raises
        ``TableNameInvalid`` naming both (the table is not changed); asking for none returns the
        table as it is.

        ``follows`` (``storage.follows``, a relational child table's lifetime rule) names the root
        table whose row versions the table's rows follow; it needs a primary key. A keyed table
        created without one takes it the first time one is asked for, by a commit of its own
        (:meth:`Table.declare_follows`: earlier snapshots answer as before), and keeps it; asking
        for another one raises ``TableNameInvalid`` naming both.
        """
        check_table_name(name)
        check_reach(self.reach, "write", name)
        key = tuple(primary_key)
        if supersede is not None:
            _check_supersede(name, key, order_by, supersede)
        if follows is not None and not key:
            raise TableNameInvalid(name, f"{follows.describe()} needs a primary key")
        table = self._create(name, key, order_by, provisional, supersede, follows, declared)
        if supersede is not None and table.head.supersede != supersede:
            held = table.head.supersede.describe() if table.head.supersede is not None else "no supersede rule"
            raise TableNameInvalid(name, f"the existing table holds {held}, not {supersede.describe()}"
                                         " (a rule is declared only when the table is created)")
        if order_by is not None and table.head.order_by is None and table.primary_key:
            table.declare_order_by(order_by)
        if follows is not None and table.head.follows != follows:
            table.declare_follows(follows)
        return table

    def reserved_table(self, name: str, primary_key: tuple[str, ...]) -> Table:
        check_table_name(name, reserved_ok=True)
        return self._create(name, primary_key)

    def _create(self, name: str, primary_key: tuple[str, ...], order_by: str | None = None,
                provisional: bool = False, supersede: Supersede | None = None,
                follows: Follows | None = None, declared: Mapping[str, str] | None = None) -> Table:
        for _ in range(_CREATE_ATTEMPTS):  # another writer may create (or drop) it meanwhile
            head = self.catalog.load_head(name)
            if head is not None:
                return Table(self, head)
            twin = next((h.name for h in self.catalog.list_heads()
                         if h.name != name and h.name.lower() == name.lower()), None)
            if twin is not None:  # DuckDB compares names case-insensitively: the views would be one
                raise TableNameInvalid(name, f"differs only in case from the table {twin!r}")
            uuid = str(uuidlib.uuid4())
            head = self.catalog.create_table(name, uuid, primary_key, self.clock.now_us(),
                                             order_by if primary_key else None, supersede, follows,
                                             tuple(sorted((declared or {}).items())))
            if head is not None:
                return Table(self, head, created=provisional and head.uuid == uuid)
        raise CommitConflict(name, f"the table was created and dropped again {_CREATE_ATTEMPTS} times"
                                   " while this writer tried to create it")

    def drop_table(self, name: str) -> DropResult:
        """Drop the user table ``name``: one catalog transaction forgets it whole (readers see it or
        nothing), then its objects are deleted. Only the objects listed before that transaction go,
        so a table created again under the name meanwhile keeps its own; what a run still in flight
        writes afterwards, or a failed delete leaves, is an orphan for collection."""
        check_table_name(name)
        check_reach(self.reach, "write", name)
        head = self.catalog.load_head(name)
        if head is None:
            raise TableNotFound(name)
        listed = [o.key for o in self.objects.list(table_prefix(name))]
        self.catalog.drop_table(name, head.uuid)
        after = self.catalog.load_head(name)
        if after is not None and after.uuid == head.uuid:  # the drop could not tell, and did not land
            raise CommitConflict(name, "the table was still there after its drop")
        try:
            self.objects.delete(listed)
        except OSError as exc:  # the table is gone already; collection removes what is left
            log.warning("drop of table %s left objects behind: %s", name, exc)
        return DropResult(name, head.uuid, head.commit_seq, len(listed))

    def append(self, name: str, data: Any, *, primary_key: tuple[str, ...] | list[str] = (),
               **kwargs: Any) -> CommitResult:
        """Append ``data`` to ``name`` as one run, creating the table on first use (a first append that
        fails leaves no table)."""
        return self.create_table(name, primary_key, provisional=True).append(data, **kwargs)

    # --- maintenance ----------------------------------------------------------------------------

    def fold(self, name: str, **kwargs: Any) -> FoldResult | None:
        check_reach(self.reach, "write", name)
        return fold_table(self, name, **kwargs)

    def collect(self, **kwargs: Any) -> CollectResult:
        return collect(self, **kwargs)

    # --- reading --------------------------------------------------------------------------------

    def pin(self, names: Sequence[str] | None = None, as_of: datetime | int | None = None) -> dict[str, tuple[Table, int]]:
        """Tables ``names`` (None: every table, reserved ones included), each with the commit_seq
        it is pinned at, all pinned at one point.

        Every table's head — or, with ``as_of``, its newest commit at or before that transaction
        time — is read in one catalog statement, so no commit lands between two tables' pins: a
        reader of a relational root and its child tables, or a model build over several inputs,
        sees each commit whole (``table.snapshot_at(seq)`` then reads each). A table with no commit
        by ``as_of`` is left out; a name that is no table raises TableNotFound. Under a reach
        (``storage.reach``) a named table it does not read is ReachRefused, and every table means
        every table it reads.
        """
        pinned, _ = self.pin_with_unborn(names, as_of)
        return pinned

    def pin_with_unborn(self, names: Sequence[str] | None = None, as_of: datetime | int | None = None
                        ) -> tuple[dict[str, tuple[Table, int]], dict[str, Table]]:
        """:meth:`pin`, and apart, read at the same point, the tables with no commit by ``as_of``
        (a reader answers ``SnapshotNotFound`` for them, not "no such table")."""
        as_of_us = None if as_of is None else to_us(as_of) if isinstance(as_of, datetime) else int(as_of)
        for name in names or ():
            check_reach(self.reach, "read", name)
        pinned = self.catalog.pin_heads(names, as_of_us)
        if names is None and self.reach is not None:
            pinned = {name: pinned[name] for name in readable(self.reach, pinned)}
        roots = {p.head.follows.root for p in pinned.values() if p.head.follows is not None}
        if names is not None and roots - set(pinned):  # pinned again with their roots: one point for all
            pinned = self.catalog.pin_heads([*names, *roots], as_of_us)
        for name in names or ():
            if name not in pinned:
                raise TableNotFound(name)
        wanted = pinned if names is None else {name: pinned[name] for name in names}

        def handle(p: PinnedHead) -> Table:
            follows = p.head.follows
            if follows is None or p.commit_seq is None:
                return Table(self, p.head)
            root = pinned.get(follows.root)
            return Table(self, p.head, pin=(p.commit_seq, (root.commit_seq or 0) if root is not None else 0))

        return ({name: (handle(p), p.commit_seq) for name, p in wanted.items() if p.commit_seq is not None},
                {name: Table(self, p.head) for name, p in wanted.items() if p.commit_seq is None})

    def snapshots(self, names: Sequence[str] | None = None, as_of: datetime | int | None = None) -> dict[str, Snapshot]:
        """The snapshots of :meth:`pin`: every table pinned at one point."""
        return {name: table.snapshot_at(seq) for name, (table, seq) in self.pin(names, as_of).items()}

    def maintenance_duckdb(self) -> duckdb.DuckDBPyConnection:
        """A connection (a cursor, closed by the caller) to this handle's own in-memory DuckDB
        database, for folds: opening a database costs tens of milliseconds, a cursor next to
        nothing, and a fold after every few commits (``storage.compaction``) must stay cheap.
        Cursors are separate connections: each fold's temporary tables are its own."""
        with self._writers_lock:
            if self._duck is None:
                self._duck = connect(self.objects)
            return self._duck.cursor()

    def duckdb(self, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
        """A DuckDB connection able to read this store's parts."""
        return connect(self.objects, database)


def _check_supersede(name: str, primary_key: tuple[str, ...], order_by: str | None, rule: Supersede) -> None:
    """Refuse a supersede rule the key merge could break: a unit or key column outside the primary
    key would let one key's rows span units, and ``order_by`` would reorder landings."""
    outside = [c for c in (*rule.unit, rule.key) if c not in primary_key]
    if outside:
        raise TableNameInvalid(name, f"{rule.describe()} names {', '.join(outside)}, not in its primary key"
                                     f" ({', '.join(primary_key) or 'none'})")
    if order_by is not None:
        raise TableNameInvalid(name, f"{rule.describe()} merges by commit order; it takes no order_by ({order_by!r})")


def _require_existing(objects: ObjectStore, sqlite_path: str | None) -> None:
    """Raise ``StoreNotFound`` unless the store at ``objects`` (and its SQLite catalog file) exists."""
    if not objects.exists("store.json"):
        raise StoreNotFound(objects.url, "no store.json there")
    if sqlite_path is not None and not sqlite_path.startswith("file:") and not os.path.isfile(sqlite_path):
        raise StoreNotFound(objects.url, f"its catalog file {sqlite_path} is missing")


def _store_doc(objects: ObjectStore) -> tuple[str, int]:
    """The store's uuid and format, ``store.json`` written first when the root has none; a format
    newer than this build's is refused before anything is written to the store."""
    doc = {"format": STORE_FORMAT, "store_uuid": str(uuidlib.uuid4())}
    objects.put_if_absent("store.json", json.dumps(doc).encode("utf-8"))
    found = json.loads(objects.get_bytes("store.json"))
    store_format = int(found.get("format", 1))
    if store_format > STORE_FORMAT:
        raise StoreFormatNewer(objects.url, store_format, STORE_FORMAT)
    return str(found["store_uuid"]), store_format
