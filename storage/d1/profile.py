"""The D1 profile's bindings (``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1``) and its corpus working copy.

Implements ``run.journal.d1-profile`` (decision "d1-execution-state": the catalog, journal,
awakeables and export state in D1, blob content and corpus objects in R2, all through one private
Worker binding) and the D1 half of ``run.journal.storage-incomplete``: a profile missing its
Worker URL or token raises one ``StorageCapabilityMissing`` naming each missing variable when the
store opens, before anything is read and before any execution is admitted; so does a corpus that
lost its ``store.json`` while D1's catalog serves a store (:func:`require_d1_corpus_state`).

The bindings (docs/store.md, "The D1 profile"):

* ``CONTEXTFUL_D1_URL``: where the Worker answers;
* ``CONTEXTFUL_D1_TOKEN``: its bearer token (the Worker's ``CONTEXTFUL_D1_TOKEN`` secret);
* ``CONTEXTFUL_D1_NAMESPACE`` (optional): a namespace keeping this store apart in a shared
  database and bucket.
"""

from __future__ import annotations

import os

from contextful.storage.catalog import Catalog
from contextful.storage.corpus import CorpusMirror
from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.objects import R2Objects
from contextful.storage.errors import StorageCapabilityMissing

PROFILE = "cloudflare-d1"
BINDINGS = (("CONTEXTFUL_D1_URL", "the Worker's URL"), ("CONTEXTFUL_D1_TOKEN", "the Worker's bearer token"))
"""The variables the profile needs, each with what it binds."""


def d1_binding() -> D1Binding:
    """The Worker binding from the environment, or ``StorageCapabilityMissing`` naming every missing variable."""
    missing = tuple(f"{name} ({what})" for name, what in BINDINGS if not os.environ.get(name))
    binding = D1Binding.from_environment()
    if missing or binding is None:
        raise StorageCapabilityMissing(PROFILE, missing)
    return binding


def d1_corpus(local_root: str, binding: D1Binding, *, create: bool = True) -> CorpusMirror:
    """The working copy at ``local_root`` of the corpus in the binding's R2 namespace."""
    return CorpusMirror(local_root, R2Objects(binding.client()), create=create)


def require_d1_corpus_state(corpus: CorpusMirror, catalog: Catalog) -> None:
    """Refuse a corpus without ``store.json`` while D1's catalog serves a store: a new one minted
    there would bind the corpus to another store for good. (The catalog binds only after
    ``store.json`` is in R2, so a bound catalog asks R2 once more before refusing.)"""
    if corpus.remote.exists("store.json") or not isinstance(catalog, D1Catalog):
        return
    bound = catalog.client.query("SELECT value FROM cf_meta WHERE key = 'store_uuid'")
    if bound and not corpus.remote.exists("store.json"):
        lost = f"the corpus state: {corpus.corpus_url} holds no store.json, and the catalog serves store {bound[0][0]}"
        raise StorageCapabilityMissing(PROFILE, (lost,))
