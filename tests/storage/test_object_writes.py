"""A part write that fails leaves nothing at its final key, on a local root and on S3.

fsspec's ``with fs.open(key, "wb")`` closes the file when its body raises, and closing an S3 file
completes its upload: a half-written part appeared at the key a commit would reference. The
store aborts the upload instead (and a local write renames a temporary only once it is whole).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.storage.objects import ObjectStore
from contextful.storage.parts import write_part

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
