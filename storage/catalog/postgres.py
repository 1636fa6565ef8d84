"""The shared catalog: a PostgreSQL schema (``CONTEXTFUL_STORAGE_PROFILE=postgres``), psycopg 3.

A commit locks the head rows of its tables with ``SELECT … FOR UPDATE``; the row locks serialize
every committer of those tables across connections and hosts, so the conditional update is
linearizable. Its last statements hold the commit clock's row as well (``storage.catalog.sql``),
so commit times follow commit order across the catalog.
Opening refuses a server that cannot take such a write: a hot standby in recovery or a
read-only default transaction.
"""

from __future__ import annotations

from typing import Any

from contextful.storage.catalog.sql import SqlCatalog
from contextful.storage.dbapi import postgres_connection, postgres_connection_lost, postgres_error
from contextful.storage.errors import ConditionalWriteUnsupported, ContextfulError


class PostgresCatalog(SqlCatalog):
    backend = "postgres"
    profile = "postgres"
    placeholder = "%s"
    row_lock = " FOR UPDATE"
    share_lock = " FOR SHARE"

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        super().__init__()

    @property
    def journal_location(self) -> str | None:
        # the journal store beside this catalog shares its schema (storage.journal.postgres)
        return f"postgres:{self.dsn}:{self.schema}"

    def _connect(self) -> Any:
        # The schema is created in _lock_ddl, after the probe: a read-only server must refuse
        # with ConditionalWriteUnsupported, not fail on the first DDL statement.
        return postgres_connection(self.dsn, self.schema)

    def _probe_linearizable(self) -> None:
        in_recovery, read_only = self._conn.execute(
            "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')"
        ).fetchone()
        if in_recovery:
            raise ConditionalWriteUnsupported(f"postgres:{self.schema}", "the server is a standby in recovery")
        if read_only == "on":
            raise ConditionalWriteUnsupported(f"postgres:{self.schema}", "default_transaction_read_only is on")

    def _lock_ddl(self, cur: Any) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"contextful-ddl:{self.schema}",))
        cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        return postgres_error(self.schema, exc, self.dsn)

    def _connection_lost(self, exc: BaseException) -> bool:
        return postgres_connection_lost(self._conn, exc)

    def _begin_write(self, cur: Any, durable: bool) -> None:
        cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        if not durable:
            cur.execute("SET LOCAL synchronous_commit = off")
