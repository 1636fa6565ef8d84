"""Journal store adapter: its own SQLite file in WAL mode.

Owner writes begin with ``BEGIN IMMEDIATE``, taking SQLite's single writer lock before they read
the row, so every owner transition is linearizable across processes; a writer waits for the lock
up to the busy timeout. WAL is switched on the way the catalog does it (:func:`enable_wal`
retries the switch, which SQLite answers without its busy handler).

:meth:`hold_owners` (an execution's admission) reads the owner rows inside ``BEGIN IMMEDIATE`` on a
connection of its own and holds that write lock through the admitted callback: no owner write of
any scope commits until the callback returns (writers wait up to the busy timeout), which is
coarser than PostgreSQL's row lock but as strict. Journal the callback's value after the block.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from contextful.storage.catalog.sqlite import BUSY_TIMEOUT_S, enable_wal
from contextful.storage.dbapi import sqlite_error
from contextful.storage.errors import ContextfulError
from contextful.storage.journal.sql import SqlJournalStore


class SqliteJournalStore(SqlJournalStore):
    hold_blocks_every_owner_write = True

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        super().__init__()

    def _connect(self) -> Any:
        conn = sqlite3.connect(os.path.abspath(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        enable_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _begin_write(self, cur: Any, durable: bool = True) -> None:
        cur.execute("BEGIN IMMEDIATE")

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        return sqlite_error(self.path, exc)
