"""What the SQL adapters share: placeholders, driver-error mapping and connections.

The catalog (``storage.catalog.sql``) and the journal store (``storage.journal.sql``) speak SQL
through the same two drivers, SQLite and PostgreSQL (psycopg 3), written with ``?`` placeholders
and mapped onto the catalogue's errors the same way.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from storage.errors import CatalogRejected, CatalogUnavailable, ContextfulError


class SqlDialect:
    """Placeholder rewriting and driver-error mapping for a SQL adapter (a mixin)."""

    placeholder = "?"

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        """The catalogue error for a driver error (None: not the driver's)."""
        raise NotImplementedError

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    @contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            mapped = self._map_error(exc)
            if mapped is None:
                raise
            raise mapped from exc


def sqlite_error(path: str, exc: Exception) -> ContextfulError | None:
    """A locked or unreachable SQLite file is transient; any other SQLite error a refusal."""
    if isinstance(exc, sqlite3.OperationalError):
        return CatalogUnavailable(f"sqlite:{path}", str(exc))
    if isinstance(exc, sqlite3.Error):
        return CatalogRejected(f"sqlite:{path}", str(exc))
    return None


def postgres_connection(dsn: str, schema: str) -> Any:
    """An autocommit psycopg connection whose search path is ``schema`` (created by the caller)."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    return conn
