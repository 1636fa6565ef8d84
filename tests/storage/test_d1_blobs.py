"""The D1 blob adapter's layout and write order, beyond the blob port's suite (tests/storage/test_blobs.py).

The content of a blob lives in R2 at ``blobs/<sha256>`` (in a deployment's own, empty namespace),
its reference in D1's ``cf_blobs``; the object is written before its reference, so a reference
never names an object that is not whole. ``run.journal.d1-blob`` as a whole (deletion after every
reference, the digest verified on read, through a store opened under the profile) is claimed by
``test_d1_profile_blobs``.
"""

from __future__ import annotations

import dataclasses

import pytest
from contextful.storage.blobs import digest_of, open_blob_store
from contextful.storage.d1.blobs import D1BlobStore
from contextful.storage.d1.client import D1Binding
from contextful.storage.errors import CatalogRejected

pytestmark = pytest.mark.d1


def test_a_blob_lives_at_blobs_sha256_in_r2_and_its_digest_in_d1(d1_server: D1Binding) -> None:
    binding = dataclasses.replace(d1_server, namespace="")  # the deployment's own names, bare
    client = binding.client()
    blobs = D1BlobStore(client)
    data = b"a blob kept by the D1 profile " + digest_of(b"unique to this test").encode()
    digest = blobs.put(data)
    assert client.get(f"blobs/{digest}") == data
    assert client.query("SELECT digest, size FROM cf_blobs WHERE digest = ?", (digest,)) == [(digest, len(data))]


def test_the_r2_write_precedes_its_d1_reference(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    blobs = D1BlobStore(client)
    client.batch([("DROP TABLE cf_blobs", ())])  # the reference's commit will fail
    data = b"written to R2, never referenced"
    with pytest.raises(CatalogRejected) as info:
        blobs.put(data)
    assert "d1 batch" in str(info.value) and "cf_blobs" in str(info.value)
    assert client.get(D1BlobStore.key(digest_of(data))) == data  # the object landed first, whole


def test_open_blob_store_opens_the_d1_adapter_on_a_binding(d1_binding: D1Binding) -> None:
    blobs = open_blob_store("d1", url=d1_binding.url, token=d1_binding.token, namespace=d1_binding.namespace)
    assert isinstance(blobs, D1BlobStore)
    digest = blobs.put(b"through the loader")
    assert d1_binding.client().get(D1BlobStore.key(digest)) == b"through the loader"
