"""Blob store adapter: a PostgreSQL table ``cf_blobs`` (bytea) in the catalog's schema.

``INSERT … ON CONFLICT DO NOTHING`` makes concurrent writers of one digest wait for the first
insert's transaction and then do nothing; none errors and the stored value is the first whole one.
The same insert makes a write safe to send again, so a lost connection costs one retried call
(``storage.dbapi``).
"""

from __future__ import annotations

from typing import Any

from contextful.storage.blobs import BlobStore
from contextful.storage.dbapi import SqlDialect
from contextful.storage.errors import BlobNotFound
from contextful.storage.port_dialects import PostgresSchemaPort


class PostgresBlobStore(PostgresSchemaPort, SqlDialect, BlobStore):
    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self._open_connection()

        def create(cur: Any) -> None:
            self._lock_ddl(cur)
            cur.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".cf_blobs'
                        " (digest TEXT PRIMARY KEY, content BYTEA NOT NULL)")

        self._write(create, rerun_unheard=True)

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
