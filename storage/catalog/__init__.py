"""The catalog port: table heads, the commit log, the live-part index, cursors and the run-record
cache, behind one linearizable commit.

Adapters sit beside this module — ``sqlite`` (the embedded default, WAL) and ``postgres``
(``CONTEXTFUL_STORAGE_PROFILE=postgres``) — and share their SQL through ``sql``. :func:`open_catalog`
picks the adapter by profile. A backend whose conditional write is not linearizable refuses to
open with ``ConditionalWriteUnsupported`` (``surface.apply.weak-conditional-backend``).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from contextful.storage.clock import Clock
from contextful.storage.commits import CommitRequest
from contextful.storage.errors import CatalogDsnMissing, StorageProfileUnknown
from contextful.storage.follows import Follows
from contextful.storage.supersede import Supersede

PROFILES = ("local", "postgres", "cloudflare-d1")
"""The storage profiles, by their ``CONTEXTFUL_STORAGE_PROFILE`` value: ``local`` (the default: a
SQLite catalog file), ``postgres`` (the container profile: the catalog in PostgreSQL) and
``cloudflare-d1`` (the D1 profile: the catalog in D1 through the Worker, ``storage.d1.profile``)."""
LIBPQ_SERVER_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGSERVICE")
"""libpq's variables naming a server: with one set, an empty DSN connects where it says."""


@dataclass(frozen=True)
class TableHead:
    name: str
    uuid: str
    commit_seq: int
    schema_id: int
    schema: str | None
    """Serialized Arrow schema at the head (None before the first commit lands rows)."""
    primary_key: tuple[str, ...]
    created_us: int
    last_commit_us: int
    order_by: str | None = None
    """The column whose larger value wins a primary-key merge (None: the later commit wins)."""
    order_by_seq: int = 0
    """The commit that declared ``order_by`` (0: declared with the table, in force from its start)."""
    supersede: Supersede | None = None
    """The supersede rule declared with the table (``storage.supersede``; None: none)."""
    follows: Follows | None = None
    """The root table whose row versions this table's rows follow (``storage.follows``; None: none)."""
    follows_seq: int = 0
    """The commit that declared ``follows`` (0: declared with the table, in force from its start)."""
    declared: tuple[tuple[str, str], ...] = ()
    """What its creator declared of the table beside its merge (``("normalize", "relational")``,
    sorted by name), kept as declared; the engine compares a manifest with it (``engine.land.declaration``)."""

    def order_by_at(self, commit_seq: int) -> str | None:
        """The ``order_by`` in force at ``commit_seq`` (None: none was declared by then)."""
        return self.order_by if self.order_by is not None and commit_seq >= self.order_by_seq else None


@dataclass(frozen=True)
class PinnedHead:
    """A table's head and the commit a reader pins it at, read with every other table's at one point."""

    head: TableHead
    commit_seq: int | None
    """The head's commit_seq, or the newest commit at or before the instant asked (None: none was)."""


@dataclass(frozen=True)
class CommitRow:
    table: str
    commit_seq: int
    run_id: str
    kind: str
    manifest: str | None
    committed_us: int
    rows: int


@dataclass(frozen=True)
class PartRow:
    path: str
    rows: int
    bytes: int
    added_seq: int
    removed_seq: int | None
    ord_seq: int
    ord_idx: int
    collected_us: int | None
    schema_id: int
    """The table schema the part was written under (its adding commit's)."""


@dataclass(frozen=True)
class RunRecordRow:
    run_id: str
    phase: str
    table: str
    payload: dict[str, Any]
    recorded_us: int


@dataclass(frozen=True)
class StagingRow:
    """A run staging parts that has not committed or given up yet: collection keeps its objects."""

    run_id: str
    holder: str
    """The staging process's holder id (``storage.holders``: host, pid, boot, PID namespace, start)."""
    started_us: int
    expires_us: int
    """The lease: past it (or once its holder is provably dead) the run counts as abandoned."""


@dataclass(frozen=True)
class CadenceHolder:
    """Who holds a deployment's cadence lease (``surface.dispatch.lease-gated``) and until when."""

    deployment: str
    holder: str
    """The holding serve process's holder id (``storage.holders``)."""
    acquired_us: int
    expires_us: int


@dataclass(frozen=True)
class DraftRow:
    """A project's saved draft of its control document (``engine.control.drafts``)."""

    project: str
    draft_id: str
    version: int
    """The applied version the draft edits."""
    operator: str
    """The verified operator who saved it."""
    nonce: str
    """A random nonce the draft was saved under."""
    saved_us: int
    document: str
    """The document's TOML text, without a ``[snapshot]`` table."""
    snapshot: str | None
    """The ``[snapshot]`` table kept from ``version``, as canonical JSON (None: that version holds none)."""
    digest: str
    """The SHA-256 of what was validated (``engine.control.drafts.draft_digest``)."""


@dataclass(frozen=True)
class ConnectionRow:
    """One tenant's connection as its last versioned claim left it (``engine.control.connection``)."""

    project: str
    connection_id: str
    version: int
    """Advanced by one by each claim, through a compare-and-swap on the standing version."""
    state: str
    """``active``, ``paused`` or ``retired``."""
    tenant: str
    principal: str
    pipeline: str
    """The id of the applied version's ``[[pipeline]]`` the connection instantiates."""
    selection: str
    """The tenant's source selection, as canonical JSON."""
    secret: str | None
    """The secret name the pipeline's ``${secret:NAME}`` resolves to; None once deleted (revoked)."""
    schedule: str
    declared: str
    """The SHA-256 of the declaration created (what an idempotent create compares)."""
    claimed_us: int
    """When the last claim was made."""


class Catalog(ABC):
    """What the store asks of its catalog. Every method is safe across processes."""

    backend: str
    profile: str
    """The ``CONTEXTFUL_STORAGE_PROFILE`` value that opens this catalog (:data:`PROFILES`): what
    every message names it by."""

    @property
    def journal_location(self) -> str | None:
        """The location of the journal store that lives in this catalog's database (its owner rows
        are what a commit's :class:`~contextful.storage.commits.AssertWriter` reads); None: none."""
        return None

    @abstractmethod
    def bind_store(self, store_uuid: str, root: str) -> None:
        """Record the store this catalog serves; refuse a catalog that serves another store."""

    @abstractmethod
    def create_table(self, name: str, uuid: str, primary_key: tuple[str, ...], now_us: int,
                     order_by: str | None = None, supersede: Supersede | None = None,
                     follows: Follows | None = None,
                     declared: tuple[tuple[str, str], ...] = ()) -> TableHead | None:
        """Create the table's head at commit_seq 0 with its merge declaration (key, ``order_by``,
        supersede rule, ``follows``) and what else its creator ``declared``, or return the existing head
        as it is (None when the existing one was a provisional table dropped again before it could be read)."""

    @abstractmethod
    def drop_table(self, name: str, uuid: str, at_seq: int | None = None) -> bool:
        """Forget the table ``name`` whole in one transaction — its head, commits, schemas, part index,
        cursors and staging rows — if its head is still the incarnation ``uuid`` (and, given
        ``at_seq``, still at that commit_seq); return whether this call dropped it. Readers see the
        table whole or not at all; its objects are the caller's to delete."""

    @abstractmethod
    def settings(self, keys: Sequence[str]) -> dict[str, str]:
        """The store settings among ``keys`` that are set (``storage.compaction`` keeps its policies here)."""

    @abstractmethod
    def put_setting(self, key: str, value: str | None) -> None:
        """Set the store setting ``key`` (None: remove it), for every process using the catalog."""

    @abstractmethod
    def load_head(self, name: str) -> TableHead | None: ...

    @abstractmethod
    def list_heads(self) -> list[TableHead]: ...

    @abstractmethod
    def pin_heads(self, names: Sequence[str] | None = None, as_of_us: int | None = None) -> dict[str, PinnedHead]:
        """The heads of ``names`` (None: every table), each pinned at its head commit or, with
        ``as_of_us``, at its newest commit at or before that instant — all read in one statement,
        so at one point: no commit lands between two tables' pins. Unknown names are left out."""

    def commit(self, request: CommitRequest, clock: Clock) -> int:
        """Check the requirements and apply the updates atomically; return the new commit_seq.

        Every outcome is known to the caller: a return means committed; CommitConflict (a
        requirement does not hold at the head) or any other catalogue error means not committed,
        so the caller may delete what it staged; CommitOutcomeUnknown means it could not be
        learned (the commit may have landed), so the caller deletes nothing. A run id commits at
        most once per table: the same request sent again after a lost answer returns the
        commit_seq it landed at. The commit's time is read from ``clock`` under the catalog's lock
        (see :meth:`commit_many`).
        """
        return self.commit_many([request], clock)[0]

    @abstractmethod
    def commit_many(self, requests: Sequence[CommitRequest], clock: Clock) -> list[int]:
        """Commit ``requests`` (at most one per table) in one transaction; return each one's commit_seq.

        Every table's requirements are checked before anything is applied, and every head
        advances, or none does; the outcomes are those of :meth:`commit`, for all of them at once.
        A request whose run id already landed on its table answers that commit_seq and lands
        nothing again. The commits share one time, read from ``clock`` once the catalog's lock is
        held and never earlier than the previous commit's time anywhere in the catalog, so a
        commit that waited for the lock is never timed before an instant already read.
        """

    @abstractmethod
    def reserve_instant(self, clock: Clock) -> int:
        """An instant of the catalog's transaction time, reserved: no earlier than every commit
        already landed anywhere in the catalog, and every later commit is stamped strictly after
        it. Read from ``clock`` under the catalog's commit clock (as a commit's time is), so a
        reader on a host whose clock runs behind the committers' still reads what landed before it
        asked, and a reader whose clock runs ahead does not read what lands after. A sweep freezes
        its ``as_of`` here (``engine.run.sweep``, ``run.sweep.frozen-as-of``)."""

    @abstractmethod
    def schema_at(self, name: str, schema_id: int) -> str: ...

    @abstractmethod
    def commits(self, name: str) -> list[CommitRow]: ...

    @abstractmethod
    def manifest_doc(self, name: str, run_id: str) -> str | None:
        """The manifest JSON the commit of ``run_id`` on ``name`` kept in the catalog (None: it kept
        none; its manifest, if any, is an object)."""

    @abstractmethod
    def committed_us(self, name: str, commit_seq: int) -> int | None:
        """When the table's commit ``commit_seq`` landed (None: no such commit); one indexed row."""

    @abstractmethod
    def first_commit_us(self, name: str) -> int | None:
        """When the table's first commit landed (None: none has); one indexed row, whatever its history."""

    def seq_as_of(self, name: str, as_of_us: int) -> int | None:
        """The newest commit_seq committed at or before ``as_of_us`` (None if none was)."""
        pinned = self.pin_heads([name], as_of_us).get(name)
        return pinned.commit_seq if pinned is not None else None

    @abstractmethod
    def schema_id_at(self, name: str, commit_seq: int) -> int: ...

    @abstractmethod
    def live_parts(self, name: str, commit_seq: int) -> list[PartRow]:
        """The parts a snapshot at ``commit_seq`` reads, in merge order."""

    @abstractmethod
    def all_parts(self, name: str) -> list[PartRow]:
        """Every part the catalog knows of for the table, live or removed."""

    @abstractmethod
    def mark_collected(self, name: str, paths: list[str], now_us: int) -> None:
        """Mark parts whose files collection deleted; snapshots reading them answer no more."""

    @abstractmethod
    def cursor(self, name: str, scope: str) -> tuple[Any, int] | None:
        """The committed cursor value for ``scope`` and the commit that wrote it."""

    @abstractmethod
    def begin_staging(self, name: str, run_id: str, holder: str, now_us: int, lease_us: int) -> None:
        """Register ``run_id`` as staging parts of table ``name`` (before its first part is written)."""

    @abstractmethod
    def open_run(self, name: str, run_id: str, holder: str, now_us: int, lease_us: int) -> TableHead:
        """Open a run on table ``name`` in one transaction: read its head and take the run's staging
        lease (as :meth:`begin_staging`). A table that does not exist raises TableNotFound and takes
        nothing. One round trip where two were (a one-row commit's opening, ``bench/README.md``)."""

    @abstractmethod
    def renew_staging(self, name: str, run_id: str, expires_us: int) -> bool:
        """Extend a staging run's lease; False when it is gone (collection ended it)."""

    @abstractmethod
    def end_staging(self, name: str, run_id: str, *, lapsed_at_us: int | None = None) -> None:
        """Forget a staging run that gave up (a commit forgets its own in the same transaction).
        With ``lapsed_at_us``, only if its lease still lapsed by then: a renewal that landed after
        collection read the lease keeps it (collection's read and delete are not one step)."""

    @abstractmethod
    def staging_runs(self, name: str) -> list[StagingRow]:
        """The runs registered as staging on table ``name``."""

    @abstractmethod
    def take_cadence(self, deployment: str, holder: str, now_us: int, lease_us: int) -> CadenceHolder:
        """Take or renew ``deployment``'s cadence lease for ``holder`` until ``now_us + lease_us``,
        when nobody else holds it unexpired (a holder provably dead holds nothing); answer who holds
        it now (``holder`` itself when taken)."""

    @abstractmethod
    def release_cadence(self, deployment: str, holder: str) -> None:
        """Give the cadence lease up, if ``holder`` still holds it."""

    @abstractmethod
    def cadence_holder(self, deployment: str) -> CadenceHolder | None:
        """The cadence lease's row as it stands (expired or not), None when nobody took it."""

    @abstractmethod
    def record_dispatch(self, deployment: str, entry: str, holder: str, now_us: int) -> bool:
        """Record that ``holder`` dispatches ``entry`` at ``now_us``, in one transaction with a check
        that it holds the cadence lease unexpired; False (nothing recorded) when it does not."""

    @abstractmethod
    def dispatches(self, deployment: str) -> dict[str, int]:
        """Each entry's last recorded dispatch instant."""

    @abstractmethod
    def save_draft(self, draft: DraftRow) -> None:
        """Save ``draft`` as its project's one draft, replacing the one saved before."""

    @abstractmethod
    def draft(self, project: str) -> DraftRow | None:
        """The project's saved draft (None: none)."""

    @abstractmethod
    def drop_draft(self, project: str, draft_id: str) -> bool:
        """Forget the project's draft if it is still ``draft_id``; whether this call forgot it."""

    @abstractmethod
    def claim_connection(self, row: ConnectionRow) -> bool:
        """Claim ``row`` as its connection's version ``row.version``: inserted when it is version 1
        and the id is free, else replacing version ``row.version - 1``; False (nothing written)
        when another claim got there first."""

    @abstractmethod
    def connection(self, project: str, connection_id: str) -> ConnectionRow | None:
        """The connection's record as its last claim left it (None: never created)."""

    @abstractmethod
    def connections(self, project: str) -> list[ConnectionRow]:
        """Every connection of the project (retired ones included), by id."""

    @abstractmethod
    def connections_mark(self, project: str) -> tuple[int, int]:
        """The project's connection count and the sum of their versions: one cheap read whose answer
        moves with every claim (each advances one version by one), so serve re-reads the records
        only when it moved."""

    @abstractmethod
    def accept_nonce(self, nonce: str, operator: str, now_us: int) -> bool:
        """Record ``nonce`` as accepted, once ever: False when it was accepted before."""

    @abstractmethod
    def record_run(self, run_id: str, phase: str, table: str, payload: dict[str, Any], now_us: int) -> None:
        """Write a run record to the cache outside any table commit (the plan row)."""

    @abstractmethod
    def pending_run_records(self, limit: int) -> list[RunRecordRow]: ...

    @abstractmethod
    def pending_run_summary(self) -> tuple[int, int | None]:
        """How many cached run records await a flush, and the oldest one's recorded_us."""

    @abstractmethod
    def pending_run_texts(self) -> list[tuple[str, str, str, str]]:
        """Every cached run record awaiting a flush as ``(run_id, phase, table, payload JSON text)``,
        oldest first (the read path turns them into rows in one columnar pass)."""

    @abstractmethod
    def run_records(self) -> list[RunRecordRow]:
        """Every cached run record, oldest first: the rows awaiting a flush (a flush removes the rows
        it appended to ``_runs`` from the cache, so the cache holds only what ``_runs`` does not)."""

    @abstractmethod
    def close(self) -> None: ...


def storage_profile(profile: str | None = None) -> str:
    """``profile``, else ``CONTEXTFUL_STORAGE_PROFILE``, else ``local``."""
    return profile or os.environ.get("CONTEXTFUL_STORAGE_PROFILE") or "local"


def open_catalog(profile: str | None = None, *, sqlite_path: str | None = None, dsn: str | None = None,
                 schema: str | None = None) -> Catalog:
    """The catalog for ``profile`` (default: ``CONTEXTFUL_STORAGE_PROFILE``, else ``local``).

    ``local`` opens the SQLite file ``sqlite_path``; ``postgres`` connects with ``dsn`` (default:
    ``CONTEXTFUL_POSTGRES_DSN``, else libpq's own ``PG*`` variables) inside the PostgreSQL schema
    ``schema`` (default: ``CONTEXTFUL_POSTGRES_SCHEMA``, else ``contextful``); ``cloudflare-d1``
    binds the Worker ``CONTEXTFUL_D1_URL``/``CONTEXTFUL_D1_TOKEN`` name (``StorageCapabilityMissing``
    naming each one unset).
    """
    profile = storage_profile(profile)
    if profile == "postgres" and dsn is None and not os.environ.get("CONTEXTFUL_POSTGRES_DSN") and not any(
            os.environ.get(name) for name in LIBPQ_SERVER_VARIABLES):
        raise CatalogDsnMissing(profile)  # libpq would try a local socket: say what is missing instead
    if profile == "local":
        from contextful.storage.catalog.sqlite import SqliteCatalog

        if sqlite_path is None:
            raise ValueError("the local profile needs a SQLite catalog path")
        return SqliteCatalog(sqlite_path)
    if profile == "postgres":
        from contextful.storage.catalog.postgres import PostgresCatalog

        return PostgresCatalog(
            dsn if dsn is not None else os.environ.get("CONTEXTFUL_POSTGRES_DSN", ""),
            schema or os.environ.get("CONTEXTFUL_POSTGRES_SCHEMA") or "contextful",
        )
    if profile == "cloudflare-d1":
        from contextful.storage.d1.catalog import D1Catalog
        from contextful.storage.d1.profile import d1_binding

        return D1Catalog(d1_binding().client())
    raise StorageProfileUnknown(profile, PROFILES)
