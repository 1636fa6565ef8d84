"""Blob store adapter of the D1 profile: content in R2 at ``blobs/<sha256>``, its reference in D1.

Implements ``run.journal.blob-write`` and the write order of ``run.journal.d1-blob`` (decision
"run-substrate-storage"): a put stores the object first, conditional on nothing being there (R2's
``onlyIf``; a racing writer of the same digest finds it present and stores nothing), and only then
commits its reference row ``cf_blobs(digest, size)`` in D1 (``INSERT … ON CONFLICT DO NOTHING``),
so a reference never names an object that is not whole in R2. R2 puts are atomic: no partial
object survives beside the whole one. :meth:`D1BlobStore.exists` answers from D1 (a blob exists
once referenced); a read fetches the object and the port verifies its digest. Both go through the
Worker (``storage.d1.client``).
"""

from __future__ import annotations

from contextful.storage.blobs import BlobStore
from contextful.storage.d1.client import D1Client
from contextful.storage.errors import BlobNotFound

DDL = "CREATE TABLE IF NOT EXISTS cf_blobs (digest TEXT PRIMARY KEY, size BIGINT NOT NULL)"


class D1BlobStore(BlobStore):
    def __init__(self, client: D1Client) -> None:
        self.client = client
        client.batch([(DDL, ())])

    @staticmethod
    def key(digest: str) -> str:
        """The R2 object key of ``digest``'s content (``run.journal.d1-blob``)."""
        return f"blobs/{digest}"

    def _store_bytes(self, digest: str, data: bytes) -> None:
        self.client.put(self.key(digest), data, only_if="absent")  # None: present already, whole
        self.client.batch([("INSERT INTO cf_blobs (digest, size) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING",
                            (digest, len(data)))])

    def _load_bytes(self, digest: str) -> bytes:
        data = self.client.get(self.key(digest))
        if data is None:
            raise BlobNotFound(digest)
        return data

    def exists(self, digest: str) -> bool:
        return bool(self.client.query("SELECT 1 FROM cf_blobs WHERE digest = ?", (digest,)))
