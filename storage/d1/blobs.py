"""Blob store adapter of the D1 profile: content in R2 at ``blobs/<sha256>``, its reference in D1.

Implements ``run.journal.blob-write`` and ``run.journal.d1-blob`` (decision "run-substrate-storage"):

* **write**: a put stores the object first, conditional on nothing being there (R2's ``onlyIf``; a
  racing writer of the same digest finds it present and stores nothing), and only then commits its
  reference row ``cf_blobs(digest, size)`` in D1 (``INSERT … ON CONFLICT DO NOTHING``), so a
  reference never names an object that is not whole. R2 puts are atomic: no partial object
  survives beside the whole one.
* **delete**: :meth:`D1BlobStore.delete` removes the reference and records a pending deletion
  ``cf_blob_deletions(digest)`` in one D1 batch, and only then deletes the R2 object, and last
  the pending row: an R2 deletion follows the removal of every reference. While a deletion is
  pending no put references the digest (its insert predicates on no pending row): a put that
  meets one finishes that deletion (the deleter may have died) and writes the blob afresh.
* **read**: :meth:`D1BlobStore.exists` answers from D1 (a blob exists once referenced); a read
  fetches the object and the port verifies its digest (``BlobCorrupt`` otherwise).

All of it goes through the Worker (``storage.d1.client``).
"""

from __future__ import annotations

from contextful.storage.blobs import BlobStore
from contextful.storage.d1.client import D1Client
from contextful.storage.errors import BlobNotFound

DDL = ("CREATE TABLE IF NOT EXISTS cf_blobs (digest TEXT PRIMARY KEY, size BIGINT NOT NULL)",
       "CREATE TABLE IF NOT EXISTS cf_blob_deletions (digest TEXT PRIMARY KEY)")
_PENDING = "SELECT 1 FROM cf_blob_deletions WHERE digest = ?"
_REFERENCE = (f"INSERT INTO cf_blobs (digest, size) SELECT ?, ? WHERE NOT EXISTS ({_PENDING}) "
              "ON CONFLICT (digest) DO NOTHING")
_MARK_DELETION = ("INSERT INTO cf_blob_deletions (digest) SELECT ? WHERE EXISTS (SELECT 1 FROM cf_blobs WHERE digest = ?) "
                  "ON CONFLICT (digest) DO NOTHING")


class D1BlobStore(BlobStore):
    def __init__(self, client: D1Client) -> None:
        self.client = client
        client.batch([(statement, ()) for statement in DDL], rerun_unheard=True)

    @staticmethod
    def key(digest: str) -> str:
        """The R2 object key of ``digest``'s content (``run.journal.d1-blob``)."""
        return f"blobs/{digest}"

    def _store_bytes(self, digest: str, data: bytes) -> None:
        while True:  # bounded: each pass that meets a pending deletion finishes it
            self.client.put(self.key(digest), data, only_if="absent")  # None: present already, whole
            pending = self.client.batch([
                (_REFERENCE, (digest, len(data), digest)),
                (_PENDING, (digest,))], rerun_unheard=True)[1].rows
            if not pending:
                return
            self._finish_deletion(digest)

    def _load_bytes(self, digest: str) -> bytes:
        data = self.client.get(self.key(digest))
        if data is None:
            raise BlobNotFound(digest)
        return data

    def exists(self, digest: str) -> bool:
        return bool(self.client.query("SELECT 1 FROM cf_blobs WHERE digest = ?", (digest,)))

    def delete(self, digest: str) -> bool:
        """Remove ``digest``'s reference, then its R2 object; False when nothing referenced it."""
        removed = self.client.batch([
            (_MARK_DELETION, (digest, digest)),
            ("DELETE FROM cf_blobs WHERE digest = ?", (digest,))])[1].changes
        pending = bool(self.client.query(_PENDING, (digest,)))
        if pending:  # this call's, or one a dead deleter left
            self._finish_deletion(digest)
        return bool(removed)

    def _finish_deletion(self, digest: str) -> None:
        self.client.delete(self.key(digest))
        self.client.batch([("DELETE FROM cf_blob_deletions WHERE digest = ?", (digest,))], rerun_unheard=True)
