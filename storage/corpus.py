"""The corpus under the container profile: a local working copy of a remote S3-compatible bucket.

Implements the corpus half of ``run.journal.container-profile`` (decision
"run-substrate-storage"; "disposable-execution-state": a disposable disk holds nothing a
replacement needs). The store's objects (``store.json``, parts, run manifests, holds) live in the
bucket; the machine's working directory only caches them:

* **pull-before-run**: a reader asks for an object's address (:meth:`CorpusMirror.uri`, which a
  snapshot does for every part before its query runs), its bytes or whether it exists, and the
  object is copied from the bucket into the working directory first when it is not there.
* **push-after-run**: every object a run writes lands whole in the working directory and is then
  pushed to the bucket before the write returns, so before the run's manifest is written (a small
  run's rides in the catalog commit itself, ``storage.manifest``) and
  before the catalog commit that references it: a commit never names an object only a lost disk
  held. ``store.json`` is decided by the bucket (first writer there wins), so a fresh working
  directory binds to the same store uuid as the catalog.

Listing and deleting go to the bucket (collection sees every object, whichever machine wrote it);
the cached copies are deleted alongside.
"""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from contextful.storage.objects import ObjectInfo, ObjectStore


class CorpusMirror(ObjectStore):
    """A local :class:`ObjectStore` (the working copy) whose every object is also in ``remote``."""

    def __init__(self, local_root: str, remote: ObjectStore, *, create: bool = True) -> None:
        super().__init__(local_root, {}, create=create)
        self.remote = remote
        self.corpus_url = remote.url
        """Where the corpus lives (the bucket), as against ``url``, the working copy."""

    # --- pull-before-run -----------------------------------------------------------------------------

    def pull(self, key: str) -> bool:
        """Copy ``key`` from the bucket into the working copy unless it is there; False when the
        bucket has no such object either."""
        if super().exists(key):
            return True
        try:
            data = self.remote.get_bytes(key)
        except FileNotFoundError:
            return False
        # A cache, not pushed back: the bucket holds the durable copy.
        with ObjectStore.atomic_local_path(self, key, durable=False) as tmp, open(tmp, "wb") as fh:
            fh.write(data)
        return True

    def uri(self, key: str) -> str:
        self.pull(key)
        return super().uri(key)

    def get_bytes(self, key: str) -> bytes:
        if not self.pull(key):
            raise FileNotFoundError(self.remote.path(key))
        return super().get_bytes(key)

    def exists(self, key: str) -> bool:
        return super().exists(key) or self.remote.exists(key)

    # --- push-after-run ------------------------------------------------------------------------------

    def push(self, key: str) -> None:
        """Upload the working copy's ``key`` to the bucket (one whole PUT)."""
        with open(super().path(key), "rb") as fh:
            self.remote.put_bytes(key, fh.read())

    @contextlib.contextmanager
    def atomic_local_path(self, key: str, durable: bool = True) -> Iterator[str]:
        # Every local write (atomic_writer, put_bytes, a part's native writer) comes through here.
        with super().atomic_local_path(key, durable=durable) as tmp:
            yield tmp
        self.push(key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """The bucket decides: when it holds ``key`` already that object is pulled and kept."""
        wrote = self.remote.put_if_absent(key, data)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(super().path(key))  # a cached copy yields to the bucket's object
        self.pull(key)
        return wrote

    # --- listing and deleting: the bucket --------------------------------------------------------------

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        return self.remote.list(prefix)

    def children(self, prefix: str) -> builtins.list[str]:
        return self.remote.children(prefix)

    def delete(self, keys: builtins.list[str]) -> None:
        self.remote.delete(keys)
        ObjectStore.delete(self, [k for k in keys if ObjectStore.exists(self, k)])


def corpus_objects(local_root: str, bucket: str, storage_options: dict[str, Any] | None = None, *,
                   create: bool = True) -> CorpusMirror:
    """The working copy at ``local_root`` of the corpus at ``bucket`` (``s3://bucket/prefix``)."""
    return CorpusMirror(local_root, ObjectStore(bucket, storage_options, create=create), create=create)
