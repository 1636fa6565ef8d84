"""The awakeable store's SQL, shared by the SQLite and PostgreSQL adapters: one table
``cf_awakeables`` beside the journal's tables, keyed on the token and unique on the step.

A mint is ``INSERT … ON CONFLICT DO NOTHING`` followed by a read of the step's row, so a second
minter of one step waits for the first insert to commit and reads its token. A settlement — a
resolution or a timeout — is one conditional ``UPDATE … WHERE state = 'pending'``: on PostgreSQL a
racing update of the same row (another resolver, or the waiter settling it timed-out) waits for the
first to commit, re-evaluates its condition and changes nothing; on SQLite the single writer lock
serializes them the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from contextful.storage.awakeables import PENDING, AwakeableRow, AwakeableStore
from contextful.storage.dbapi import SqlDialect
from contextful.storage.errors import ContextfulError

COLUMNS = ("token", "execution_id", "seq", "label", "state", "created_us", "deadline_us", "payload",
           "resolved_us", "subject")

DDL = """CREATE TABLE IF NOT EXISTS cf_awakeables (
    token TEXT PRIMARY KEY, execution_id TEXT NOT NULL, seq BIGINT NOT NULL, label TEXT NOT NULL,
    state TEXT NOT NULL, created_us BIGINT NOT NULL, deadline_us BIGINT NOT NULL, payload {blob},
    resolved_us BIGINT, subject TEXT, UNIQUE (execution_id, seq))"""

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM cf_awakeables"


def _row(row: Any) -> AwakeableRow:
    return AwakeableRow(token=row[0], execution_id=row[1], seq=int(row[2]), label=row[3], state=row[4],
                        created_us=int(row[5]), deadline_us=int(row[6]),
                        payload=None if row[7] is None else bytes(row[7]),
                        resolved_us=None if row[8] is None else int(row[8]), subject=row[9])


class SqlAwakeableStore(SqlDialect, AwakeableStore, ABC):
    """An awakeable store over one DB-API connection; adapters fill in the dialect hooks."""

    placeholder = "?"
    blob_type = "BLOB"

    def __init__(self) -> None:
        self._open_connection()

        def create(cur: Any) -> None:
            self._lock_ddl(cur)
            cur.execute(DDL.format(blob=self.blob_type))

        self._write(create, rerun_unheard=True)

    @abstractmethod
    def _connect(self) -> Any: ...

    @abstractmethod
    def _begin_write(self, cur: Any, durable: bool = True) -> None: ...

    @abstractmethod
    def _map_error(self, exc: Exception) -> ContextfulError | None: ...

    def _lock_ddl(self, cur: Any) -> None:
        """Serialize table creation between processes opening the store at once."""

    def close_store(self) -> None:
        with self._lock:
            self._conn.close()

    def _insert_pending(self, row: AwakeableRow) -> AwakeableRow:
        self._write(lambda cur: cur.execute(
            self._sql(f"INSERT INTO cf_awakeables ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
                      " ON CONFLICT DO NOTHING"),
            tuple(getattr(row, c) for c in COLUMNS)), rerun_unheard=True)
        stored = self._query_rows(f"{_SELECT} WHERE execution_id = ? AND seq = ?", (row.execution_id, row.seq))
        return _row(stored[0])

    def _settle(self, token: str, state: str, payload: bytes | None, subject: str | None,
                resolved_us: int | None) -> None:
        # Conditional on the row still pending, so sending it again after a lost answer is harmless.
        self._write(lambda cur: cur.execute(
            self._sql("UPDATE cf_awakeables SET state = ?, payload = ?, resolved_us = ?, subject = ?"
                      " WHERE token = ? AND state = ?"),
            (state, payload, resolved_us, subject, token, PENDING)), rerun_unheard=True)

    def get(self, token: str) -> AwakeableRow | None:
        rows = self._query_rows(f"{_SELECT} WHERE token = ?", (token,))
        return _row(rows[0]) if rows else None

    def rows_of(self, execution_id: str) -> list[AwakeableRow]:
        return [_row(r) for r in self._query_rows(f"{_SELECT} WHERE execution_id = ? ORDER BY seq",
                                                  (execution_id,))]

    def pending_under(self, prefix: str) -> list[AwakeableRow]:
        start = prefix + "/"  # a range on the key, not LIKE: a prefix holding % or _ means itself
        return [_row(r) for r in self._query_rows(
            f"{_SELECT} WHERE state = ? AND execution_id >= ? AND execution_id < ? ORDER BY execution_id, seq",
            (PENDING, start, prefix + "0"))]
