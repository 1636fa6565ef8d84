"""The catalog's SQL, shared by the SQLite and PostgreSQL adapters.

One commit is one database transaction: lock the head row of every table it lands on (in name
order, so committers never deadlock), check every requirement of every table, apply every update,
then take the catalog's commit clock (``cf_clock``), read the commit time from the caller's clock,
append the commit-log rows and advance each ``commit_seq`` with a conditional
``UPDATE … WHERE commit_seq = <read head>`` — the compare-and-swap that linearizes commits.
Adapters supply the connection, the way a write transaction begins (``BEGIN IMMEDIATE`` on
SQLite, ``SELECT … FOR UPDATE`` row locks on PostgreSQL) and the placeholder style.

The commit clock is one row every commit locks and advances, so commit times follow commit order
across the whole catalog: the time is read after the locks are held, and never earlier than the
previous commit's. On SQLite the writer lock already serializes commits; on PostgreSQL the row lock
serializes their last statements (the part-index updates before it run concurrently). A reserved
instant (``reserve_instant``, a sweep's ``as_of``) takes the same lock and moves the clock past it.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from contextful.storage.catalog import (
    CadenceHolder,
    Catalog,
    CommitRow,
    ConnectionRow,
    DraftRow,
    PartRow,
    PinnedHead,
    RunRecordRow,
    StagingRow,
    TableHead,
)
from contextful.storage.clock import Clock
from contextful.storage.commits import (
    AddParts,
    AssertHeadSeq,
    AssertPartsLive,
    AssertRecordsPending,
    AssertSchemaId,
    AssertStaging,
    AssertTableUUID,
    AssertWriter,
    CommitRequest,
    DeclareFollows,
    DeclareOrderBy,
    MarkRecordsFlushed,
    RecordRun,
    RemoveAllParts,
    RemoveParts,
    SetCursor,
    SetSchema,
)
from contextful.storage.dbapi import CommitUnheard, SqlDialect
from contextful.storage.errors import (
    CommitConflict,
    CommitOutcomeUnknown,
    ContextfulError,
    StoreCatalogMismatch,
    TableNotFound,
)
from contextful.storage.follows import Follows
from contextful.storage.holders import holder_is_dead
from contextful.storage.supersede import Supersede

DDL = (
    "CREATE TABLE IF NOT EXISTS cf_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS cf_tables (
        name TEXT PRIMARY KEY, table_uuid TEXT NOT NULL, commit_seq BIGINT NOT NULL,
        schema_id BIGINT NOT NULL, primary_key TEXT NOT NULL, created_us BIGINT NOT NULL,
        last_commit_us BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS cf_schemas (
        table_name TEXT NOT NULL, schema_id BIGINT NOT NULL, schema_text TEXT NOT NULL,
        PRIMARY KEY (table_name, schema_id))""",
    """CREATE TABLE IF NOT EXISTS cf_commits (
        table_name TEXT NOT NULL, commit_seq BIGINT NOT NULL, run_id TEXT NOT NULL, kind TEXT NOT NULL,
        manifest TEXT, schema_id BIGINT NOT NULL, committed_us BIGINT NOT NULL, rows_added BIGINT NOT NULL,
        PRIMARY KEY (table_name, commit_seq))""",
    """CREATE TABLE IF NOT EXISTS cf_parts (
        table_name TEXT NOT NULL, path TEXT NOT NULL, rows_count BIGINT NOT NULL, bytes BIGINT NOT NULL,
        added_seq BIGINT NOT NULL, removed_seq BIGINT, ord_seq BIGINT NOT NULL, ord_idx BIGINT NOT NULL,
        collected_us BIGINT, schema_id BIGINT NOT NULL, PRIMARY KEY (table_name, path))""",
    "CREATE INDEX IF NOT EXISTS cf_parts_live ON cf_parts (table_name, removed_seq)",
    """CREATE TABLE IF NOT EXISTS cf_cursors (
        table_name TEXT NOT NULL, scope TEXT NOT NULL, value TEXT NOT NULL, commit_seq BIGINT NOT NULL,
        PRIMARY KEY (table_name, scope))""",
    """CREATE TABLE IF NOT EXISTS cf_run_records (
        run_id TEXT NOT NULL, phase TEXT NOT NULL, table_name TEXT NOT NULL, payload TEXT NOT NULL,
        recorded_us BIGINT NOT NULL, flushed_seq BIGINT, PRIMARY KEY (run_id, phase))""",
    "CREATE INDEX IF NOT EXISTS cf_run_records_pending ON cf_run_records (flushed_seq)",
    "CREATE INDEX IF NOT EXISTS cf_commits_run ON cf_commits (table_name, run_id)",
    # a small run's manifest, kept with its commit (storage.manifest); a catalog written before it
    # gains the table empty, and its runs' manifests stay objects
    """CREATE TABLE IF NOT EXISTS cf_manifests (
        table_name TEXT NOT NULL, run_id TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (table_name, run_id))""",
    """CREATE TABLE IF NOT EXISTS cf_staging (
        table_name TEXT NOT NULL, run_id TEXT NOT NULL, holder TEXT NOT NULL, started_us BIGINT NOT NULL,
        expires_us BIGINT NOT NULL, PRIMARY KEY (table_name, run_id))""",
    "CREATE TABLE IF NOT EXISTS cf_clock (id INTEGER PRIMARY KEY, last_commit_us BIGINT NOT NULL)",
    # the control plane's cadence (engine.control.dispatch): one lease per deployment, and each armed
    # entry's last dispatch, recorded under that lease before its unit starts
    """CREATE TABLE IF NOT EXISTS cf_cadence_lease (
        deployment TEXT PRIMARY KEY, holder TEXT NOT NULL, acquired_us BIGINT NOT NULL, expires_us BIGINT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS cf_dispatches (
        deployment TEXT NOT NULL, entry TEXT NOT NULL, dispatched_us BIGINT NOT NULL, holder TEXT NOT NULL,
        PRIMARY KEY (deployment, entry))""",
    # the served control plane's state (engine.control.drafts, engine.control.attestation): each
    # project's one saved draft of its control document, and every operator nonce ever accepted
    """CREATE TABLE IF NOT EXISTS cf_control_drafts (
        project TEXT PRIMARY KEY, draft_id TEXT NOT NULL, version BIGINT NOT NULL, operator TEXT NOT NULL,
        nonce TEXT NOT NULL, saved_us BIGINT NOT NULL, document TEXT NOT NULL, snapshot TEXT, digest TEXT NOT NULL)""",
    # each tenant connection's record (engine.control.connection), its version advanced by compare-and-swap
    """CREATE TABLE IF NOT EXISTS cf_connections (
        project TEXT NOT NULL, connection_id TEXT NOT NULL, version BIGINT NOT NULL, state TEXT NOT NULL,
        tenant TEXT NOT NULL, principal TEXT NOT NULL, pipeline TEXT NOT NULL, selection TEXT NOT NULL, secret TEXT,
        schedule TEXT NOT NULL, declared TEXT NOT NULL, claimed_us BIGINT NOT NULL,
        PRIMARY KEY (project, connection_id))""",
    """CREATE TABLE IF NOT EXISTS cf_control_nonces (
        nonce TEXT PRIMARY KEY, operator TEXT NOT NULL, accepted_us BIGINT NOT NULL, claim TEXT NOT NULL)""",
    # a catalog written before the clock existed starts it at its newest commit
    ("INSERT INTO cf_clock (id, last_commit_us) SELECT 1, COALESCE(MAX(committed_us), 0) FROM cf_commits"
     " WHERE 1 = 1 ON CONFLICT (id) DO NOTHING"),
)

_CONNECTION_COLUMNS = ("project, connection_id, version, state, tenant, principal, pipeline, selection, secret,"
                       " schedule, declared, claimed_us")
_HEAD_COLUMNS = "t.name, t.table_uuid, t.commit_seq, t.schema_id, t.primary_key, t.created_us, t.last_commit_us"
_PART_COLUMNS = "path, rows_count, bytes, added_seq, removed_seq, ord_seq, ord_idx, collected_us"
_SELECT_PARTS = f"SELECT {_PART_COLUMNS}, schema_id FROM cf_parts"
_SELECT_HEADS = (f"SELECT {_HEAD_COLUMNS}, s.schema_text, {{pin}} AS pinned_seq FROM cf_tables t LEFT JOIN cf_schemas s"
                 " ON s.table_name = t.name AND s.schema_id = t.schema_id")
_PIN_HEAD = "t.commit_seq"
_PIN_AS_OF = "(SELECT MAX(c.commit_seq) FROM cf_commits c WHERE c.table_name = t.name AND c.committed_us <= ?)"


class SqlCatalog(SqlDialect, Catalog):
    """A catalog over a DB-API connection; adapters fill in the dialect hooks."""

    placeholder = "?"

    def __init__(self) -> None:
        self._open_connection()
        self._probe_linearizable()

        def create(cur: _Cursor) -> None:
            self._lock_ddl(cur)
            for statement in DDL:
                cur.execute(statement)

        self._write(create)

    # --- dialect hooks --------------------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> Any: ...

    @abstractmethod
    def _probe_linearizable(self) -> None:
        """Raise ConditionalWriteUnsupported unless a conditional write here is linearizable."""

    @abstractmethod
    def _begin_write(self, cur: Any, durable: bool) -> None:
        """Begin a write transaction; ``durable=False`` lets its commit return before the log is
        flushed. The log is sequential, so the next durable commit flushes it too: such a write is
        lost only if the process's next durable commit never happens (a plan row of a run that
        never committed)."""

    @abstractmethod
    def _map_error(self, exc: Exception) -> ContextfulError | None:
        """The catalogue error for a driver error (None: not the driver's)."""

    row_lock = ""
    """What a ``SELECT`` appends to lock the rows it reads until the transaction ends (PostgreSQL's
    ``FOR UPDATE``; SQLite's writer lock already excludes every other writer)."""

    share_lock = ""
    """What the owner read of an :class:`AssertWriter` appends (PostgreSQL's ``FOR SHARE``: a
    takeover's ``FOR UPDATE`` of the owner row waits for the commit, and commits of one attempt on
    several tables do not wait for each other)."""

    def _lock_ddl(self, cur: Any) -> None:
        """Serialize schema creation between processes opening the catalog at once."""

    # --- plumbing -------------------------------------------------------------------------------

    def _cursor_for(self, cur: Any) -> _Cursor:
        return _Cursor(cur, self._sql)

    def _read(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._query_rows(statement, params)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- the store and its tables ---------------------------------------------------------------

    def bind_store(self, store_uuid: str, root: str) -> None:
        def bind(cur: _Cursor) -> str:
            cur.execute("INSERT INTO cf_meta (key, value) VALUES ('store_uuid', ?) ON CONFLICT (key) DO NOTHING",
                        (store_uuid,))
            cur.execute("SELECT value FROM cf_meta WHERE key = 'store_uuid'")
            return str(cur.fetchone()[0])

        bound = self._write(bind, rerun_unheard=True)
        if bound != store_uuid:
            raise StoreCatalogMismatch(store_uuid, bound, root)

    def create_table(self, name: str, uuid: str, primary_key: tuple[str, ...], now_us: int,
                     order_by: str | None = None, supersede: Supersede | None = None,
                     follows: Follows | None = None,
                     declared: tuple[tuple[str, str], ...] = ()) -> TableHead | None:
        merge = _Merge(primary_key, order_by, supersede=supersede, follows=follows, declared=tuple(sorted(declared)))
        self._write(lambda cur: cur.execute(
            "INSERT INTO cf_tables (name, table_uuid, commit_seq, schema_id, primary_key, created_us,"
            " last_commit_us) VALUES (?, ?, 0, 0, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
            (name, uuid, merge.text(), now_us, now_us),
        ), rerun_unheard=True)
        return self.load_head(name)  # None: a provisional table was dropped again meanwhile

    def drop_table(self, name: str, uuid: str, at_seq: int | None = None) -> bool:
        def drop(cur: _Cursor) -> bool:
            cur.execute(f"SELECT table_uuid, commit_seq FROM cf_tables WHERE name = ?{self.row_lock}", (name,))
            row = cur.fetchone()
            if row is None or row[0] != uuid or (at_seq is not None and row[1] != at_seq):
                return False
            for owned in ("cf_parts", "cf_commits", "cf_manifests", "cf_schemas", "cf_cursors", "cf_staging"):
                cur.execute(f"DELETE FROM {owned} WHERE table_name = ?", (name,))
            cur.execute("DELETE FROM cf_tables WHERE name = ?", (name,))
            return True

        return self._write(drop, rerun_unheard=True)

    def settings(self, keys: Sequence[str]) -> dict[str, str]:
        if not keys:
            return {}
        marks = ", ".join("?" for _ in keys)
        rows = self._read(f"SELECT key, value FROM cf_meta WHERE key IN ({marks})", [f"setting:{k}" for k in keys])
        return {str(k).removeprefix("setting:"): str(v) for k, v in rows}

    def put_setting(self, key: str, value: str | None) -> None:
        if value is None:
            self._write(lambda cur: cur.execute("DELETE FROM cf_meta WHERE key = ?", (f"setting:{key}",)),
                        rerun_unheard=True)
            return
        self._write(lambda cur: cur.execute(
            "INSERT INTO cf_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (f"setting:{key}", value)), rerun_unheard=True)

    def load_head(self, name: str) -> TableHead | None:
        pinned = self.pin_heads([name]).get(name)
        return pinned.head if pinned is not None else None

    def list_heads(self) -> list[TableHead]:
        return [p.head for p in self.pin_heads().values()]

    def pin_heads(self, names: Sequence[str] | None = None, as_of_us: int | None = None) -> dict[str, PinnedHead]:
        statement = _SELECT_HEADS.format(pin=_PIN_HEAD if as_of_us is None else _PIN_AS_OF)
        params: list[Any] = [] if as_of_us is None else [as_of_us]
        if names is not None:
            wanted = sorted(set(names))
            if not wanted:
                return {}
            statement += f" WHERE t.name IN ({', '.join('?' for _ in wanted)})"
            params += wanted
        rows = self._read(statement + " ORDER BY t.name", params)  # one statement: one point in time
        return {r[0]: PinnedHead(_head(r[:-1]), r[-1]) for r in rows}

    def schema_at(self, name: str, schema_id: int) -> str:
        rows = self._read("SELECT schema_text FROM cf_schemas WHERE table_name = ? AND schema_id = ?",
                          (name, schema_id))
        return rows[0][0]

    # --- the commit -----------------------------------------------------------------------------

    def commit_many(self, requests: Sequence[CommitRequest], clock: Clock) -> list[int]:
        """One transaction; a commit whose answer was lost runs again and finds its run ids landed
        (a run id commits at most once per table), so it never lands twice. Raises
        CommitOutcomeUnknown only when no working connection could tell."""
        tables = [r.table for r in requests]
        if len(set(tables)) != len(tables):
            raise ValueError(f"one commit lands at most one run per table, not {tables}")
        if not requests:
            return []
        try:
            return self._write(lambda cur: self._commit(cur, requests, clock), rerun_unheard=True)
        except CommitUnheard as exc:
            target = ", ".join(repr(t) for t in tables)
            raise CommitOutcomeUnknown(f"table{'s' if len(tables) > 1 else ''} {target}",
                                       ", ".join(r.run_id for r in requests), str(exc)) from exc

    def _commit(self, cur: _Cursor, requests: Sequence[CommitRequest], clock: Clock) -> list[int]:
        heads: dict[str, tuple[Any, ...]] = {}
        for table in sorted(r.table for r in requests):  # one lock order: committers never deadlock
            cur.execute("SELECT table_uuid, commit_seq, schema_id, last_commit_us FROM cf_tables"
                        f" WHERE name = ?{self.row_lock}", (table,))
            row = cur.fetchone()
            if row is None:
                raise TableNotFound(table)
            heads[table] = row
        seqs: dict[str, int] = {}
        todo = []
        for request in requests:
            uuid, head_seq, schema_id, _last_us = heads[request.table]
            landed = self._landed_seq(cur, request)
            if landed is not None:
                seqs[request.table] = landed
                continue
            self._check(cur, request, uuid, head_seq, schema_id)
            todo.append(request)
        schema_ids = {}
        for request in todo:  # every requirement held: apply
            _uuid, head_seq, schema_id, _last_us = heads[request.table]
            schema_ids[request.table] = self._apply(cur, request, head_seq + 1, schema_id)
        if todo:
            committed_us = self._stamp(cur, clock, max(heads[r.table][3] for r in todo))
        for request in todo:
            head_seq = heads[request.table][1]
            seq = head_seq + 1
            cur.execute(
                "INSERT INTO cf_commits (table_name, commit_seq, run_id, kind, manifest, schema_id,"
                " committed_us, rows_added) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (request.table, seq, request.run_id, request.kind, request.manifest, schema_ids[request.table],
                 committed_us, request.rows),
            )
            if request.manifest_doc is not None:
                cur.execute("INSERT INTO cf_manifests (table_name, run_id, doc) VALUES (?, ?, ?)",
                            (request.table, request.run_id, request.manifest_doc))
            cur.execute("DELETE FROM cf_staging WHERE table_name = ? AND run_id = ?", (request.table, request.run_id))
            cur.execute(
                "UPDATE cf_tables SET commit_seq = ?, schema_id = ?, last_commit_us = ?"
                " WHERE name = ? AND commit_seq = ?",
                (seq, schema_ids[request.table], committed_us, request.table, head_seq),
            )
            if cur.rowcount != 1:
                raise CommitConflict(request.table, f"head moved from commit_seq {head_seq}")
            seqs[request.table] = seq
        return [seqs[r.table] for r in requests]

    def _stamp(self, cur: _Cursor, clock: Clock, floor_us: int) -> int:
        """The commit's time: the clock read while holding the catalog's commit clock, never
        earlier than the previous commit's (anywhere in the catalog) nor ``floor_us``."""
        cur.execute(f"SELECT last_commit_us FROM cf_clock WHERE id = 1{self.row_lock}")
        last_us = int(cur.fetchone()[0])
        committed_us = max(clock.now_us(), last_us, floor_us)  # transaction time never runs backwards
        cur.execute("UPDATE cf_clock SET last_commit_us = ? WHERE id = 1", (committed_us,))
        return committed_us

    @staticmethod
    def _landed_seq(cur: _Cursor, request: CommitRequest) -> int | None:
        """The commit_seq at which this request's run id already landed (under the head lock, so
        no earlier attempt is still in flight), else None."""
        cur.execute("SELECT commit_seq, manifest, rows_added FROM cf_commits WHERE table_name = ? AND run_id = ?",
                    (request.table, request.run_id))
        found = cur.fetchone()
        if found is None:
            return None
        seq, manifest, rows = found
        if manifest != request.manifest or rows != request.rows:
            raise CommitConflict(request.table, f"run {request.run_id} already landed at commit_seq {seq}"
                                 " with other contents", failed="RunIdLanded")
        return int(seq)

    def _check(self, cur: _Cursor, request: CommitRequest, uuid: str, head_seq: int, schema_id: int) -> None:
        table = request.table
        for req in request.requirements:
            if isinstance(req, AssertTableUUID) and req.uuid != uuid:
                raise CommitConflict(table, f"table uuid is {uuid}, not {req.uuid}", failed="AssertTableUUID")
            if isinstance(req, AssertHeadSeq) and req.commit_seq != head_seq:
                raise CommitConflict(table, f"head is at commit_seq {head_seq}, not {req.commit_seq}",
                                     failed="AssertHeadSeq")
            if isinstance(req, AssertSchemaId) and req.schema_id != schema_id:
                raise CommitConflict(table, f"head schema is {schema_id}, not {req.schema_id}", failed="AssertSchemaId")
            if isinstance(req, AssertPartsLive) and req.paths:
                live = self._count_live(cur, table, req.paths)
                if live != len(set(req.paths)):
                    raise CommitConflict(table, f"{len(set(req.paths)) - live} part(s) are no longer live",
                                         failed="AssertPartsLive")
            if isinstance(req, AssertStaging):
                cur.execute(f"SELECT 1 FROM cf_staging WHERE table_name = ? AND run_id = ?{self.row_lock}",
                            (table, req.run_id))
                if cur.fetchone() is None:
                    raise CommitConflict(table, f"run {req.run_id} no longer holds its staging lease: collection took "
                                         "it for abandoned and may have deleted what it staged; nothing landed",
                                         failed="AssertStaging")
            if isinstance(req, AssertWriter):
                req.fence.check_sql(cur, lambda statement: statement, self.share_lock)
            if isinstance(req, AssertRecordsPending) and req.keys:
                pending = 0
                for run_id, phase in req.keys:
                    cur.execute("SELECT COUNT(*) FROM cf_run_records WHERE run_id = ? AND phase = ?"
                                " AND flushed_seq IS NULL", (run_id, phase))
                    pending += cur.fetchone()[0]
                if pending != len(req.keys):
                    raise CommitConflict(table, "run records were flushed by another append", failed="AssertRecordsPending")

    def _count_live(self, cur: _Cursor, table: str, paths: tuple[str, ...]) -> int:
        live = 0
        for chunk in _chunks(sorted(set(paths)), 500):
            marks = ", ".join("?" for _ in chunk)
            cur.execute(f"SELECT COUNT(*) FROM cf_parts WHERE table_name = ? AND removed_seq IS NULL"
                        f" AND path IN ({marks})", (table, *chunk))
            live += cur.fetchone()[0]
        return live

    def _apply(self, cur: _Cursor, request: CommitRequest, seq: int, schema_id: int) -> int:
        table = request.table
        for update in request.updates:
            if isinstance(update, RemoveAllParts):
                cur.execute("UPDATE cf_parts SET removed_seq = ? WHERE table_name = ? AND removed_seq IS NULL",
                            (seq, table))
            elif isinstance(update, RemoveParts):
                cur.executemany(
                    "UPDATE cf_parts SET removed_seq = ? WHERE table_name = ? AND path = ? AND removed_seq IS NULL",
                    [(seq, table, p) for p in update.paths],
                )
            elif isinstance(update, AddParts):
                cur.executemany(
                    f"INSERT INTO cf_parts (table_name, {_PART_COLUMNS}, schema_id)"
                    " VALUES (?, ?, ?, ?, ?, NULL, ?, ?, NULL, ?)",
                    [(table, p.path, p.rows, p.bytes, seq, seq if p.ord_seq is None else p.ord_seq, p.ord_idx,
                      schema_id if p.exact_schema else -1)
                     for p in update.parts],
                )
            elif isinstance(update, SetSchema):
                schema_id += 1
                cur.execute("INSERT INTO cf_schemas (table_name, schema_id, schema_text) VALUES (?, ?, ?)",
                            (table, schema_id, update.schema))
            elif isinstance(update, SetCursor):
                cur.execute(
                    "INSERT INTO cf_cursors (table_name, scope, value, commit_seq) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (table_name, scope) DO UPDATE SET value = excluded.value,"
                    " commit_seq = excluded.commit_seq",
                    (table, update.scope, json.dumps(update.value), seq),
                )
            elif isinstance(update, RecordRun):
                payload = dict(update.payload, commit_seq=seq)
                cur.execute(
                    "INSERT INTO cf_run_records (run_id, phase, table_name, payload, recorded_us, flushed_seq)"
                    " VALUES (?, ?, ?, ?, ?, NULL) ON CONFLICT (run_id, phase) DO UPDATE SET"
                    " payload = excluded.payload, recorded_us = excluded.recorded_us, flushed_seq = NULL",
                    (update.run_id, update.phase, update.table, json.dumps(payload),
                     int(update.payload.get("recorded_us", 0))),
                )
            elif isinstance(update, MarkRecordsFlushed):
                # a flushed row leaves the cache: ``_runs`` holds it from this commit on
                if update.payloads:
                    cur.executemany("DELETE FROM cf_run_records WHERE run_id = ? AND phase = ? AND payload = ?",
                                    [(run_id, phase, text) for (run_id, phase), text in zip(update.keys, update.payloads)])
                else:
                    cur.executemany("DELETE FROM cf_run_records WHERE run_id = ? AND phase = ?", list(update.keys))
                # rows an older version kept once flushed (an empty range of the pending index after once)
                cur.execute("DELETE FROM cf_run_records WHERE flushed_seq IS NOT NULL")
            elif isinstance(update, DeclareOrderBy | DeclareFollows):
                # the declaration's text is read and written in this transaction: a declaration
                # keeps every other one, and one that landed first is a conflict
                cur.execute(f"SELECT primary_key FROM cf_tables WHERE name = ?{self.row_lock}", (table,))
                before = cur.fetchone()[0]
                merge = _Merge.parse(before)
                if isinstance(update, DeclareOrderBy):
                    if merge.order_by is not None or merge.primary_key != update.primary_key:
                        raise CommitConflict(table, "order_by is already declared", failed="DeclareOrderBy")
                    merge = dataclasses.replace(merge, order_by=update.order_by, order_by_seq=seq)
                else:
                    if merge.follows is not None:
                        raise CommitConflict(table, "follows is already declared", failed="DeclareFollows")
                    merge = dataclasses.replace(merge, follows=update.follows, follows_seq=seq)
                cur.execute("UPDATE cf_tables SET primary_key = ? WHERE name = ? AND primary_key = ?",
                            (merge.text(), table, before))
        return schema_id

    # --- history and snapshots ------------------------------------------------------------------

    def commits(self, name: str) -> list[CommitRow]:
        rows = self._read(
            "SELECT table_name, commit_seq, run_id, kind, manifest, committed_us, rows_added FROM cf_commits"
            " WHERE table_name = ? ORDER BY commit_seq",
            (name,),
        )
        return [CommitRow(*r) for r in rows]

    def manifest_doc(self, name: str, run_id: str) -> str | None:
        rows = self._read("SELECT doc FROM cf_manifests WHERE table_name = ? AND run_id = ?", (name, run_id))
        return str(rows[0][0]) if rows else None

    def committed_us(self, name: str, commit_seq: int) -> int | None:
        rows = self._read("SELECT committed_us FROM cf_commits WHERE table_name = ? AND commit_seq = ?",
                          (name, commit_seq))
        return int(rows[0][0]) if rows else None

    def first_commit_us(self, name: str) -> int | None:
        rows = self._read("SELECT committed_us FROM cf_commits WHERE table_name = ? ORDER BY commit_seq LIMIT 1",
                          (name,))
        return int(rows[0][0]) if rows else None

    def schema_id_at(self, name: str, commit_seq: int) -> int:
        rows = self._read("SELECT schema_id FROM cf_commits WHERE table_name = ? AND commit_seq = ?",
                          (name, commit_seq))
        return rows[0][0] if rows else 0

    def live_parts(self, name: str, commit_seq: int) -> list[PartRow]:
        # Two index ranges of (table_name, removed_seq), not one scan of every part the table ever
        # had: folds leave a removed row per part they absorb, so that scan grew with the commits.
        rows = self._read(
            f"SELECT * FROM ({_SELECT_PARTS} WHERE table_name = ? AND removed_seq IS NULL AND added_seq <= ?"
            f" UNION ALL {_SELECT_PARTS} WHERE table_name = ? AND removed_seq > ? AND added_seq <= ?) AS live"
            " ORDER BY ord_seq, ord_idx",
            (name, commit_seq, name, commit_seq, commit_seq),
        )
        return [PartRow(*r) for r in rows]

    def all_parts(self, name: str) -> list[PartRow]:
        rows = self._read(f"{_SELECT_PARTS} WHERE table_name = ?", (name,))
        return [PartRow(*r) for r in rows]

    def mark_collected(self, name: str, paths: list[str], now_us: int) -> None:
        self._write(lambda cur: cur.executemany(
            "UPDATE cf_parts SET collected_us = ? WHERE table_name = ? AND path = ?",
            [(now_us, name, p) for p in paths]), rerun_unheard=True)

    def cursor(self, name: str, scope: str) -> tuple[Any, int] | None:
        rows = self._read("SELECT value, commit_seq FROM cf_cursors WHERE table_name = ? AND scope = ?",
                          (name, scope))
        return (json.loads(rows[0][0]), rows[0][1]) if rows else None

    # --- runs staging ---------------------------------------------------------------------------

    def begin_staging(self, name: str, run_id: str, holder: str, now_us: int, lease_us: int) -> None:
        self._write(lambda cur: _take_staging(cur, name, run_id, holder, now_us, lease_us),
                    durable=False, rerun_unheard=True)

    def open_run(self, name: str, run_id: str, holder: str, now_us: int, lease_us: int) -> TableHead:
        def open_(cur: _Cursor) -> TableHead:
            cur.execute(_SELECT_HEADS.format(pin=_PIN_HEAD) + " WHERE t.name = ?", (name,))
            row = cur.fetchone()
            if row is None:
                raise TableNotFound(name)  # rolls back: no lease is taken
            _take_staging(cur, name, run_id, holder, now_us, lease_us)
            return _head(row[:-1])

        # not flushed on its own, as begin_staging's write (SqlCatalog._begin_write)
        return self._write(open_, durable=False, rerun_unheard=True)

    def renew_staging(self, name: str, run_id: str, expires_us: int) -> bool:
        def renew(cur: _Cursor) -> bool:
            cur.execute("UPDATE cf_staging SET expires_us = ? WHERE table_name = ? AND run_id = ?",
                        (expires_us, name, run_id))
            return cur.rowcount == 1

        return self._write(renew, durable=False, rerun_unheard=True)

    def end_staging(self, name: str, run_id: str, *, lapsed_at_us: int | None = None) -> None:
        if lapsed_at_us is None:
            self._write(lambda cur: cur.execute(
                "DELETE FROM cf_staging WHERE table_name = ? AND run_id = ?", (name, run_id)),
                durable=False, rerun_unheard=True)
        else:
            self._write(lambda cur: cur.execute(
                "DELETE FROM cf_staging WHERE table_name = ? AND run_id = ? AND expires_us <= ?",
                (name, run_id, lapsed_at_us)), durable=False, rerun_unheard=True)

    def staging_runs(self, name: str) -> list[StagingRow]:
        rows = self._read("SELECT run_id, holder, started_us, expires_us FROM cf_staging WHERE table_name = ?",
                          (name,))
        return [StagingRow(*r) for r in rows]

    # --- the control plane's cadence -----------------------------------------------------------

    def take_cadence(self, deployment: str, holder: str, now_us: int, lease_us: int) -> CadenceHolder:
        def take(cur: _Cursor) -> CadenceHolder:
            cur.execute("SELECT holder, acquired_us, expires_us FROM cf_cadence_lease WHERE deployment = ?"
                        f"{self.row_lock}", (deployment,))
            row = cur.fetchone()
            if row is not None and row[0] != holder and row[2] > now_us and not holder_is_dead(row[0]):
                return CadenceHolder(deployment, row[0], row[1], row[2])
            acquired = row[1] if row is not None and row[0] == holder else now_us
            cur.execute("INSERT INTO cf_cadence_lease (deployment, holder, acquired_us, expires_us) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (deployment) DO UPDATE SET holder = excluded.holder,"
                        " acquired_us = excluded.acquired_us, expires_us = excluded.expires_us",
                        (deployment, holder, acquired, now_us + lease_us))
            return CadenceHolder(deployment, holder, acquired, now_us + lease_us)

        return self._write(take, rerun_unheard=True)

    def release_cadence(self, deployment: str, holder: str) -> None:
        self._write(lambda cur: cur.execute(
            "DELETE FROM cf_cadence_lease WHERE deployment = ? AND holder = ?", (deployment, holder)),
            rerun_unheard=True)

    def cadence_holder(self, deployment: str) -> CadenceHolder | None:
        rows = self._read("SELECT holder, acquired_us, expires_us FROM cf_cadence_lease WHERE deployment = ?",
                          (deployment,))
        return CadenceHolder(deployment, *rows[0]) if rows else None

    def record_dispatch(self, deployment: str, entry: str, holder: str, now_us: int) -> bool:
        def record(cur: _Cursor) -> bool:
            cur.execute(f"SELECT holder, expires_us FROM cf_cadence_lease WHERE deployment = ?{self.share_lock}",
                        (deployment,))
            row = cur.fetchone()
            if row is None or row[0] != holder or row[1] <= now_us:
                return False
            cur.execute("INSERT INTO cf_dispatches (deployment, entry, dispatched_us, holder) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (deployment, entry) DO UPDATE SET dispatched_us = excluded.dispatched_us,"
                        " holder = excluded.holder", (deployment, entry, now_us, holder))
            return True

        return self._write(record, rerun_unheard=True)

    def dispatches(self, deployment: str) -> dict[str, int]:
        rows = self._read("SELECT entry, dispatched_us FROM cf_dispatches WHERE deployment = ?", (deployment,))
        return {str(entry): int(at) for entry, at in rows}

    # --- the served control plane's state -------------------------------------------------------

    def save_draft(self, draft: DraftRow) -> None:
        self._write(lambda cur: cur.execute(
            "INSERT INTO cf_control_drafts (project, draft_id, version, operator, nonce, saved_us, document, snapshot,"
            " digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (project) DO UPDATE SET"
            " draft_id = excluded.draft_id, version = excluded.version, operator = excluded.operator,"
            " nonce = excluded.nonce, saved_us = excluded.saved_us, document = excluded.document,"
            " snapshot = excluded.snapshot, digest = excluded.digest",
            (draft.project, draft.draft_id, draft.version, draft.operator, draft.nonce, draft.saved_us, draft.document,
             draft.snapshot, draft.digest)), rerun_unheard=True)

    def draft(self, project: str) -> DraftRow | None:
        rows = self._read("SELECT project, draft_id, version, operator, nonce, saved_us, document, snapshot, digest"
                          " FROM cf_control_drafts WHERE project = ?", (project,))
        return DraftRow(*rows[0]) if rows else None

    def drop_draft(self, project: str, draft_id: str) -> bool:
        def drop(cur: _Cursor) -> bool:
            cur.execute("DELETE FROM cf_control_drafts WHERE project = ? AND draft_id = ?", (project, draft_id))
            return bool(cur.rowcount)

        return self._write(drop, rerun_unheard=True)

    def claim_connection(self, row: ConnectionRow) -> bool:
        values = dataclasses.astuple(row)

        def claim(cur: _Cursor) -> bool:
            if row.version == 1:
                cur.execute(f"INSERT INTO cf_connections ({_CONNECTION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
                            " ?, ?) ON CONFLICT (project, connection_id) DO NOTHING", values)
            else:
                cur.execute("UPDATE cf_connections SET version = ?, state = ?, tenant = ?, principal = ?, pipeline = ?,"
                            " selection = ?, secret = ?, schedule = ?, declared = ?, claimed_us = ?"
                            " WHERE project = ? AND connection_id = ? AND version = ?",
                            (*values[2:], row.project, row.connection_id, row.version - 1))
            return cur.rowcount == 1

        # not rerun when unheard: a rerun of a claim that landed would find its own row and answer False
        return self._write(claim)

    def connection(self, project: str, connection_id: str) -> ConnectionRow | None:
        rows = self._read(f"SELECT {_CONNECTION_COLUMNS} FROM cf_connections WHERE project = ? AND connection_id = ?",
                          (project, connection_id))
        return ConnectionRow(*rows[0]) if rows else None

    def connections(self, project: str) -> list[ConnectionRow]:
        rows = self._read(f"SELECT {_CONNECTION_COLUMNS} FROM cf_connections WHERE project = ?"
                          " ORDER BY connection_id", (project,))
        return [ConnectionRow(*r) for r in rows]

    def connections_mark(self, project: str) -> tuple[int, int]:
        rows = self._read("SELECT COUNT(*), COALESCE(SUM(version), 0) FROM cf_connections WHERE project = ?",
                          (project,))
        return int(rows[0][0]), int(rows[0][1])

    def accept_nonce(self, nonce: str, operator: str, now_us: int) -> bool:
        claim = uuid.uuid4().hex  # tells this call's own row from a replay's when a rerun finds it

        def accept(cur: _Cursor) -> bool:
            cur.execute("INSERT INTO cf_control_nonces (nonce, operator, accepted_us, claim) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (nonce) DO NOTHING", (nonce, operator, now_us, claim))
            if cur.rowcount == 1:
                return True
            cur.execute("SELECT claim FROM cf_control_nonces WHERE nonce = ?", (nonce,))
            return str(cur.fetchone()[0]) == claim  # this call's, when its first commit went unheard

        return self._write(accept, rerun_unheard=True)

    # --- the run-record cache -------------------------------------------------------------------

    def record_run(self, run_id: str, phase: str, table: str, payload: dict[str, Any], now_us: int) -> None:
        self._write(lambda cur: cur.execute(
            "INSERT INTO cf_run_records (run_id, phase, table_name, payload, recorded_us, flushed_seq)"
            " VALUES (?, ?, ?, ?, ?, NULL) ON CONFLICT (run_id, phase) DO UPDATE SET"
            " payload = excluded.payload, recorded_us = excluded.recorded_us, flushed_seq = NULL",
            (run_id, phase, table, json.dumps(payload), now_us),
        ), durable=False, rerun_unheard=True)

    def pending_run_records(self, limit: int) -> list[RunRecordRow]:
        rows = self._read(
            "SELECT run_id, phase, table_name, payload, recorded_us FROM cf_run_records"
            " WHERE flushed_seq IS NULL ORDER BY recorded_us, run_id, phase LIMIT ?",
            (limit,),
        )
        return [_record(r) for r in rows]

    def pending_run_summary(self) -> tuple[int, int | None]:
        count, oldest = self._read("SELECT COUNT(*), MIN(recorded_us) FROM cf_run_records WHERE flushed_seq IS NULL")[0]
        return int(count), oldest

    def pending_run_texts(self) -> list[tuple[str, str, str, str]]:
        rows = self._read("SELECT run_id, phase, table_name, payload FROM cf_run_records WHERE flushed_seq IS NULL"
                          " ORDER BY recorded_us, run_id, phase")
        return [tuple(r) for r in rows]  # type: ignore[misc]

    def run_records(self) -> list[RunRecordRow]:
        rows = self._read(
            "SELECT run_id, phase, table_name, payload, recorded_us FROM cf_run_records"
            " WHERE flushed_seq IS NULL ORDER BY recorded_us, run_id, phase"
        )
        return [_record(r) for r in rows]

    # --- reserved instants ----------------------------------------------------------------------

    def reserve_instant(self, clock: Clock) -> int:
        """Under the commit clock's lock (the lock a commit takes to stamp its time, so a commit in
        flight has landed or waits): the clock, or the newest commit's time when the clock runs
        behind it; then ``last_commit_us`` moves one past it, so a commit stamped later (its time is
        never earlier than ``last_commit_us``) lands after the instant, whatever its clock says."""
        def reserve(cur: _Cursor) -> int:
            cur.execute(f"SELECT last_commit_us FROM cf_clock WHERE id = 1{self.row_lock}")
            instant = max(clock.now_us(), int(cur.fetchone()[0]))
            cur.execute("UPDATE cf_clock SET last_commit_us = ? WHERE id = 1", (instant + 1,))
            return instant

        return self._write(reserve, rerun_unheard=True)  # run again, it reserves a later instant: as good


class _Cursor:
    """A DB-API cursor speaking the catalog's ``?`` placeholders on either dialect."""

    def __init__(self, cur: Any, sql: Any) -> None:
        self._cur = cur
        self._sqlfn = sql

    def execute(self, statement: str, params: Sequence[Any] = ()) -> None:
        self._cur.execute(self._sqlfn(statement), tuple(params))

    def executemany(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:
            self._cur.executemany(self._sqlfn(statement), rows)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount


def _head(row: tuple[Any, ...]) -> TableHead:
    name, uuid, seq, schema_id, merge_text, created_us, last_us, schema_text = row
    merge = _Merge.parse(merge_text)
    return TableHead(name, uuid, seq, schema_id, schema_text, merge.primary_key, created_us, last_us, merge.order_by,
                     merge.order_by_seq, merge.supersede, merge.follows, merge.follows_seq, merge.declared)


@dataclass(frozen=True)
class _Merge:
    """A table's merge declaration, as the ``primary_key`` column holds it (:meth:`text`)."""

    primary_key: tuple[str, ...]
    order_by: str | None = None
    order_by_seq: int = 0
    supersede: Supersede | None = None
    follows: Follows | None = None
    follows_seq: int = 0
    declared: tuple[tuple[str, str], ...] = ()

    def text(self) -> str:
        """The key as a JSON list (the original form, kept when nothing else is declared), or
        ``{"key": [...]}`` plus ``"order_by"`` (and ``"order_by_seq"``, the declaring commit, when a
        commit declared it; absent: declared with the table), ``"supersede"`` (``Supersede.to_json``)
        and ``"follows"`` (``Follows.to_json``, with ``"follows_seq"`` likewise) and ``"declared"`` (what
        else the creator declared, ``TableHead.declared``), each present only when declared."""
        if self.order_by is None and self.supersede is None and self.follows is None and not self.declared:
            return json.dumps(list(self.primary_key))
        doc: dict[str, Any] = {"key": list(self.primary_key)}
        if self.order_by is not None:
            doc["order_by"] = self.order_by
        if self.order_by_seq:
            doc["order_by_seq"] = self.order_by_seq
        if self.supersede is not None:
            doc["supersede"] = self.supersede.to_json()
        if self.follows is not None:
            doc["follows"] = self.follows.to_json()
        if self.follows_seq:
            doc["follows_seq"] = self.follows_seq
        if self.declared:
            doc["declared"] = dict(self.declared)
        return json.dumps(doc)

    @classmethod
    def parse(cls, text: str) -> _Merge:
        doc = json.loads(text)
        if isinstance(doc, list):
            return cls(tuple(doc))
        rule, follows = doc.get("supersede"), doc.get("follows")
        return cls(tuple(doc["key"]), doc.get("order_by"), int(doc.get("order_by_seq", 0)),
                   None if rule is None else Supersede.from_json(rule),
                   None if follows is None else Follows.from_json(follows), int(doc.get("follows_seq", 0)),
                   tuple(sorted(doc.get("declared", {}).items())))


def _take_staging(cur: _Cursor, name: str, run_id: str, holder: str, now_us: int, lease_us: int) -> None:
    """Register ``run_id`` as staging on ``name`` until ``now_us + lease_us`` (a second take renews it)."""
    cur.execute("INSERT INTO cf_staging (table_name, run_id, holder, started_us, expires_us) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (table_name, run_id) DO UPDATE SET holder = excluded.holder,"
                " expires_us = excluded.expires_us",
                (name, run_id, holder, now_us, now_us + lease_us))


def _record(row: tuple[Any, ...]) -> RunRecordRow:
    run_id, phase, table, payload, recorded_us = row
    return RunRecordRow(run_id, phase, table, json.loads(payload), recorded_us)


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
