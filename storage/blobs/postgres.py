"""Blob store adapter: a PostgreSQL table ``cf_blobs`` (bytea) in the catalog's schema.

``INSERT … ON CONFLICT DO NOTHING`` makes concurrent writers of one digest wait for the first
insert's transaction and then do nothing; none errors and the stored value is the first whole one.
The same insert makes a write safe to send again, so a lost connection costs one retried call
(``storage.dbapi``).
"""

from __future__ import annotations

from typing import Any

from contextful.storage.blobs import BlobStore
from contextful.storage.dbapi import SqlDialect, postgres_connection, postgres_connection_lost, postgres_error
from contextful.storage.errors import BlobNotFound, ContextfulError


class PostgresBlobStore(SqlDialect, BlobStore):
    placeholder = "%s"

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._open_connection()

        def create(cur: Any) -> None:
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"contextful-ddl:{schema}",))
            cur.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            cur.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".cf_blobs'
                        " (digest TEXT PRIMARY KEY, content BYTEA NOT NULL)")

        self._write(create, rerun_unheard=True)

    def _connect(self) -> Any:
        return postgres_connection(self.dsn, self.schema)

    def _begin_write(self, cur: Any, durable: bool) -> None:
        cur.execute("BEGIN")

    def _connection_lost(self, exc: BaseException) -> bool:
        return postgres_connection_lost(self._conn, exc)

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        return postgres_error(self.schema, exc, self.dsn)

    def _store_bytes(self, digest: str, data: bytes) -> None:
        self._write(lambda cur: cur.execute(
            "INSERT INTO cf_blobs (digest, content) VALUES (%s, %s) ON CONFLICT (digest) DO NOTHING",
            (digest, data)), rerun_unheard=True)

    def _load_bytes(self, digest: str) -> bytes:
        rows = self._query_rows("SELECT content FROM cf_blobs WHERE digest = %s", (digest,))
        if not rows:
            raise BlobNotFound(digest)
        return bytes(rows[0][0])

    def exists(self, digest: str) -> bool:
        return bool(self._query_rows("SELECT 1 FROM cf_blobs WHERE digest = %s", (digest,)))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
