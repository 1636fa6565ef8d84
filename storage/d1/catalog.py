"""The catalog of the D1 profile: the catalog's tables in D1, reached through the private Worker.

Implements the catalog part of ``run.journal.d1-profile`` (decision "d1-execution-state") and keeps
``surface.apply.weak-conditional-backend``'s promise: every conditional write is linearizable. D1
serializes writes, but its transaction is one batch that ends with the request, so no lock is held
between a read and the write it decides (``storage.catalog.sql`` holds ``BEGIN IMMEDIATE`` or
``FOR UPDATE`` locks there). The SQL is ``SqlCatalog``'s; what changes is how a write decides:

* A verb whose statements each stand alone (an upsert, an insert that does nothing on conflict, a
  delete, an update answering its change count) runs as ``SqlCatalog`` writes it, each statement
  its own batch (:class:`_D1Cursor`).
* A commit is one batch in three parts (decision "d1-coordinated-groups": a batch's first
  statement takes a fresh write token, each later statement predicates on it, so a lost race
  changes no row). First, for every table, ``UPDATE cf_tables SET write_token = <fresh> WHERE`` its
  head is still the one read (uuid, commit_seq, schema, merge declaration). Then a statement per
  requirement the head does not cover (a staging lease, the writer's fence, pending run records,
  live parts) takes the token back where the requirement fails. Every update, the commit clock,
  the commit log and the heads' advance follow, each ``WHERE`` every table still holds the token;
  the batch's last statement counts them. All held: committed. Otherwise nothing changed: the
  heads are read again, and the requirements checked again (``CommitConflict`` naming the one that
  failed), or the commit tried again on the new head.
* Verbs that read and then decide (a table's drop, the cadence lease, a dispatch under it, a run's
  opening, a reserved instant) are written the same way: one batch whose writes predicate on what
  was read, retried on a lost race.

D1 answers at most 100 bound parameters a statement: lists of paths and keys go in chunks.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from contextful.storage.catalog import CadenceHolder, TableHead
from contextful.storage.catalog.sql import _PIN_HEAD, _SELECT_HEADS, DDL, SqlCatalog, _head, _Merge
from contextful.storage.clock import Clock
from contextful.storage.commits import (
    AddParts,
    AssertPartsLive,
    AssertRecordsPending,
    AssertStaging,
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
from contextful.storage.d1.client import D1Client, Statement
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import CommitConflict, CommitOutcomeUnknown, ContextfulError, TableNotFound
from contextful.storage.holders import holder_is_dead

T = TypeVar("T")

CHUNK = 90
"""Paths or keys per statement: under D1's 100 bound parameters, with room for the others."""

_HELD = "(SELECT COUNT(*) FROM cf_tables WHERE write_token = ?) = ?"
"""Every table of the commit still holds its token: the predicate of each of the commit's writes."""
_REVOKE = "UPDATE cf_tables SET write_token = NULL WHERE write_token = ? AND "
_CLOCK = "(SELECT last_commit_us FROM cf_clock WHERE id = 1)"
_INSERT_COMMIT = ("INSERT INTO cf_commits (table_name, commit_seq, run_id, kind, manifest, schema_id, committed_us,"
                  f" rows_added) SELECT ?, ?, ?, ?, ?, ?, {_CLOCK}, ? WHERE {_HELD}")


class D1Catalog(SqlCatalog):
    backend = "d1"
    profile = "cloudflare-d1"

    def __init__(self, client: D1Client) -> None:  # no connection: SqlCatalog's is D1's batches here
        self.client = client
        statements: list[Statement] = [(statement, ()) for statement in DDL]
        columns = client.query("SELECT name FROM pragma_table_info(?)", (client.sql("cf_tables"),))
        if ("write_token",) not in columns:
            statements.append(("ALTER TABLE cf_tables ADD COLUMN write_token TEXT", ()))
        client.batch(statements, rerun_unheard=True)

    @property
    def journal_location(self) -> str | None:
        # the D1 journal store on the same binding (storage.d1.journal) shares this database
        return self.client.backend

    # --- SqlCatalog's plumbing over D1 ----------------------------------------------------------

    def _connect(self) -> Any:
        raise NotImplementedError("the D1 catalog holds no connection")

    def _probe_linearizable(self) -> None:
        """D1 serializes every write of a database: a conditional write is linearizable."""

    def _begin_write(self, cur: Any, durable: bool) -> None:
        raise NotImplementedError("D1 begins no transaction: a batch is one")

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        return None  # the client raises the catalogue's errors itself

    def _read(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self.client.query(statement, params)

    def _write(self, body: Callable[[Any], T], *, durable: bool = True, rerun_unheard: bool = False,
               one_statement: bool = False) -> T:
        try:
            return body(_D1Cursor(self.client))
        except CommitUnheard:
            if not rerun_unheard:
                raise
            return body(_D1Cursor(self.client))

    def close(self) -> None:
        """Nothing to release: every call is its own request."""

    # --- the commit -----------------------------------------------------------------------------

    def commit_many(self, requests: Sequence[CommitRequest], clock: Clock) -> list[int]:
        tables = [r.table for r in requests]
        if len(set(tables)) != len(tables):
            raise ValueError(f"one commit lands at most one run per table, not {tables}")
        if not requests:
            return []
        try:
            return self._until_landed(requests, clock)
        except CommitUnheard:  # sent again, the commit finds its run ids landed or lands them now
            try:
                return self._until_landed(requests, clock)
            except CommitUnheard as exc:
                target = ", ".join(repr(t) for t in tables)
                raise CommitOutcomeUnknown(f"table{'s' if len(tables) > 1 else ''} {target}",
                                           ", ".join(r.run_id for r in requests), str(exc)) from exc

    def _until_landed(self, requests: Sequence[CommitRequest], clock: Clock) -> list[int]:
        while True:  # loops only while other committers move a head between our read and our batch
            landed = self._try_commit(requests, clock)
            if landed is not None:
                return landed

    def _try_commit(self, requests: Sequence[CommitRequest], clock: Clock) -> list[int] | None:
        """Read the heads, check the requirements, send the batch: the commit_seqs, or None when a
        head moved first (nothing changed)."""
        cur: Any = _D1Cursor(self.client)  # what SqlCatalog's checks read through: each read its own batch
        heads = self._heads([r.table for r in requests])
        seqs: dict[str, int] = {}
        todo = []
        for request in requests:
            head = heads[request.table]
            found = self._landed_seq(cur, request)
            if found is not None:
                seqs[request.table] = found
                continue
            self._check(cur, request, head.uuid, head.commit_seq, head.schema_id)
            todo.append(request)
        if todo:
            token = uuid.uuid4().hex
            results = self.client.batch(_CommitBatch(token, todo, heads, clock).statements())
            if results[-1].rows[0][0] != len(todo):
                return None
            seqs.update({r.table: heads[r.table].commit_seq + 1 for r in todo})
        return [seqs[r.table] for r in requests]

    def _heads(self, tables: list[str]) -> dict[str, _ReadHead]:
        marks = ", ".join("?" for _ in tables)
        rows = self.client.query("SELECT name, table_uuid, commit_seq, schema_id, last_commit_us, primary_key"
                                 f" FROM cf_tables WHERE name IN ({marks})", tables)
        heads = {row[0]: _ReadHead(*row[1:]) for row in rows}
        for table in sorted(tables):
            if table not in heads:
                raise TableNotFound(table)
        return heads

    # --- verbs that read and then decide --------------------------------------------------------

    def drop_table(self, name: str, uuid_: str, at_seq: int | None = None) -> bool:
        while True:  # loops only while commits move the head between our read and our batch
            rows = self.client.query("SELECT table_uuid, commit_seq FROM cf_tables WHERE name = ?", (name,))
            if not rows or rows[0][0] != uuid_ or (at_seq is not None and rows[0][1] != at_seq):
                return False
            token = uuid.uuid4().hex
            held = "EXISTS (SELECT 1 FROM cf_tables WHERE name = ? AND write_token = ?)"
            statements: list[Statement] = [
                ("UPDATE cf_tables SET write_token = ? WHERE name = ? AND table_uuid = ? AND commit_seq = ?",
                 (token, name, uuid_, rows[0][1]))]
            statements += [(f"DELETE FROM {owned} WHERE table_name = ? AND {held}", (name, name, token))
                           for owned in ("cf_parts", "cf_commits", "cf_manifests", "cf_schemas", "cf_cursors",
                                         "cf_staging")]
            statements.append(("DELETE FROM cf_tables WHERE name = ? AND write_token = ?", (name, token)))
            if self.client.batch(statements, rerun_unheard=True)[-1].changes == 1:
                return True

    def open_run(self, name: str, run_id: str, holder: str, now_us: int, lease_us: int) -> TableHead:
        results = self.client.batch([
            (("INSERT INTO cf_staging (table_name, run_id, holder, started_us, expires_us) SELECT ?, ?, ?, ?, ?"
             " WHERE EXISTS (SELECT 1 FROM cf_tables WHERE name = ?) ON CONFLICT (table_name, run_id) DO UPDATE"
             " SET holder = excluded.holder, expires_us = excluded.expires_us"),
             (name, run_id, holder, now_us, now_us + lease_us, name)),
            (_SELECT_HEADS.format(pin=_PIN_HEAD) + " WHERE t.name = ?", (name,))], rerun_unheard=True)
        if not results[1].rows:
            raise TableNotFound(name)  # the insert found no table either: no lease was taken
        return _head(results[1].rows[0][:-1])

    def take_cadence(self, deployment: str, holder: str, now_us: int, lease_us: int) -> CadenceHolder:
        while True:  # loops only while another holder moves the lease between our read and our write
            rows = self.client.query("SELECT holder, acquired_us, expires_us FROM cf_cadence_lease"
                                     " WHERE deployment = ?", (deployment,))
            row = rows[0] if rows else None
            if row is not None and row[0] != holder and row[2] > now_us and not holder_is_dead(row[0]):
                return CadenceHolder(deployment, row[0], row[1], row[2])
            acquired = row[1] if row is not None and row[0] == holder else now_us
            taken = (deployment, holder, acquired, now_us + lease_us)
            if row is None:
                statement: Statement = (("INSERT INTO cf_cadence_lease (deployment, holder, acquired_us, expires_us)"
                                        " VALUES (?, ?, ?, ?) ON CONFLICT (deployment) DO NOTHING"), taken)
            else:
                statement = (("UPDATE cf_cadence_lease SET holder = ?, acquired_us = ?, expires_us = ?"
                             " WHERE deployment = ? AND holder = ? AND acquired_us = ? AND expires_us = ?"),
                             (*taken[1:], deployment, *row))
            if self.client.batch([statement], rerun_unheard=True)[0].changes == 1:
                return CadenceHolder(*taken)

    def record_dispatch(self, deployment: str, entry: str, holder: str, now_us: int) -> bool:
        result = self.client.batch([(
            ("INSERT INTO cf_dispatches (deployment, entry, dispatched_us, holder) SELECT ?, ?, ?, ? WHERE EXISTS"
            " (SELECT 1 FROM cf_cadence_lease WHERE deployment = ? AND holder = ? AND expires_us > ?)"
            " ON CONFLICT (deployment, entry) DO UPDATE SET dispatched_us = excluded.dispatched_us,"
            " holder = excluded.holder"), (deployment, entry, now_us, holder, deployment, holder, now_us))],
            rerun_unheard=True)
        return result[0].changes == 1

    def reserve_instant(self, clock: Clock) -> int:
        results = self.client.batch([("UPDATE cf_clock SET last_commit_us = MAX(last_commit_us, ?) + 1 WHERE id = 1",
                                      (clock.now_us(),)),
                                     ("SELECT last_commit_us - 1 FROM cf_clock WHERE id = 1", ())],
                                    rerun_unheard=True)  # sent again, it reserves a later instant: as good
        return int(results[1].rows[0][0])


@dataclasses.dataclass(frozen=True)
class _ReadHead:
    uuid: str
    commit_seq: int
    schema_id: int
    last_commit_us: int
    merge: str
    """The ``primary_key`` column's text: the merge declaration (``storage.catalog.sql._Merge``)."""


@dataclasses.dataclass
class _CommitBatch:
    """The statements of one commit's batch (the module's docstring tells their three parts)."""

    token: str
    requests: list[CommitRequest]
    heads: dict[str, _ReadHead]
    clock: Clock

    def statements(self) -> list[Statement]:
        ordered = sorted(self.requests, key=lambda r: r.table)
        out: list[Statement] = []
        for request in ordered:
            head = self.heads[request.table]
            out.append((("UPDATE cf_tables SET write_token = ? WHERE name = ? AND table_uuid = ? AND commit_seq = ?"
                        " AND schema_id = ? AND primary_key = ?"),
                        (self.token, request.table, head.uuid, head.commit_seq, head.schema_id, head.merge)))
        for request in ordered:
            out += self._revocations(request)
        schema_ids = {r.table: self._updates(r, out) for r in ordered}
        floor = max([self.clock.now_us()] + [self.heads[r.table].last_commit_us for r in ordered])
        out.append(self._held("UPDATE cf_clock SET last_commit_us = MAX(last_commit_us, ?) WHERE id = 1", (floor,)))
        for request in ordered:
            out += self._landing(request, schema_ids[request.table])
        out.append(("SELECT COUNT(*) FROM cf_tables WHERE write_token = ?", (self.token,)))
        return out

    def _held(self, statement: str, params: Sequence[Any]) -> Statement:
        """``statement`` (an UPDATE or DELETE with a WHERE, or an INSERT … SELECT with one), run only
        while every table of the commit holds the token."""
        return f"{statement} AND {_HELD}", (*params, self.token, len(self.requests))

    def _insert(self, into: str, values: Sequence[Any], conflict: str = "") -> Statement:
        marks = ", ".join("?" for _ in values)
        return (f"INSERT INTO {into} SELECT {marks} WHERE {_HELD}{conflict}",
                (*values, self.token, len(self.requests)))

    def _revocations(self, request: CommitRequest) -> Iterator[Statement]:
        """A statement per requirement the head's compare-and-swap does not cover, taking the token back
        where it fails (``SqlCatalog._check`` checked each before the batch, naming the one that fails)."""
        table = request.table
        for req in request.requirements:
            if isinstance(req, AssertStaging):
                yield (_REVOKE + "NOT EXISTS (SELECT 1 FROM cf_staging WHERE table_name = ? AND run_id = ?)",
                       (self.token, table, req.run_id))
            elif isinstance(req, AssertWriter):
                fence = req.fence
                yield (_REVOKE + "NOT EXISTS (SELECT 1 FROM cf_journal_owners WHERE execution_id = ?"
                       " AND status = 'pending' AND holder = ? AND attempts = ?)",
                       (self.token, fence.execution_id, fence.holder, fence.attempt))
            elif isinstance(req, AssertPartsLive):
                for chunk in _chunks(sorted(set(req.paths)), CHUNK):
                    yield (_REVOKE + "(SELECT COUNT(*) FROM cf_parts WHERE table_name = ? AND removed_seq IS NULL"
                           f" AND path IN ({', '.join('?' for _ in chunk)})) != ?",
                           (self.token, table, *chunk, len(chunk)))
            elif isinstance(req, AssertRecordsPending):
                for keys in _chunks(sorted(set(req.keys)), CHUNK // 2):
                    either = " OR ".join("(run_id = ? AND phase = ?)" for _ in keys)
                    yield (_REVOKE + f"(SELECT COUNT(*) FROM cf_run_records WHERE flushed_seq IS NULL AND ({either}))"
                           " != ?", (self.token, *(v for key in keys for v in key), len(keys)))

    def _updates(self, request: CommitRequest, out: list[Statement]) -> int:
        """Append ``request``'s updates (as ``SqlCatalog._apply`` makes them); its schema id after them."""
        table, seq = request.table, self.heads[request.table].commit_seq + 1
        schema_id, merge_text = self.heads[table].schema_id, self.heads[table].merge
        for update in request.updates:
            if isinstance(update, RemoveAllParts):
                out.append(self._held("UPDATE cf_parts SET removed_seq = ? WHERE table_name = ?"
                                      " AND removed_seq IS NULL", (seq, table)))
            elif isinstance(update, RemoveParts):
                for chunk in _chunks(list(update.paths), CHUNK):
                    out.append(self._held(f"UPDATE cf_parts SET removed_seq = ? WHERE table_name = ? AND path IN"
                                          f" ({', '.join('?' for _ in chunk)}) AND removed_seq IS NULL",
                                          (seq, table, *chunk)))
            elif isinstance(update, AddParts):
                out += [self._insert("cf_parts (table_name, path, rows_count, bytes, added_seq, removed_seq, ord_seq,"
                                     " ord_idx, collected_us, schema_id)",
                                     (table, p.path, p.rows, p.bytes, seq, None,
                                      seq if p.ord_seq is None else p.ord_seq, p.ord_idx, None,
                                      schema_id if p.exact_schema else -1)) for p in update.parts]
            elif isinstance(update, SetSchema):
                schema_id += 1
                out.append(self._insert("cf_schemas (table_name, schema_id, schema_text)",
                                        (table, schema_id, update.schema)))
            elif isinstance(update, SetCursor):
                out.append(self._insert("cf_cursors (table_name, scope, value, commit_seq)",
                                        (table, update.scope, json.dumps(update.value), seq),
                                        " ON CONFLICT (table_name, scope) DO UPDATE SET value = excluded.value,"
                                        " commit_seq = excluded.commit_seq"))
            elif isinstance(update, RecordRun):
                out.append(self._insert("cf_run_records (run_id, phase, table_name, payload, recorded_us, flushed_seq)",
                                        (update.run_id, update.phase, update.table,
                                         json.dumps(dict(update.payload, commit_seq=seq)),
                                         int(update.payload.get("recorded_us", 0)), None),
                                        " ON CONFLICT (run_id, phase) DO UPDATE SET payload = excluded.payload,"
                                        " recorded_us = excluded.recorded_us, flushed_seq = NULL"))
            elif isinstance(update, MarkRecordsFlushed):
                for i, (run_id, phase) in enumerate(update.keys):
                    if update.payloads:
                        out.append(self._held("DELETE FROM cf_run_records WHERE run_id = ? AND phase = ?"
                                              " AND payload = ?", (run_id, phase, update.payloads[i])))
                    else:
                        out.append(self._held("DELETE FROM cf_run_records WHERE run_id = ? AND phase = ?",
                                              (run_id, phase)))
                out.append(self._held("DELETE FROM cf_run_records WHERE flushed_seq IS NOT NULL", ()))
            elif isinstance(update, DeclareOrderBy | DeclareFollows):
                declared = _declared(table, _Merge.parse(merge_text), update, seq).text()
                out.append(self._held("UPDATE cf_tables SET primary_key = ? WHERE name = ? AND primary_key = ?",
                                      (declared, table, merge_text)))
                merge_text = declared
        return schema_id

    def _landing(self, request: CommitRequest, schema_id: int) -> list[Statement]:
        """The commit-log row, the kept manifest, the end of the run's staging and the head's advance."""
        table, head = request.table, self.heads[request.table]
        seq = head.commit_seq + 1
        out: list[Statement] = [(_INSERT_COMMIT, (table, seq, request.run_id, request.kind, request.manifest, schema_id,
                                                  request.rows, self.token, len(self.requests)))]
        if request.manifest_doc is not None:
            out.append(self._insert("cf_manifests (table_name, run_id, doc)",
                                    (table, request.run_id, request.manifest_doc)))
        out.append(self._held("DELETE FROM cf_staging WHERE table_name = ? AND run_id = ?", (table, request.run_id)))
        out.append(self._held(f"UPDATE cf_tables SET commit_seq = ?, schema_id = ?, last_commit_us = {_CLOCK}"
                              " WHERE name = ? AND commit_seq = ?", (seq, schema_id, table, head.commit_seq)))
        return out


def _declared(table: str, merge: _Merge, update: DeclareOrderBy | DeclareFollows, seq: int) -> _Merge:
    """``merge`` with ``update``'s declaration, as ``SqlCatalog._apply`` makes it (the same conflicts)."""
    if isinstance(update, DeclareOrderBy):
        if merge.order_by is not None or merge.primary_key != update.primary_key:
            raise CommitConflict(table, "order_by is already declared", failed="DeclareOrderBy")
        return dataclasses.replace(merge, order_by=update.order_by, order_by_seq=seq)
    if merge.follows is not None:
        raise CommitConflict(table, "follows is already declared", failed="DeclareFollows")
    return dataclasses.replace(merge, follows=update.follows, follows_seq=seq)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _D1Cursor:
    """What a ``SqlCatalog`` write body is handed under D1: each statement is its own batch, committed
    when it answers. Safe only for a body whose statements each stand alone; :class:`D1Catalog`
    rewrites every verb whose body reads and then decides."""

    def __init__(self, client: D1Client) -> None:
        self._client = client
        self._rows: list[tuple[Any, ...]] = []
        self.rowcount = 0

    def execute(self, statement: str, params: Sequence[Any] = ()) -> None:
        result = self._client.batch([(statement, tuple(params))])[0]
        self._rows, self.rowcount = list(result.rows), result.changes

    def executemany(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        if rows:  # one batch: every row or none
            results = self._client.batch([(statement, tuple(row)) for row in rows])
            self._rows, self.rowcount = [], sum(r.changes for r in results)

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None
