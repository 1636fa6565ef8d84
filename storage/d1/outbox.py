"""Outbox adapter of the D1 profile: ``cf_outbox_streams``, ``cf_outbox_events`` and ``cf_outbox_state`` in D1.

Implements ``run.export.d1-state`` (decision "d1-execution-state": under the D1 profile, D1 commits
export outboxes, acknowledged keyed state and log checkpoints) and the outbox side of
``run.export.writer-fenced``, through the private Worker (``storage.d1.client``). The port's rules
are the PostgreSQL adapter's (``storage.outbox.postgres``); what changes is how a write serializes.
PostgreSQL locks the stream's row ``FOR UPDATE`` and decides under the lock; D1 holds nothing
between requests, so a stage or an acknowledgement reads the stream (its row, the events it
concerns, the writer's owner row) in one batch, decides in Python, and sends one batch whose first
statement takes a fresh write token on the stream's row where the row is still as read (decision
"d1-coordinated-groups": each later statement predicates on the token, so a lost race changes no
row). Every event a stage inserts bumps ``next_seq`` and every acknowledgement that deletes events
moves ``frontier``, so a row still as read means the events are as read too. A fenced write adds a
statement taking the token back unless the owner row still admits the attempt. The batch's last
statement says whether the token held: if not, nothing changed, and the write reads and decides
again (``ExecutionWriterFenced`` if the fence is what failed).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from contextful.storage.d1.client import BatchResult, D1Client, Statement
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import OutboxFrontierGap
from contextful.storage.fence import OWNER_FENCE_COLUMNS, WriterFence
from contextful.storage.outbox import OutboxEvent, OutboxStore, Staged, StreamState
from contextful.storage.outbox.postgres import DDL

CHUNK = 90
"""Event ids per statement: under D1's 100 bound parameters."""

_EVENT = "SELECT stream, seq, position, event_id, kind, payload, staged_us FROM cf_outbox_events"
_STREAM = "SELECT frontier, next_seq, checkpoint FROM cf_outbox_streams WHERE stream = ?"
_HELD = "EXISTS (SELECT 1 FROM cf_outbox_streams WHERE stream = ? AND write_token = ?)"
_FENCE_FAILS = ("NOT EXISTS (SELECT 1 FROM cf_journal_owners WHERE execution_id = ? AND status = 'pending'"
                " AND holder = ? AND attempts = ?)")
_NEW_STREAM = "INSERT INTO cf_outbox_streams (stream, frontier, next_seq) VALUES (?, 0, 1) ON CONFLICT (stream) DO NOTHING"
_TAKE = ("UPDATE cf_outbox_streams SET write_token = ? WHERE stream = ? AND frontier = ? AND next_seq = ?"
         " AND checkpoint IS ?")
_REVOKE_UNFENCED = f"UPDATE cf_outbox_streams SET write_token = NULL WHERE stream = ? AND write_token = ? AND {_FENCE_FAILS}"
_TOKEN_HELD = "SELECT COUNT(*) FROM cf_outbox_streams WHERE stream = ? AND write_token = ?"
_INSERT_EVENT = ("INSERT INTO cf_outbox_events (stream, seq, position, event_id, kind, payload, staged_us)"
                 " SELECT ?, ?, ?, ?, ?, ?, ? WHERE <held>")
_STAGED_THROUGH = ("UPDATE cf_outbox_streams SET next_seq = ?, checkpoint = MAX(COALESCE(checkpoint, ?), ?)"
                   " WHERE stream = ? AND <held>")
_PUT_STATE = ("INSERT INTO cf_outbox_state (stream, key, value, frontier) SELECT ?, ?, ?, ? WHERE <held>"
              " ON CONFLICT (stream, key) DO UPDATE SET value = excluded.value, frontier = excluded.frontier")


def _event(row: Any) -> OutboxEvent:
    return OutboxEvent(row[0], int(row[1]), int(row[2]), row[3], row[4], bytes(row[5]), int(row[6]))


class D1OutboxStore(OutboxStore):
    def __init__(self, client: D1Client) -> None:
        self.client = client
        statements: list[Statement] = [(statement.replace("BYTEA", "BLOB"), ()) for statement in DDL]
        columns = client.query("SELECT name FROM pragma_table_info(?)", (client.sql("cf_outbox_streams"),))
        if ("write_token",) not in columns:
            statements.append(("ALTER TABLE cf_outbox_streams ADD COLUMN write_token TEXT", ()))
        client.batch(statements, rerun_unheard=True)

    # --- reads ----------------------------------------------------------------------------------

    def _read(self, stream: str, reads: list[Statement], fence: WriterFence | None) -> tuple[
            tuple[int, int, int | None], list[BatchResult]]:
        """The stream's ``(frontier, next_seq, checkpoint)`` (a new stream's when absent) and ``reads``'
        results, all read in one batch; ExecutionWriterFenced when ``fence`` no longer holds."""
        owner: list[Statement] = [] if fence is None else [
            (f"SELECT {OWNER_FENCE_COLUMNS} FROM cf_journal_owners WHERE execution_id = ?", (fence.execution_id,))]
        results = self.client.batch([(_STREAM, (stream,)), *owner, *reads], write=False)
        if fence is not None:
            _refuse_unless_held(fence, results[1])
        row = results[0].rows[0] if results[0].rows else (0, 1, None)
        state = (int(row[0]), int(row[1]), None if row[2] is None else int(row[2]))
        return state, results[1 + len(owner):]

    # --- the conditional batch ------------------------------------------------------------------

    def _swap(self, stream: str, read: tuple[int, int, int | None], writes: list[Statement],
              fence: WriterFence | None) -> bool:
        """Send ``writes`` (each predicated on the token: :meth:`_held`) behind the token's compare-and-
        swap on the stream's row as ``read``; whether they landed. ExecutionWriterFenced when the fence
        took the token back."""
        token = uuid.uuid4().hex
        frontier, next_seq, checkpoint = read
        statements: list[Statement] = [(_NEW_STREAM, (stream,)),
                                       (_TAKE, (token, stream, frontier, next_seq, checkpoint))]
        if fence is not None:
            statements.append((_REVOKE_UNFENCED, (stream, token, fence.execution_id, fence.holder, fence.attempt)))
        statements += [(sql.replace("<held>", _HELD), (*params, stream, token)) for sql, params in writes]
        statements.append((_TOKEN_HELD, (stream, token)))
        if fence is not None:
            statements.append((f"SELECT {OWNER_FENCE_COLUMNS} FROM cf_journal_owners WHERE execution_id = ?",
                                (fence.execution_id,)))
        results = self.client.batch(statements)
        if fence is not None:
            _refuse_unless_held(fence, results[-1])
            results = results[:-1]
        return bool(results[-1].rows[0][0])

    # --- the port -------------------------------------------------------------------------------

    def _stage(self, stream: str, events: list[Staged], checkpoint: int, now_us: int,
               fence: WriterFence | None) -> list[OutboxEvent]:
        ids = [event_id for _, event_id, _, _ in events]
        reads: list[Statement] = [(f"{_EVENT} WHERE stream = ? AND event_id IN ({', '.join('?' for _ in chunk)})",
                                   (stream, *chunk)) for chunk in _chunks(ids)]
        unheard = 0
        while True:  # loops only while other writers move the stream between our read and our batch
            read, results = self._read(stream, reads, fence)
            found = {row[3]: row for result in results for row in result.rows}
            _, next_seq, staged_through = read
            stored: list[OutboxEvent] = []
            writes: list[Statement] = []
            for position, event_id, kind, payload in events:  # bounded by one staging batch
                row = found.get(event_id)
                if row is None:
                    if staged_through is not None and position <= staged_through:
                        continue  # staged before and no longer pending: it was acknowledged
                    row = (stream, next_seq, position, event_id, kind, bytes(payload), now_us)
                    writes.append((_INSERT_EVENT, row))
                    next_seq += 1
                stored.append(_event(row))
            writes.append((_STAGED_THROUGH, (next_seq, checkpoint, checkpoint, stream)))
            try:
                if self._swap(stream, read, writes, fence):
                    return stored
            except CommitUnheard:
                unheard += 1  # read again: a stage that landed finds its events pending or acknowledged
                if unheard == 2:
                    raise

    def pending(self, stream: str) -> list[OutboxEvent]:
        return [_event(row) for row in self.client.query(f"{_EVENT} WHERE stream = ? ORDER BY seq", (stream,))]

    def _acknowledge(self, stream: str, event_ids: list[str], state: Mapping[str, bytes],
                     fence: WriterFence | None) -> int:
        oldest: Statement = ("SELECT seq, event_id FROM cf_outbox_events WHERE stream = ? ORDER BY seq LIMIT ?",
                             (stream, len(event_ids)))
        while True:  # loops only while other writers move the stream between our read and our batch
            read, (results,) = self._read(stream, [oldest], fence)
            if [row[1] for row in results.rows] != event_ids:
                raise OutboxFrontierGap(stream, tuple(row[1] for row in results.rows), tuple(event_ids))
            frontier = int(results.rows[-1][0]) if results.rows else read[0]
            writes: list[Statement] = [("DELETE FROM cf_outbox_events WHERE stream = ? AND seq <= ? AND <held>",
                                        (stream, frontier))]
            writes += [(_PUT_STATE, (stream, key, bytes(value), frontier)) for key, value in state.items()]
            writes.append(("UPDATE cf_outbox_streams SET frontier = ? WHERE stream = ? AND <held>", (frontier, stream)))
            if self._swap(stream, read, writes, fence):  # a lost answer is CommitUnheard, as on PostgreSQL
                return frontier

    def stream_state(self, stream: str) -> StreamState:
        rows = self.client.query("SELECT s.frontier, s.checkpoint, (SELECT COUNT(*) FROM cf_outbox_events e"
                                 " WHERE e.stream = s.stream) AS pending FROM cf_outbox_streams s WHERE s.stream = ?",
                                 (stream,))
        if not rows:
            return StreamState(stream, 0, None, 0)
        frontier, checkpoint, pending = rows[0]
        return StreamState(stream, int(frontier), None if checkpoint is None else int(checkpoint), int(pending))

    def acknowledged(self, stream: str, key: str) -> bytes | None:
        rows = self.client.query("SELECT value FROM cf_outbox_state WHERE stream = ? AND key = ?", (stream, key))
        return bytes(rows[0][0]) if rows else None


def _refuse_unless_held(fence: WriterFence, owner: BatchResult) -> None:
    reason = fence.refusal_of(owner.rows[0] if owner.rows else None)
    if reason is not None:
        raise fence.refuse(reason)


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[start : start + CHUNK] for start in range(0, len(ids), CHUNK)]
