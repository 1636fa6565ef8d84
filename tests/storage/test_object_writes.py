"""Object writes on a local root and on S3: nothing torn, the first writer wins, a replaced object reads whole.

fsspec's ``with fs.open(key, "wb")`` closes the file when its body raises, and closing an S3 file
completes its upload: a half-written part appeared at the key a commit would reference. The
store aborts the upload instead (and a local write renames a temporary only once it is whole).

``put_if_absent`` on S3 was check-then-put; it is a conditional PUT now, and a backend that cannot
refuse a second writer is refused (the N-machine race is ``test_bucket_store_race``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.storage.errors import ConditionalWriteUnsupported
from contextful.storage.objects import ObjectStore
from contextful.storage.parts import write_part

from tests.support.s3_proxy import IgnoringConditionsProxy
from tests.support.s3_server import S3Server

SCHEMA = pa.schema({"id": pa.int64(), "text": pa.string()})


def batches_that_fail_midway(rows: int) -> Iterator[pa.RecordBatch]:
    """Enough rows that a multipart upload is under way, then the producer fails (a DuckDB scan
    of a fold, a decoder) before the part is whole."""
    for start in range(0, rows, 100_000):
        yield pa.record_batch({"id": list(range(start, start + 100_000)),
                               "text": [f"row {i} " + "x" * 64 for i in range(start, start + 100_000)]},
                              schema=SCHEMA)
    raise RuntimeError("the producer failed")


@pytest.fixture(params=["local", "s3"])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return ObjectStore(str(tmp_path / "root"))
    server: S3Server = request.getfixturevalue("s3_server")
    return ObjectStore(f"s3://{server.new_bucket()}/root", server.storage_options)


def test_a_failed_part_write_leaves_no_object_at_its_key(objects: ObjectStore) -> None:
    key = "tables/t/parts/r1-00000.parquet"
    with pytest.raises(RuntimeError, match="producer failed"):
        write_part(objects, key, batches_that_fail_midway(600_000), SCHEMA, durable=False)
    if not objects.is_local:
        objects.fs.invalidate_cache()
    assert not objects.exists(key)
    assert [o.key for o in objects.list("tables")] == []


def test_a_failed_small_write_leaves_no_object_either(objects: ObjectStore) -> None:
    key = "tables/t/runs/r1.json"
    with pytest.raises(RuntimeError), objects.atomic_writer(key, durable=False) as fh:
        fh.write(b'{"partial": ')
        raise RuntimeError("interrupted")
    if not objects.is_local:
        objects.fs.invalidate_cache()
    assert not objects.exists(key)


def test_no_multipart_upload_is_left_open_on_s3(s3_server: S3Server) -> None:
    import boto3

    bucket = s3_server.new_bucket()
    objects = ObjectStore(f"s3://{bucket}/root", s3_server.storage_options)
    with pytest.raises(RuntimeError):
        write_part(objects, "tables/t/parts/r1-00000.parquet", batches_that_fail_midway(600_000), SCHEMA)
    client = boto3.client("s3", endpoint_url=s3_server.endpoint)
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_deleting_an_object_already_gone_deletes_the_rest(objects: ObjectStore) -> None:
    """Collection lists, then deletes: a temporary renamed by its writer in between is already gone,
    and the delete of the others still happens (it raised FileNotFoundError and deleted nothing)."""
    for key in ("t/parts/a.parquet", "t/parts/b.parquet"):
        with objects.atomic_writer(key) as fh:
            fh.write(b"x")
    objects.delete(["t/parts/a.parquet", "t/parts/.tmp-gone.parquet", "t/parts/b.parquet"])
    assert not objects.exists("t/parts/a.parquet") and not objects.exists("t/parts/b.parquet")


# --- first writer wins, and a replaced object reads whole ------------------------------------------


def test_the_first_writer_of_a_key_wins_whatever_bytes_the_others_hold(objects: ObjectStore) -> None:
    other = ObjectStore(objects.url, None if objects.is_local else objects._options)
    assert objects.put_if_absent("store.json", b'{"store_uuid": "first"}')
    assert not other.put_if_absent("store.json", b'{"store_uuid": "second"}')
    assert other.get_bytes("store.json") == objects.get_bytes("store.json") == b'{"store_uuid": "first"}'


def test_a_reader_whose_cached_listing_predates_a_replacement_reads_the_new_object(s3_server: S3Server) -> None:
    """s3fs ranges a file read under the ETag its cached listing holds: an object replaced by another
    writer since that listing failed the read with ``FileExpired`` (an unnamed error)."""
    root = f"s3://{s3_server.new_bucket()}/root"
    reader, writer = ObjectStore(root, s3_server.storage_options), ObjectStore(root, s3_server.storage_options)
    writer.put_bytes("tables/t/holds/b1.json", b'{"held": 1}')
    assert [o.key for o in reader.list("tables/t")] == ["tables/t/holds/b1.json"]  # cached, with its ETag
    writer.put_bytes("tables/t/holds/b1.json", b'{"held": 2, "by": "another build"}')
    assert reader.get_bytes("tables/t/holds/b1.json") == b'{"held": 2, "by": "another build"}'


def test_a_root_whose_filesystem_cannot_refuse_a_second_writer_is_refused(tmp_path: Path) -> None:
    """fsspec's create-if-absent outside S3 checks existence, then writes: two writers pass together."""
    objects = ObjectStore(f"memory://{tmp_path.name}/root")
    with pytest.raises(ConditionalWriteUnsupported) as info:
        objects.put_if_absent("store.json", b"{}")
    assert info.value.backend == objects.url and "memory://" in info.value.reason
    assert not objects.exists("store.json")


def test_an_s3_compatible_server_that_ignores_if_none_match_is_refused(s3_server: S3Server) -> None:
    """The probe: a server that accepts a second create of one key cannot decide a first writer."""
    bucket = s3_server.new_bucket()
    with IgnoringConditionsProxy(s3_server.endpoint) as proxy:
        options = s3_server.storage_options | {"client_kwargs": {"endpoint_url": proxy.endpoint}}
        objects = ObjectStore(f"s3://{bucket}/root", options)
        with pytest.raises(ConditionalWriteUnsupported) as info:
            objects.put_if_absent("store.json", b"{}")
        assert "If-None-Match" in info.value.reason
        assert objects.list("") == []  # neither the object nor the probe is left
    honouring = ObjectStore(f"s3://{bucket}/root", s3_server.storage_options)
    assert honouring.put_if_absent("store.json", b"{}")  # the same bucket behind the real server
