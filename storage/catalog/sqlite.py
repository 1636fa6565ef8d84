"""The embedded catalog: one SQLite file in WAL mode (the ``local`` profile).

A write transaction starts with ``BEGIN IMMEDIATE``, taking SQLite's single writer lock before it
reads the head, so the conditional update that ends a commit is linearizable across processes.
Opening probes that lock: a file whose locking is off (``nolock=1``, the ``unix-none`` VFS, a
filesystem without locks) lets a second writer in, and the catalog refuses to open.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from typing import Any

from contextful.storage.catalog.sql import SqlCatalog
from contextful.storage.dbapi import sqlite_error
from contextful.storage.errors import ConditionalWriteUnsupported, ContextfulError

BUSY_TIMEOUT_S = 120.0


def enable_wal(conn: sqlite3.Connection, timeout_s: float = BUSY_TIMEOUT_S) -> str:
    """Put the database in WAL mode (once per file); return the journal mode it is in.

    Switching modes needs an exclusive lock and SQLite answers a concurrent switch with "database
    is locked" without consulting the busy handler, so processes opening a new file at once retry.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if mode.lower() != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            return str(mode)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class SqliteCatalog(SqlCatalog):
    backend = "sqlite"
    profile = "local"

    def __init__(self, path: str) -> None:
        self.path = path
        if not path.startswith("file:"):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        super().__init__()

    @functools.cached_property
    def journal_location(self) -> str | None:
        # the journal store beside this catalog opens the same file (storage.journal.sqlite); resolved
        # once: every commit compares its fences' journals with it
        return None if self.path.startswith("file:") else f"sqlite:{os.path.realpath(self.path)}"

    def _open(self, timeout: float) -> sqlite3.Connection:
        uri = self.path if self.path.startswith("file:") else f"file:{os.path.abspath(self.path)}"
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None, check_same_thread=False)
        return conn

    def _connect(self) -> Any:
        if sqlite3.sqlite_version_info < (3, 24):
            raise ConditionalWriteUnsupported("sqlite", f"SQLite {sqlite3.sqlite_version} lacks upsert")
        conn = self._open(BUSY_TIMEOUT_S)
        enable_wal(conn)
        conn.execute("PRAGMA synchronous=FULL")
        self._durable = True
        return conn

    def _probe_linearizable(self) -> None:
        holder = self._open(BUSY_TIMEOUT_S)
        rival = self._open(0.0)
        try:
            holder.execute("BEGIN IMMEDIATE")
            try:
                rival.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                return  # the write lock excludes a second writer: conditional writes serialize
            rival.execute("ROLLBACK")
            raise ConditionalWriteUnsupported(
                f"sqlite:{self.path}", "a second writer entered while the write lock was held (locking is off)"
            )
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            rival.close()

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        return sqlite_error(self.path, exc)

    def _begin_write(self, cur: Any, durable: bool) -> None:
        if durable != self._durable:  # a per-connection setting, changed only between transactions
            cur.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self._durable = durable
        cur.execute("BEGIN IMMEDIATE")
