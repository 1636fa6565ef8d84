"""The local profile's publication state in the store's SQLite catalog database, beside its other
``cf_`` tables: producer completions (``cf_publication_completions``, ``run.export.group-source``)
and the sender's group outbox (``cf_publication_groups`` and ``cf_publication_events``,
``run.export.group-delivery``; a staged event's row never changes: triggers refuse it; its groups in
staging order, ``run.export.group-checkpoint`` reads them whole and restores them).

A completion is one row keyed by its run id; triggers refuse every UPDATE and DELETE, so a recorded
completion is immutable in the database itself, not by this module's good manners. Recording a run
again keeps the first row (``INSERT … ON CONFLICT DO NOTHING``) and answers it.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

from contextful.engine.export.publications import Completion
from contextful.engine.export.publications.identity import GroupIdentity
from contextful.engine.export.publications.outbox import GroupEvent, StagedGroup
from contextful.storage.port_dialects import SqliteFilePort

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cf_publication_completions (
        run_id TEXT PRIMARY KEY,
        producer TEXT NOT NULL,
        recorded_us INTEGER NOT NULL,
        body TEXT NOT NULL)""",
    ("CREATE INDEX IF NOT EXISTS cf_publication_completions_producer "
    "ON cf_publication_completions (producer, recorded_us)"),
    """CREATE TRIGGER IF NOT EXISTS cf_publication_completions_immutable BEFORE UPDATE
        ON cf_publication_completions BEGIN SELECT RAISE(ABORT, 'a producer completion is immutable'); END""",
    """CREATE TRIGGER IF NOT EXISTS cf_publication_completions_kept BEFORE DELETE
        ON cf_publication_completions BEGIN SELECT RAISE(ABORT, 'a producer completion is immutable'); END""",
)


class SqliteCompletions(SqliteFilePort):
    """:class:`~contextful.engine.export.publications.CompletionStore` over the catalog's SQLite file."""

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = self._connect()
        for statement in SCHEMA:
            conn.execute(statement)
        return conn

    def record(self, completion: Completion) -> Completion:
        with closing(self._connection()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO cf_publication_completions (run_id, producer, recorded_us, body) "
                         "VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                         (completion.run_id, completion.producer, completion.recorded_us, completion.body()))
            row = conn.execute("SELECT body FROM cf_publication_completions WHERE run_id = ?",
                               (completion.run_id,)).fetchone()
            conn.execute("COMMIT")
        return Completion.from_json(json.loads(row[0]))

    def latest(self, producer: str) -> Completion | None:
        with closing(self._connection()) as conn:
            row = conn.execute("SELECT body FROM cf_publication_completions WHERE producer = ? "
                               "ORDER BY recorded_us DESC, rowid DESC LIMIT 1", (producer,)).fetchone()
        return None if row is None else Completion.from_json(json.loads(row[0]))

    def of_run(self, run_id: str) -> Completion | None:
        with closing(self._connection()) as conn:
            row = conn.execute("SELECT body FROM cf_publication_completions WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else Completion.from_json(json.loads(row[0]))


GROUP_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cf_publication_groups (
        group_id TEXT PRIMARY KEY,
        publication TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        identity TEXT NOT NULL,
        events INTEGER NOT NULL,
        acknowledged INTEGER NOT NULL DEFAULT 0,
        UNIQUE (publication, sequence))""",
    """CREATE TABLE IF NOT EXISTS cf_publication_events (
        group_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        event_id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (group_id, sequence))""",
    """CREATE TRIGGER IF NOT EXISTS cf_publication_events_immutable BEFORE UPDATE
        ON cf_publication_events BEGIN SELECT RAISE(ABORT, 'a staged event is immutable'); END""",
)


class SqliteGroupOutbox(SqliteFilePort):
    """:class:`~contextful.engine.export.publications.outbox.GroupOutbox` over the catalog's SQLite file."""

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = self._connect()
        for statement in GROUP_SCHEMA:
            conn.execute(statement)
        return conn

    def _group(self, conn: sqlite3.Connection, where: str, args: tuple[object, ...]) -> StagedGroup | None:
        row = conn.execute(f"SELECT group_id, publication, identity, acknowledged FROM cf_publication_groups "
                           f"WHERE {where} ORDER BY sequence DESC LIMIT 1", args).fetchone()
        if row is None:
            return None
        events = tuple(GroupEvent(event_id, sequence, kind, payload) for event_id, sequence, kind, payload in
                       conn.execute("SELECT event_id, sequence, kind, payload FROM cf_publication_events "
                                    "WHERE group_id = ? ORDER BY sequence", (row[0],)))
        return StagedGroup(row[1], GroupIdentity.from_json(json.loads(row[2])), events, row[3])

    def pending(self, publication: str) -> StagedGroup | None:
        with closing(self._connection()) as conn:
            return self._group(conn, "publication = ? AND acknowledged < events", (publication,))

    def last_acknowledged(self, publication: str) -> StagedGroup | None:
        with closing(self._connection()) as conn:
            return self._group(conn, "publication = ? AND acknowledged = events", (publication,))

    def stage(self, publication: str, identity: GroupIdentity, events: tuple[GroupEvent, ...]) -> StagedGroup:
        group_id = identity.group_id
        with closing(self._connection()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._insert(conn, publication, identity, events, 0)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            staged = self._group(conn, "group_id = ?", (group_id,))
        assert staged is not None
        return staged

    @staticmethod
    def _insert(conn: sqlite3.Connection, publication: str, identity: GroupIdentity, events: tuple[GroupEvent, ...],
                acknowledged: int) -> None:
        """Insert a group at the publication's next staging position (a group held already: nothing)."""
        group_id = identity.group_id
        inserted = conn.execute(
            "INSERT INTO cf_publication_groups (group_id, publication, sequence, identity, events, acknowledged) "
            "SELECT ?, ?, COALESCE(MAX(sequence), 0) + 1, ?, ?, ? FROM cf_publication_groups WHERE publication = ? "
            "ON CONFLICT (group_id) DO NOTHING",
            (group_id, publication, json.dumps(identity.to_json(), sort_keys=True), len(events), acknowledged,
             publication)).rowcount
        if inserted:
            conn.executemany("INSERT INTO cf_publication_events (group_id, sequence, event_id, kind, payload) "
                             "VALUES (?, ?, ?, ?, ?)",
                             [(group_id, e.sequence, e.event_id, e.kind, e.payload) for e in events])

    def groups(self, publication: str) -> tuple[StagedGroup, ...]:
        with closing(self._connection()) as conn:
            ids = [row[0] for row in conn.execute("SELECT group_id FROM cf_publication_groups WHERE publication = ? "
                                                  "ORDER BY sequence", (publication,))]
            found = [self._group(conn, "group_id = ?", (group_id,)) for group_id in ids]
        return tuple(g for g in found if g is not None)

    def restore(self, publication: str, group: StagedGroup) -> StagedGroup:
        with closing(self._connection()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._insert(conn, publication, group.identity, group.events, group.acknowledged)
                conn.execute("UPDATE cf_publication_groups SET acknowledged = MAX(acknowledged, ?) "
                             "WHERE group_id = ? AND publication = ?", (group.acknowledged, group.group_id, publication))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            restored = self._group(conn, "group_id = ?", (group.group_id,))
        assert restored is not None
        return restored

    def acknowledge(self, publication: str, group_id: str, sequence: int) -> None:
        with closing(self._connection()) as conn:
            conn.execute("UPDATE cf_publication_groups SET acknowledged = ? WHERE group_id = ? AND publication = ? "
                         "AND acknowledged = ?", (sequence + 1, group_id, publication, sequence))
