"""Blob store adapter: a file tree ``blobs/<aa>/<sha256>`` under a store root.

A write lands in a temporary sibling and is hard-linked into place, which fails if a whole blob is
already there (local); on an object store the PUT is atomic and conditional (``If-None-Match``,
:meth:`ObjectStore.put_if_absent`). Either way a reader sees a whole blob or none, and a second
writer of the same hash simply finds it present.
"""

from __future__ import annotations

from contextful.storage.blobs import BlobStore
from contextful.storage.errors import BlobNotFound
from contextful.storage.objects import ObjectStore


class FileBlobStore(BlobStore):
    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects

    @staticmethod
    def key(digest: str) -> str:
        return f"blobs/{digest[:2]}/{digest}"

    def _store_bytes(self, digest: str, data: bytes) -> None:
        self.objects.put_if_absent(self.key(digest), data)

    def _load_bytes(self, digest: str) -> bytes:
        try:
            return self.objects.get_bytes(self.key(digest))
        except FileNotFoundError as exc:
            raise BlobNotFound(digest) from exc

    def exists(self, digest: str) -> bool:
        return self.objects.exists(self.key(digest))
