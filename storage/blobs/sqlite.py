"""Blob store adapter: a SQLite table ``cf_blobs``; one insert per blob, a duplicate does nothing."""

from __future__ import annotations

import os
import sqlite3

from contextful.storage.blobs import BlobStore
from contextful.storage.catalog.sqlite import enable_wal
from contextful.storage.errors import BlobNotFound


class SqliteBlobStore(BlobStore):
    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._conn = sqlite3.connect(path, timeout=120.0, isolation_level=None, check_same_thread=False)
        enable_wal(self._conn)
        self._conn.execute("CREATE TABLE IF NOT EXISTS cf_blobs (digest TEXT PRIMARY KEY, content BLOB NOT NULL)")

    def _store_bytes(self, digest: str, data: bytes) -> None:
        self._conn.execute("INSERT INTO cf_blobs (digest, content) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING",
                           (digest, data))

    def _load_bytes(self, digest: str) -> bytes:
        row = self._conn.execute("SELECT content FROM cf_blobs WHERE digest = ?", (digest,)).fetchone()
        if row is None:
            raise BlobNotFound(digest)
        return bytes(row[0])

    def exists(self, digest: str) -> bool:
        return self._conn.execute("SELECT 1 FROM cf_blobs WHERE digest = ?", (digest,)).fetchone() is not None

    def close(self) -> None:
        self._conn.close()
