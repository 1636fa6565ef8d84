"""Blobs under the D1 profile (``run.journal.d1-blob``): the store's blob store, opened under
``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1``, keeps each blob's content in R2 at ``blobs/<sha256>``
and its digest in D1; the object is written before its reference, deleted only after the reference
is gone, and a read verifies the digest.

Real components: the session's Worker under miniflare, a fresh namespace per test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from contextful.storage import Store
from contextful.storage.blobs import digest_of
from contextful.storage.d1.blobs import D1BlobStore
from contextful.storage.d1.client import D1Binding, D1Client
from contextful.storage.errors import BlobCorrupt, BlobNotFound, CatalogRejected

from tests.storage.test_d1_profile import profile_env

pytestmark = [pytest.mark.d1, pytest.mark.clause("run.journal.d1-blob")]


@pytest.fixture
def store(d1_binding: D1Binding, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    for key, value in profile_env(d1_binding).items():
        monkeypatch.setenv(key, value)
    with Store.open(tmp_path / "store") as opened:
        yield opened


def blobs_of(store: Store) -> D1BlobStore:
    assert isinstance(store.blobs, D1BlobStore)
    return store.blobs


def referenced(client: D1Client, digest: str) -> bool:
    return bool(client.query("SELECT 1 FROM cf_blobs WHERE digest = ?", (digest,)))


def test_a_blob_is_written_to_r2_before_d1_references_it(store: Store, d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    digest = blobs_of(store).put(b"a paid answer")
    assert client.get(f"blobs/{digest}") == b"a paid answer" and referenced(client, digest)

    client.batch([("DROP TABLE cf_blobs", ())])  # the reference's commit will fail
    with pytest.raises(CatalogRejected):
        blobs_of(store).put(b"written, never referenced")
    assert client.get(D1BlobStore.key(digest_of(b"written, never referenced"))) == b"written, never referenced"


def test_the_r2_object_is_deleted_only_after_its_reference_is_gone(store: Store, d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    blobs = blobs_of(store)
    digest = blobs.put(b"to be deleted")
    client.batch([("DROP TABLE cf_blob_deletions", ())])  # the reference's removal will fail
    with pytest.raises(CatalogRejected):
        blobs.delete(digest)
    assert referenced(client, digest) and client.get(f"blobs/{digest}") == b"to be deleted"  # nothing deleted
    client.batch([("CREATE TABLE cf_blob_deletions (digest TEXT PRIMARY KEY)", ())])

    assert blobs.delete(digest) is True
    assert not referenced(client, digest) and client.get(f"blobs/{digest}") is None
    assert not blobs.exists(digest)
    with pytest.raises(BlobNotFound):
        blobs.get(digest)
    assert blobs.delete(digest) is False  # nothing referenced it any more


def test_a_put_meeting_a_dead_deleters_pending_deletion_finishes_it_and_writes_afresh(store: Store,
                                                                                     d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    blobs = blobs_of(store)
    digest = blobs.put(b"deleted by a process that died")
    # The deleter committed its batch (reference gone, deletion pending) and died before touching R2.
    client.batch([("INSERT INTO cf_blob_deletions (digest) VALUES (?)", (digest,)),
                  ("DELETE FROM cf_blobs WHERE digest = ?", (digest,))])
    assert client.get(f"blobs/{digest}") is not None and not blobs.exists(digest)
    assert blobs.put(b"deleted by a process that died") == digest
    assert referenced(client, digest) and client.query("SELECT count(*) FROM cf_blob_deletions") == [(0,)]
    assert blobs.get(digest) == b"deleted by a process that died"


def test_a_read_verifies_the_digest(store: Store, d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    blobs = blobs_of(store)
    digest = blobs.put(b"the recorded value")
    client.put(f"blobs/{digest}", b"bytes someone else put there")  # an unconditional overwrite in R2
    with pytest.raises(BlobCorrupt) as info:
        blobs.get(digest)
    assert info.value.digest == digest and info.value.actual == digest_of(b"bytes someone else put there")
