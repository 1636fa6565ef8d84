"""A dropped catalog connection costs one retried operation, not the rest of the process's life;
a commit whose outcome cannot be learned loses nothing.

A long ``contextful pipeline run`` on the PostgreSQL (container) profile has its backends terminated
(``pg_terminate_backend``) in the middle of a walk; it reconnects and lands every row once. A run
whose checkpoint committed on the server while the answer was lost and the server stayed
unreachable exits naming ``CommitOutcomeUnknown``; the next run settles it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from contextful.storage import Store
from contextful.storage.catalog.postgres import PostgresCatalog

from tests.support.http_api import JsonApi, Reply, Request, watermark_pages
from tests.support.pg_proxy import PgProxy
from tests.support.s3_server import CREDENTIALS, S3Server


@pytest.fixture
def api() -> Iterator[JsonApi]:
    with JsonApi() as server:
        yield server


def terminate_backends(dsn: str, application_name: str) -> int:
    """Terminate every backend of ``application_name``; how many there were."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                            (application_name,)).fetchall()
    return len(rows)


def postgres_env(dsn: str, schema: str, application_name: str, s3: S3Server, bucket: str) -> dict[str, str]:
    """The container profile's bindings (docs/container-profile.md): the catalog's database and a corpus bucket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    env.update(CONTEXTFUL_STORAGE_PROFILE="postgres", CONTEXTFUL_POSTGRES_DSN=f"{dsn} application_name={application_name}",
               CONTEXTFUL_POSTGRES_SCHEMA=schema, CONTEXTFUL_CORPUS_BUCKET=f"s3://{bucket}/corpus",
               CONTEXTFUL_S3_ENDPOINT_URL=s3.endpoint, **CREDENTIALS)
    return env


def provisioned(project: Path, dsn: str, schema: str, s3: S3Server) -> str:
    """Provision the project's execution database (``contextful store provision``); its corpus bucket."""
    bucket = s3.new_bucket()
    subprocess.run([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "store", "provision"],
                   env=postgres_env(dsn, schema, "cf-provision", s3, bucket), check=True, capture_output=True,
                   timeout=300)
    return bucket


def test_a_long_run_whose_backends_are_terminated_goes_on(tmp_path: Path, api: JsonApi, pg_dsn: str,
                                                          s3_server: S3Server) -> None:
    rows = [{"id": i, "updated_at": i} for i in range(12)]
    serve = watermark_pages(rows, "updated_at", 2)
    inside_page_4 = threading.Event()
    release = threading.Event()

    def fourth_page_waits(request: Request) -> Reply:
        if len(api.requests_to("/items")) == 4 and not release.is_set():
            inside_page_4.set()
            release.wait(120)
        return serve(request)

    api.route("/items", fourth_page_waits)
    (tmp_path / "contextful.toml").write_text(f"""
[project]
name = "reconnect"

[[pipeline]]
id = "events"
table = "events"
incremental = "updated_at"
[pipeline.source]
kind = "http"
[pipeline.source.config]
url = "{api.url}/items"
""")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    name = f"cf-{uuid.uuid4().hex[:12]}"
    bucket = provisioned(tmp_path, pg_dsn, schema, s3_server)
    child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline", "run",
                              "--checkpoint-mib", "0.000001"], env=postgres_env(pg_dsn, schema, name, s3_server, bucket),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert inside_page_4.wait(120), "the walk never reached page 4"
        # Checkpoints have committed through the catalog; now every connection of the run dies.
        assert terminate_backends(pg_dsn, name) >= 1
        release.set()
        _out, err = child.communicate(timeout=300)
    finally:
        release.set()
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert "Traceback" not in err
    store = Store.open(tmp_path / ".contextful" / "store", catalog=PostgresCatalog(pg_dsn, schema))
    try:
        ids = store.table("events").to_arrow().column("id").to_pylist()
        assert sorted(ids) == list(range(12))  # every row exactly once
        assert len(store.table("events").commits()) > 1  # committed before and after the terminations
    finally:
        store.close()


def test_a_pipeline_run_whose_commit_outcome_is_unknown_settles_on_the_next_run(tmp_path: Path, pg_dsn: str,
                                                                               s3_server: S3Server) -> None:
    """The server commits a checkpoint, the answer is lost and the catalog cannot be reached
    again: the run exits 75 naming CommitOutcomeUnknown and deletes nothing; once the catalog is
    back, the next run lands exactly what is missing and every row is there once."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for shard in range(3):
        lines = [json.dumps({"id": shard * 10 + i, "kind": "view"}) for i in range(10)]
        (raw / f"events-{shard}.ndjson").write_text("\n".join(lines) + "\n")
    (tmp_path / "contextful.toml").write_text("""
[project]
name = "outcome"

[[pipeline]]
id = "events"
table = "events"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/events-*.ndjson"]
""")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    bucket = provisioned(tmp_path, pg_dsn, schema, s3_server)
    with PgProxy(pg_dsn) as proxy:
        env = postgres_env(proxy.dsn(), schema, "cf-outcome", s3_server, bucket)
        command = [sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline", "run",
                   "--checkpoint-mib", "0.000001"]
        proxy.cut_after_commit(b"INSERT INTO cf_commits", then_refuse=True)
        first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert proxy.fired.is_set()
        assert first.returncode == 75, first.stderr
        assert "CommitOutcomeUnknown" in first.stderr and "Traceback" not in first.stderr
        proxy.heal()
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert second.returncode == 0, second.stderr
    store = Store.open(tmp_path / ".contextful" / "store", catalog=PostgresCatalog(pg_dsn, schema))
    try:
        ids = store.table("events").to_arrow().column("id").to_pylist()
        assert sorted(ids) == list(range(30))  # every row exactly once
        runs = [c.run_id for c in store.table("events").commits()]
        assert len(runs) == len(set(runs))
    finally:
        store.close()


def test_a_serving_receiver_whose_backends_are_terminated_goes_on(tmp_path: Path, pg_dsn: str,
                                                                 s3_server: S3Server) -> None:
    """``pipeline serve`` on the PostgreSQL profile: a batch lands, every backend of the server is
    terminated, and the next batch lands too; both batches once each."""
    import re
    import signal

    from contextful.engine.land.receive import writers

    from tests.engine.land.test_receive import PIPELINE, ndjson, post

    (tmp_path / "contextful.toml").write_text(f"""
[project]
name = "served"

[[pipeline]]
id = "{PIPELINE}"
[pipeline.source]
kind = "receive"
[pipeline.source.config]
key_retention_secs = 60
""")
    token = writers.issue(tmp_path, [PIPELINE]).token
    schema = f"t_{uuid.uuid4().hex[:16]}"
    name = f"cf-{uuid.uuid4().hex[:12]}"
    bucket = provisioned(tmp_path, pg_dsn, schema, s3_server)
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline", "serve",
                             "--http", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=postgres_env(pg_dsn, schema, name, s3_server, bucket))
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if match is None:
            proc.wait(timeout=60)
            raise AssertionError(f"serve did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
        url = match.group(1)
        assert post(url, "before", ndjson("before", 3), token=token)[0] == 200
        assert terminate_backends(pg_dsn, name) >= 1
        status, answer = post(url, "after", ndjson("after", 4), token=token)
        assert status == 200, answer
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        err = proc.stderr.read() if proc.stderr else ""
    assert code == 0, err
    store = Store.open(tmp_path / ".contextful" / "store", catalog=PostgresCatalog(pg_dsn, schema))
    try:
        batches = store.table(PIPELINE).to_arrow().column("batch").to_pylist()
        assert sorted(batches) == ["after"] * 4 + ["before"] * 3
    finally:
        store.close()
