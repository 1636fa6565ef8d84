"""Blob store adapter: a PostgreSQL table ``cf_blobs`` (bytea) in the catalog's schema.

``INSERT … ON CONFLICT DO NOTHING`` makes concurrent writers of one digest wait for the first
insert's transaction and then do nothing; none errors and the stored value is the first whole one.
"""

from __future__ import annotations

from storage.blobs import BlobStore
from storage.errors import BlobNotFound


class PostgresBlobStore(BlobStore):
    def __init__(self, dsn: str, schema: str) -> None:
        import psycopg

        self._conn = psycopg.connect(dsn, autocommit=True)
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"contextful-ddl:{schema}",))
            self._conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            self._conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}".cf_blobs'
                               " (digest TEXT PRIMARY KEY, content BYTEA NOT NULL)")
        self._conn.execute(f'SET search_path TO "{schema}"')

    def _write(self, digest: str, data: bytes) -> None:
        self._conn.execute("INSERT INTO cf_blobs (digest, content) VALUES (%s, %s) ON CONFLICT (digest) DO NOTHING",
                           (digest, data))

    def _read(self, digest: str) -> bytes:
        row = self._conn.execute("SELECT content FROM cf_blobs WHERE digest = %s", (digest,)).fetchone()
        if row is None:
            raise BlobNotFound(digest)
        return bytes(row[0])

    def exists(self, digest: str) -> bool:
        return self._conn.execute("SELECT 1 FROM cf_blobs WHERE digest = %s", (digest,)).fetchone() is not None

    def close(self) -> None:
        self._conn.close()
