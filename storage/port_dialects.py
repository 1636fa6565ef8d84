"""The database side every SQL adapter of a storage port shares: a PostgreSQL schema or a SQLite file.

The journal, awakeable, blob and outbox ports each have a PostgreSQL adapter (in the catalog's
schema: the execution database) and most a SQLite one (in the catalog's file); they differ in their
tables and statements, never in how they connect, begin a write, lock table creation or name a
driver error. Those live here once, as mixins an adapter lists before its port's SQL base class
(``storage.dbapi.SqlDialect`` supplies the transaction plumbing they plug into).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from contextful.storage.catalog.sqlite import BUSY_TIMEOUT_S, enable_wal
from contextful.storage.dbapi import (
    postgres_connection,
    postgres_connection_lost,
    postgres_error,
    sqlite_error,
)
from contextful.storage.errors import ContextfulError


class PostgresSchemaPort:
    """An adapter over the PostgreSQL schema ``schema`` reached through ``dsn`` (autocommit; writes
    begin READ COMMITTED; table creation serialized by an advisory lock per schema)."""

    placeholder = "%s"
    blob_type = "BYTEA"
    _conn: Any

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        super().__init__()

    def _connect(self) -> Any:
        return postgres_connection(self.dsn, self.schema)

    def _connection_lost(self, exc: BaseException) -> bool:
        return postgres_connection_lost(self._conn, exc)

    def _begin_write(self, cur: Any, durable: bool = True) -> None:
        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")

    def _lock_ddl(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"contextful-ddl:{self.schema}",))
        cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        return postgres_error(self.schema, exc, self.dsn)


class SqliteFilePort:
    """An adapter over the SQLite file ``path`` (WAL, ``synchronous=FULL``; writes take the writer
    lock at ``BEGIN IMMEDIATE`` and wait for it up to the catalog's busy timeout)."""

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
