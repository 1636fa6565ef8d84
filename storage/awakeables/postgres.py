"""Awakeable store adapter: table ``cf_awakeables`` in a PostgreSQL schema — the catalog's schema,
beside the journal's tables (psycopg 3).

A resolution's conditional ``UPDATE`` takes the row lock: a racing resolution of the same token
waits for the first to commit, re-evaluates ``state = 'pending'`` on the committed row and changes
nothing, so exactly one payload is recorded across connections.
"""

from __future__ import annotations

from typing import Any

from contextful.storage.awakeables.sql import SqlAwakeableStore
from contextful.storage.dbapi import postgres_connection, postgres_connection_lost, postgres_error
from contextful.storage.errors import ContextfulError


class PostgresAwakeableStore(SqlAwakeableStore):
    placeholder = "%s"
    blob_type = "BYTEA"

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
