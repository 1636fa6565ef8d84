"""Outbox adapter: tables ``cf_outbox_streams``, ``cf_outbox_events`` and ``cf_outbox_state`` in the
execution database's PostgreSQL schema (psycopg 3).

Every write locks its stream's row (``SELECT … FOR UPDATE``, after inserting it when new), so
stagers and acknowledgers of one stream serialize across connections and processes: seqs are
handed out in commit order, a stager decides what is new against the checkpoint and the pending
events as the previous write left them, and an acknowledgement sees exactly the events pending at
its turn. A fenced write first reads its owner row in ``cf_journal_owners`` ``FOR SHARE``
(:meth:`~contextful.storage.fence.WriterFence.check_sql`): a takeover's ``FOR UPDATE`` of that row
waits for the write, and a write after the takeover is refused. Shared locks do not conflict, so a
write made inside the same execution's admission block (which holds the row ``FOR SHARE`` on the
journal's connection) proceeds.

A schema made before checkpoints were integers and events carried their log position is brought
up to date when the store opens: the checkpoint column becomes ``BIGINT`` (the exporter's text was
a number) and each pending event takes its stream's checkpoint as its position (it was staged
through it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contextful.storage.dbapi import SqlDialect
from contextful.storage.errors import OutboxFrontierGap
from contextful.storage.fence import WriterFence
from contextful.storage.outbox import OutboxEvent, OutboxStore, Staged, StreamState
from contextful.storage.port_dialects import PostgresSchemaPort

DDL = (
    """CREATE TABLE IF NOT EXISTS cf_outbox_streams (
        stream TEXT PRIMARY KEY, frontier BIGINT NOT NULL, next_seq BIGINT NOT NULL, checkpoint BIGINT)""",
    """CREATE TABLE IF NOT EXISTS cf_outbox_events (
        stream TEXT NOT NULL, seq BIGINT NOT NULL, event_id TEXT NOT NULL, kind TEXT NOT NULL,
        payload BYTEA NOT NULL, staged_us BIGINT NOT NULL, position BIGINT NOT NULL,
        PRIMARY KEY (stream, event_id), UNIQUE (stream, seq))""",
    """CREATE TABLE IF NOT EXISTS cf_outbox_state (
        stream TEXT NOT NULL, key TEXT NOT NULL, value BYTEA NOT NULL, frontier BIGINT NOT NULL,
        PRIMARY KEY (stream, key))""",
)
TABLES = ("cf_outbox_streams", "cf_outbox_events", "cf_outbox_state")

_EVENT = "SELECT stream, seq, position, event_id, kind, payload, staged_us FROM cf_outbox_events"


def _event(row: Any) -> OutboxEvent:
    return OutboxEvent(row[0], int(row[1]), int(row[2]), row[3], row[4], bytes(row[5]), int(row[6]))


def _upgrade(cur: Any) -> None:
    """Bring tables made before integer checkpoints and event positions up to date (see the module)."""
    cur.execute("SELECT table_name, column_name, data_type FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name IN ('cf_outbox_streams', 'cf_outbox_events')")
    columns = {(table, column): kind for table, column, kind in cur.fetchall()}
    if columns.get(("cf_outbox_streams", "checkpoint")) == "text":
        cur.execute("ALTER TABLE cf_outbox_streams ALTER COLUMN checkpoint TYPE BIGINT USING checkpoint::bigint")
    if ("cf_outbox_events", "position") not in columns:
        cur.execute("ALTER TABLE cf_outbox_events ADD COLUMN position BIGINT")
        cur.execute("UPDATE cf_outbox_events e SET position = COALESCE(s.checkpoint, 0) FROM cf_outbox_streams s"
                    " WHERE s.stream = e.stream")
        cur.execute("ALTER TABLE cf_outbox_events ALTER COLUMN position SET NOT NULL")


class PostgresOutboxStore(PostgresSchemaPort, SqlDialect, OutboxStore):
    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._open_connection()

        def create(cur: Any) -> None:
            self._lock_ddl(cur)
            for statement in DDL:
                cur.execute(statement)
            _upgrade(cur)

        self._write(create, rerun_unheard=True)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @staticmethod
    def _lock_stream(cur: Any, stream: str) -> tuple[int, int, int | None]:
        """Lock ``stream``'s row (made when new); its frontier, next seq and checkpoint."""
        cur.execute("INSERT INTO cf_outbox_streams (stream, frontier, next_seq) VALUES (%s, 0, 1)"
                    " ON CONFLICT (stream) DO NOTHING", (stream,))
        cur.execute("SELECT frontier, next_seq, checkpoint FROM cf_outbox_streams WHERE stream = %s FOR UPDATE",
                    (stream,))
        frontier, next_seq, checkpoint = cur.fetchone()
        return int(frontier), int(next_seq), None if checkpoint is None else int(checkpoint)

    def _fence(self, cur: Any, fence: WriterFence | None) -> None:
        if fence is not None:
            fence.check_sql(cur, self._sql, " FOR SHARE")

    def _stage(self, stream: str, events: list[Staged], checkpoint: int, now_us: int,
               fence: WriterFence | None) -> list[OutboxEvent]:
        def body(cur: Any) -> list[OutboxEvent]:
            self._fence(cur, fence)
            _, next_seq, staged_through = self._lock_stream(cur, stream)
            stored = []
            for position, event_id, kind, payload in events:  # bounded by one staging batch
                cur.execute(f"{_EVENT} WHERE stream = %s AND event_id = %s", (stream, event_id))
                row = cur.fetchone()
                if row is None:
                    if staged_through is not None and position <= staged_through:
                        continue  # staged before and no longer pending: it was acknowledged
                    row = (stream, next_seq, position, event_id, kind, bytes(payload), now_us)
                    cur.execute("INSERT INTO cf_outbox_events (stream, seq, position, event_id, kind, payload,"
                                " staged_us) VALUES (%s, %s, %s, %s, %s, %s, %s)", row)
                    next_seq += 1
                stored.append(_event(row))
            cur.execute("UPDATE cf_outbox_streams SET next_seq = %s, checkpoint = GREATEST(checkpoint, %s)"
                        " WHERE stream = %s", (next_seq, checkpoint, stream))
            return stored

        return self._write(body, rerun_unheard=True)

    def pending(self, stream: str) -> list[OutboxEvent]:
        return [_event(row) for row in self._query_rows(f"{_EVENT} WHERE stream = %s ORDER BY seq", (stream,))]

    def _acknowledge(self, stream: str, event_ids: list[str], state: Mapping[str, bytes],
                     fence: WriterFence | None) -> int:
        def body(cur: Any) -> int:
            self._fence(cur, fence)
            frontier, _, _ = self._lock_stream(cur, stream)
            cur.execute("SELECT seq, event_id FROM cf_outbox_events WHERE stream = %s ORDER BY seq LIMIT %s",
                        (stream, len(event_ids)))
            oldest = cur.fetchall()
            if [row[1] for row in oldest] != event_ids:
                raise OutboxFrontierGap(stream, tuple(row[1] for row in oldest), tuple(event_ids))
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
        return StreamState(stream, int(frontier), None if checkpoint is None else int(checkpoint), int(pending))

    def acknowledged(self, stream: str, key: str) -> bytes | None:
        rows = self._query_rows("SELECT value FROM cf_outbox_state WHERE stream = %s AND key = %s", (stream, key))
        return bytes(rows[0][0]) if rows else None
