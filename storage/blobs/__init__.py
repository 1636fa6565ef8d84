"""The blob store port: bytes addressed by their SHA-256.

Implements ``run.journal.blob-write`` (decision "run-substrate-storage"): concurrent writers of one
hash converge on one stored value, none errors on another's write, and no partial write survives
beside it. Adapters beside this module: ``files`` (a file tree under any store root, local or
fsspec), ``sqlite``, ``postgres`` and ``d1`` (R2 content, D1 references); :func:`open_blob_store`
picks one by profile. Reads verify the
digest, so a corrupted object raises ``BlobCorrupt`` instead of returning wrong bytes.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod

from contextful.storage.errors import BlobCorrupt


def digest_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BlobStore(ABC):
    @abstractmethod
    def _store_bytes(self, digest: str, data: bytes) -> None:
        """Store ``data`` under ``digest`` unless present; a racing writer of the same digest wins harmlessly."""

    @abstractmethod
    def _load_bytes(self, digest: str) -> bytes:
        """The stored bytes, raising BlobNotFound when absent."""

    @abstractmethod
    def exists(self, digest: str) -> bool: ...

    def close(self) -> None:
        """Release connections (an adapter with none keeps this no-op)."""

    def put(self, data: bytes) -> str:
        """Store ``data``; return its lowercase hex SHA-256."""
        digest = digest_of(data)
        self._store_bytes(digest, data)
        return digest

    def get(self, digest: str) -> bytes:
        data = self._load_bytes(digest)
        actual = digest_of(data)
        if actual != digest:
            raise BlobCorrupt(digest, actual)
        return data


def open_blob_store(profile: str, **kwargs: object) -> BlobStore:
    """``files`` (root=…), ``sqlite`` (path=…), ``postgres`` (dsn=…, schema=…) or ``d1`` (url=…, token=…,
    namespace=…)."""
    if profile == "files":
        from contextful.storage.blobs.files import FileBlobStore
        from contextful.storage.objects import ObjectStore

        return FileBlobStore(ObjectStore(str(kwargs["root"])))
    if profile == "sqlite":
        from contextful.storage.blobs.sqlite import SqliteBlobStore

        return SqliteBlobStore(str(kwargs["path"]))
    if profile == "postgres":
        from contextful.storage.blobs.postgres import PostgresBlobStore

        return PostgresBlobStore(str(kwargs.get("dsn", "")), str(kwargs.get("schema", "contextful")))
    if profile == "d1":
        from contextful.storage.d1.blobs import D1BlobStore
        from contextful.storage.d1.client import D1Client

        return D1BlobStore(D1Client.from_arguments(kwargs))
    from contextful.storage.errors import StorageProfileUnknown

    raise StorageProfileUnknown(profile, ("files", "sqlite", "postgres", "d1"))
