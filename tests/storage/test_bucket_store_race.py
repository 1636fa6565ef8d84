"""Machines opening one new store in one bucket at once agree on one store, and every load lands.

Under the container profile each project directory is a machine's working copy of the bucket, and
every machine shares the PostgreSQL catalog. ``store.json`` (the store's uuid) was created
check-then-put on an object store: machines that all found it absent each wrote their own uuid,
the last PUT won the bucket, and the others' loads failed (``StoreCatalogMismatch``, or s3fs's
``FileExpired`` reading a ``store.json`` replaced under them); their rows never landed.

The interleaving is forced, not waited for: each child (``tests.storage.bucket_open_child``, the
real ``contextful table load``) holds just before its ``store.json`` PUT, so every one of them has
found the bucket without one. The parent lets the first go and waits for its load to finish (the
catalog now serves its store), then lets all the others go at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import s3fs
from contextful.storage import Store
from contextful.storage.catalog.postgres import PostgresCatalog

from tests.storage.bucket_open_child import HOLD
from tests.storage.container_site import ContainerSite
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.postgres, pytest.mark.s3]

MACHINES = 4
ROWS = 500
CHILD_TIMEOUT_S = 300.0


def start_machine(site: ContainerSite, tmp_path: Path, i: int) -> subprocess.Popen[str]:
    project = tmp_path / f"machine-{i}"
    project.mkdir()
    (project / "contextful.toml").write_text(f'[project]\nname = "machine-{i}"\n')
    (project / "events.csv").write_text("id,machine\n" + "".join(f"{i * ROWS + n},{i}\n" for n in range(ROWS)))
    (project / "tmp").mkdir()
    return subprocess.Popen([sys.executable, "-m", "tests.storage.bucket_open_child", str(project), "events",
                             str(project / "events.csv")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=site.child_env(str(project / "tmp")))


def wait_for_hold(proc: subprocess.Popen[str]) -> None:
    """Read the child's stderr up to its hold line; a child that ends first fails the test with its output."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        if line.strip() == HOLD:
            return
        seen.append(line)
    _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    raise AssertionError(f"machine ended (exit {proc.returncode}) before its store.json PUT: {''.join(seen)}{err}")


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    return proc.returncode, out + err


def test_machines_opening_one_new_bucket_store_at_once_bind_one_store_and_every_load_lands(
        pg_dsn: str, pg_schema: str, s3_server: S3Server, tmp_path: Path) -> None:
    site = ContainerSite.fresh(pg_dsn, pg_schema, s3_server)
    machines = [start_machine(site, tmp_path, i) for i in range(MACHINES)]
    try:
        for proc in machines:
            wait_for_hold(proc)  # every machine found the bucket without store.json
        first, *others = machines
        release(first)
        results = [finish(first)]
        for proc in others:
            release(proc)
        results += [finish(proc) for proc in others]
    finally:
        for proc in machines:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failed = [(i, output) for i, (code, output) in enumerate(results) if code != 0]
    assert not failed, failed

    bucket = s3fs.S3FileSystem(**s3_server.storage_options)
    in_bucket = json.loads(bucket.cat_file(site.bucket.removeprefix("s3://") + "/store.json"))["store_uuid"]
    working_copies = {json.loads((tmp_path / f"machine-{i}" / ".contextful" / "store" / "store.json").read_text())
                      ["store_uuid"] for i in range(MACHINES)}
    assert working_copies == {in_bucket}
    with Store.open(site.bucket, catalog=PostgresCatalog(site.dsn, site.schema),
                    storage_options=s3_server.storage_options, create=False) as store:
        assert store.uuid == in_bucket
        rows = store.table("events").to_arrow()
    assert rows.num_rows == MACHINES * ROWS
    assert sorted(rows["id"].to_pylist()) == list(range(MACHINES * ROWS))
    site.drop()
