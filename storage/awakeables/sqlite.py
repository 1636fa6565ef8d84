"""Awakeable store adapter: table ``cf_awakeables`` in a SQLite file in WAL mode — the catalog's
file, beside the journal's tables (:attr:`Store.awakeables`).

Writes begin with ``BEGIN IMMEDIATE``, taking SQLite's single writer lock, so two resolutions of
one token serialize across processes and the second finds the row resolved.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from contextful.storage.awakeables.sql import SqlAwakeableStore
from contextful.storage.catalog.sqlite import BUSY_TIMEOUT_S, enable_wal
from contextful.storage.dbapi import sqlite_error
from contextful.storage.errors import ContextfulError


class SqliteAwakeableStore(SqlAwakeableStore):
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
