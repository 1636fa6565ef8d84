"""Outbox adapter: tables ``cf_outbox_streams``, ``cf_outbox_events`` and ``cf_outbox_state`` in the
execution database's PostgreSQL schema (psycopg 3).

Every write locks its stream's row (``SELECT … FOR UPDATE``, after inserting it when new), so
stagers and acknowledgers of one stream serialize across connections and processes: seqs are
handed out in commit order and an acknowledgement sees exactly the events pending at its turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextful.storage.dbapi import SqlDialect
from contextful.storage.errors import OutboxFrontierGap
from contextful.storage.outbox import OutboxEvent, OutboxStore, StreamState
from contextful.storage.port_dialects import PostgresSchemaPort

DDL = (
    """CREATE TABLE IF NOT EXISTS cf_outbox_streams (
        stream TEXT PRIMARY KEY, frontier BIGINT NOT NULL, next_seq BIGINT NOT NULL, checkpoint TEXT)""",
    """CREATE TABLE IF NOT EXISTS cf_outbox_events (
        stream TEXT NOT NULL, seq BIGINT NOT NULL, event_id TEXT NOT NULL, kind TEXT NOT NULL,
        payload BYTEA NOT NULL, staged_us BIGINT NOT NULL, PRIMARY KEY (stream, event_id), UNIQUE (stream, seq))""",
    """CREATE TABLE IF NOT EXISTS cf_outbox_state (
        stream TEXT NOT NULL, key TEXT NOT NULL, value BYTEA NOT NULL, frontier BIGINT NOT NULL,
        PRIMARY KEY (stream, key))""",
)
TABLES = ("cf_outbox_streams", "cf_outbox_events", "cf_outbox_state")

_EVENT = "SELECT stream, seq, event_id, kind, payload, staged_us FROM cf_outbox_events"


def _event(row: Any) -> OutboxEvent:
    return OutboxEvent(row[0], int(row[1]), row[2], row[3], bytes(row[4]), int(row[5]))


class PostgresOutboxStore(PostgresSchemaPort, SqlDialect, OutboxStore):
    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._open_connection()

        def create(cur: Any) -> None:
            self._lock_ddl(cur)
            for statement in DDL:
                cur.execute(statement)

        self._write(create, rerun_unheard=True)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @staticmethod
    def _lock_stream(cur: Any, stream: str) -> tuple[int, int]:
        """Lock ``stream``'s row (made when new); its frontier and next seq."""
        cur.execute("INSERT INTO cf_outbox_streams (stream, frontier, next_seq) VALUES (%s, 0, 1)"
                    " ON CONFLICT (stream) DO NOTHING", (stream,))
        cur.execute("SELECT frontier, next_seq FROM cf_outbox_streams WHERE stream = %s FOR UPDATE", (stream,))
        frontier, next_seq = cur.fetchone()
        return int(frontier), int(next_seq)

    def stage(self, stream: str, events: Sequence[tuple[str, str, bytes]], checkpoint: str | None,
              now_us: int) -> list[OutboxEvent]:
        def body(cur: Any) -> list[OutboxEvent]:
            _, next_seq = self._lock_stream(cur, stream)
            stored = []
            for event_id, kind, payload in events:  # bounded by one staging batch
                cur.execute("INSERT INTO cf_outbox_events (stream, seq, event_id, kind, payload, staged_us)"
                            " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (stream, event_id) DO NOTHING",
                            (stream, next_seq, event_id, kind, bytes(payload), now_us))
                next_seq += cur.rowcount
                cur.execute(f"{_EVENT} WHERE stream = %s AND event_id = %s", (stream, event_id))
                stored.append(_event(cur.fetchone()))
            cur.execute("UPDATE cf_outbox_streams SET next_seq = %s, checkpoint = COALESCE(%s, checkpoint)"
                        " WHERE stream = %s", (next_seq, checkpoint, stream))
            return stored

        return self._write(body, rerun_unheard=True)

    def pending(self, stream: str) -> list[OutboxEvent]:
        return [_event(row) for row in self._query_rows(f"{_EVENT} WHERE stream = %s ORDER BY seq", (stream,))]

    def acknowledge(self, stream: str, event_ids: Sequence[str], state: Mapping[str, bytes]) -> int:
        ids = list(event_ids)

        def body(cur: Any) -> int:
            frontier, _ = self._lock_stream(cur, stream)
            cur.execute("SELECT seq, event_id FROM cf_outbox_events WHERE stream = %s ORDER BY seq LIMIT %s",
                        (stream, len(ids)))
            oldest = cur.fetchall()
            if [row[1] for row in oldest] != ids:
                raise OutboxFrontierGap(stream, tuple(row[1] for row in oldest), tuple(ids))
            if oldest:
                frontier = int(oldest[-1][0])
                cur.execute("DELETE FROM cf_outbox_events WHERE stream = %s AND seq <= %s", (stream, frontier))
            for key, value in state.items():
                cur.execute("INSERT INTO cf_outbox_state (stream, key, value, frontier) VALUES (%s, %s, %s, %s)"
                            " ON CONFLICT (stream, key) DO UPDATE SET value = excluded.value,"
                            " frontier = excluded.frontier", (stream, key, bytes(value), frontier))
            cur.execute("UPDATE cf_outbox_streams SET frontier = %s WHERE stream = %s", (frontier, stream))
            return frontier

        return self._write(body)

    def stream_state(self, stream: str) -> StreamState:
        rows = self._query_rows("SELECT s.frontier, s.checkpoint, (SELECT count(*) FROM cf_outbox_events e"
                                " WHERE e.stream = s.stream) FROM cf_outbox_streams s WHERE s.stream = %s", (stream,))
        if not rows:
            return StreamState(stream, 0, None, 0)
        frontier, checkpoint, pending = rows[0]
        return StreamState(stream, int(frontier), checkpoint, int(pending))

    def acknowledged(self, stream: str, key: str) -> bytes | None:
        rows = self._query_rows("SELECT value FROM cf_outbox_state WHERE stream = %s AND key = %s", (stream, key))
        return bytes(rows[0][0]) if rows else None
