"""The D1 profile's corpus objects: an :class:`~contextful.storage.objects.ObjectStore` over R2 through the Worker.

Implements the corpus half of ``run.journal.d1-profile`` (decision "d1-execution-state": "R2 holds
blob content and corpus objects"). Under ``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1`` the store's
objects (``store.json``, parts, run manifests, holds) live in R2 under ``corpus/`` of the binding's
namespace, beside the blobs' ``blobs/<sha256>``; the machine's working directory only caches them,
as the container profile's does its bucket (``storage.corpus.CorpusMirror``: pull-before-run,
push-after-run). Every call is one request to the Worker (``storage.d1.client``):

* a write is one whole R2 put (R2 puts are atomic: a reader sees the whole object or none);
* :meth:`R2Objects.put_if_absent` is the put with ``x-only-if: absent``, decided by R2 itself, so
  the first writer of ``store.json`` wins whichever machine it runs on;
* a read of an absent object is ``FileNotFoundError``, as on every other root.
"""

from __future__ import annotations

import builtins
import contextlib
import io
from collections.abc import Iterator
from typing import IO

from contextful.storage.d1.client import D1Client
from contextful.storage.objects import ObjectInfo, ObjectStore

CORPUS_PREFIX = "corpus"
"""Where a store's objects sit in the binding's R2 namespace (its blobs sit at ``blobs/``)."""


class R2Objects(ObjectStore):
    """The objects under ``corpus/`` of one Worker binding's R2 namespace."""

    def __init__(self, client: D1Client, prefix: str = CORPUS_PREFIX) -> None:
        super().__init__(f"r2://{prefix}", {}, create=False)
        self.client = client
        self.prefix = prefix
        self.url = f"r2://{client.backend.removeprefix('cloudflare-d1:')}/{prefix}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    # --- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def atomic_writer(self, key: str, durable: bool = True) -> Iterator[IO[bytes]]:
        buffer = io.BytesIO()
        yield buffer  # a body that raises leaves nothing in R2: the put is never sent
        self.client.put(self._key(key), buffer.getvalue())

    def put_bytes(self, key: str, data: bytes, durable: bool = True) -> None:
        self.client.put(self._key(key), data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.client.put(self._key(key), data, only_if="absent") is not None

    def require_conditional_create(self) -> None:
        """R2 decides ``onlyIf`` itself: every create through the Worker refuses all writers but the first."""

    # --- reading ----------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        data = self.client.get(self._key(key))
        if data is None:
            raise FileNotFoundError(self.path(key))
        return data

    def exists(self, key: str) -> bool:
        return self.client.head(self._key(key)) is not None

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        strip = len(self.prefix) + 1
        return [ObjectInfo(o.key[strip:], o.size, None) for o in self.client.list(self._key(prefix))]

    def children(self, prefix: str) -> builtins.list[str]:
        base = prefix.rstrip("/") + "/"
        return sorted({o.key[len(base):].split("/", 1)[0] for o in self.list(base)})

    def delete(self, keys: builtins.list[str]) -> None:
        for key in keys:  # the Worker deletes one object per request; an absent one counts as deleted
            self.client.delete(self._key(key))
