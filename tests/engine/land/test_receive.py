"""Received batches over real HTTP on loopback: spooled, grouped, keyed, expired, crash-safe.

Servers run in a thread of the test (``serve_receivers``, with a manual clock where the test
reasons about retention) or as a child process serving through ``engine.cli.serve`` (killed with
SIGKILL for the crash proof). The land lock is held by the test itself (an ``flock`` on the
queue's ``land.lock``) wherever batches must pile up behind it.
"""

from __future__ import annotations

import fcntl
import gzip
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pytest
from click.testing import CliRunner
from contextful.engine.config.manifest import SOURCE_KINDS, Manifest, PipelineSpec, SourceSpec
from contextful.engine.land.decode import Decoder
from contextful.engine.land.receive import writers
from contextful.engine.land.receive.config import MAX_GROUP_BYTES, ReceiveConfig, check_config
from contextful.engine.land.receive.group import (
    attempt_run_id,
    drain_queue,
    group_digest,
    owner_scope,
    run_stem,
    take_group,
)
from contextful.engine.land.receive.server import KEY_HEADER, ReceiveServer, serve_receivers
from contextful.engine.land.receive.spool import Member, key_digest
from contextful.engine.project import parse_project
from contextful.storage import ManualClock, Store
from contextful.storage.errors import ManifestInvalid, ManifestKeyUnknown, ManifestValueInvalid

PIPELINE = "clicks"
RUN_ID = re.compile(r"receive-[0-9a-f]{32}\.clicks(\.\d+)?")

# A serve child: the manifest built in code (the manifest parser learns kind "receive" separately),
# served by the CLI's own serving function, so its output line and signal handling are the CLI's.
BOOT = """
import json, sys
from pathlib import Path
from contextful.engine.cli.serve import serve_manifest
from contextful.engine.config.manifest import Manifest, PipelineSpec, SourceSpec
from contextful.engine.project import parse_project
root = Path(sys.argv[1])
project, _ = parse_project({}, root)
spec = PipelineSpec(id="clicks", source=SourceSpec("receive", json.loads(sys.argv[2])), table="clicks")
serve_manifest(Manifest(root, project, (spec,)), None, "127.0.0.1:0")
"""

# A receiver that dies right after spooling (and leaves half-written files behind).
SPOOL_AND_DIE = """
import os, signal, sys, time
import pyarrow as pa
from contextful.engine.land.receive.spool import Queue, key_digest
queue, key = Queue(sys.argv[1], "clicks"), sys.argv[2]
now = time.time_ns() // 1000
digest = key_digest("clicks", key)
queue.index.touch(digest, key, now)
data = pa.table({"batch": [key] * 3, "i": [0, 1, 2]})
queue.spool(key, digest, {"clicks": data}, received_us=now, body_bytes=0, body_sha256="")
# members this writer never finished, named as the queue names its own (their writer: this process)
(queue.dir / f"{queue.member_id()[:-8]}deadbeef.clicks.arrow").write_bytes(b"half")
(queue.dir / f".tmp-{queue.member_id()[:-8]}deadbeef.json").write_bytes(b"{")
queue.body_path().write_bytes(b"{}")
os.kill(os.getpid(), signal.SIGKILL)
"""

# A leader that dies between planning its run (the plan row recorded) and committing it.
PLAN_AND_DIE = """
import os, signal, sys, time
import pyarrow as pa
from contextful.engine.land.receive.group import attempt_run_id, run_stem
from contextful.engine.land.receive.spool import Queue, key_digest
from contextful.storage import Store
root, key = sys.argv[1], sys.argv[2]
queue, store = Queue(root + "/.contextful/queue", "clicks"), Store.open(root + "/.contextful/store")
now = time.time_ns() // 1000
digest = key_digest("clicks", key)
queue.index.touch(digest, key, now)
data = pa.table({"batch": [key] * 4, "i": [0, 1, 2, 3]})
queue.spool(key, digest, {"clicks": data}, received_us=now, body_bytes=0, body_sha256="")
with queue.land_lock():
    stem = run_stem(digest, "clicks")
    txn = store.create_table("clicks").transaction("append", run_id=attempt_run_id(stem, queue.index.next_attempt(stem)))
    txn.stage(data)
    os.kill(os.getpid(), signal.SIGKILL)
"""


# --- helpers -----------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path.cwd()), env.get("PYTHONPATH")) if p)
    return env


def ndjson(key: str, rows: int, start: int = 0) -> bytes:
    return "".join(json.dumps({"batch": key, "i": i}) + "\n" for i in range(start, start + rows)).encode()


TOKENS: dict[str, str] = {}
"""The writer key of each served URL (issued by whatever started the server); ``post`` sends it."""
SERVED_KEY = "served"
"""``post``'s default ``token``: the served URL's key from ``TOKENS``."""


def issue_writer(root: Path, url: str) -> str:
    """Issue a writer key for the test pipeline and remember it as ``url``'s."""
    TOKENS[url] = writers.issue(root, [PIPELINE]).token
    return TOKENS[url]


def auth(url: str) -> str:
    """The ``Authorization`` header line for ``url``'s writer key."""
    return f"Authorization: Bearer {TOKENS[url]}\r\n"


def post(url: str, key: str | None, body: bytes, *, pipeline: str = PIPELINE,
         headers: dict[str, str] | None = None, timeout: float = 60,
         token: str | None = SERVED_KEY) -> tuple[int, dict[str, Any]]:
    """POST a batch; ``token`` is the writer key sent (the URL's own by default, None for none)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        sent = dict(headers or {})
        token = TOKENS.get(url) if token == SERVED_KEY else token
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if key is not None:
            sent[KEY_HEADER] = key
        conn.request("POST", f"/pipelines/{pipeline}/batches", body=body, headers=sent)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def manifest_for(root: Path, types: dict[str, str] | None = None, **config: Any) -> Manifest:
    project, problems = parse_project({}, root)
    assert not problems
    source = SourceSpec("receive", {"key_retention_secs": 60, **config})
    return Manifest(root, project, (PipelineSpec(id=PIPELINE, source=source, table=PIPELINE, types=types or {}),))


def queue_dir(root: Path) -> Path:
    return root / ".contextful" / "queue" / PIPELINE


def open_store(root: Path) -> Store:
    return Store.open(root / ".contextful" / "store")


def sidecars(root: Path) -> list[Path]:
    return sorted(p for p in queue_dir(root).glob("*.json") if not p.name.startswith("."))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@contextmanager
def land_lock_held(root: Path) -> Iterator[None]:
    """Hold the pipeline's land lock as another leader would."""
    fd = os.open(queue_dir(root) / "land.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def rows_by_batch(root: Path) -> dict[str, int]:
    with open_store(root) as store:
        if PIPELINE not in store.table_names():
            return {}
        data = store.table(PIPELINE).to_arrow()
        if data.num_rows == 0:
            return {}
        counts = data.group_by("batch").aggregate([("i", "count")]).to_pylist()
    return {str(r["batch"]): int(r["i_count"]) for r in counts}


def receive_commits(root: Path) -> list[Any]:
    """The commits received batches landed (the folds automatic compaction made between them left out)."""
    with open_store(root) as store:
        if PIPELINE not in store.table_names():
            return []
        return [c for c in store.table(PIPELINE).commits() if c.kind != "fold"]



Serve = Callable[..., ReceiveServer]


@pytest.fixture
def serve(tmp_path: Path, decoder: Decoder) -> Iterator[Serve]:
    """Start a receive server in this process for ``tmp_path``'s project (one per test)."""
    servers: list[ReceiveServer] = []

    def start(*, clock: ManualClock | None = None, types: dict[str, str] | None = None,
              push: Callable[[Any], None] | None = None, **config: Any) -> ReceiveServer:
        manifest = manifest_for(tmp_path, types, **config)
        server = serve_receivers(lambda: open_store(tmp_path), manifest, "127.0.0.1:0",
                                 queue_root=tmp_path / ".contextful" / "queue", decoder=decoder, clock=clock,
                                 push=push)
        servers.append(server)
        issue_writer(tmp_path, server.url)
        assert server.recovered(timeout=30)
        return server

    yield start
    for server in servers:
        server.shutdown(grace_s=10)


def start_child(root: Path, config: dict[str, Any]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-c", BOOT, str(root), json.dumps(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=_env(),
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
    if match is None:
        proc.kill()
        raise AssertionError(f"serve child said {line!r}: {proc.communicate()[1]}")
    issue_writer(root, match.group(1))
    return proc, match.group(1)


# --- config ------------------------------------------------------------------------------------


def test_config_requires_a_retention_and_reports_every_problem() -> None:
    problems = check_config("src", {"max_queue_depth": 0, "format": "csv", "paths": ["x"]})
    assert {(type(p).__name__, getattr(p, "key", None)) for p in problems} == {
        ("ManifestKeyUnknown", "paths"), ("ManifestValueInvalid", "key_retention_secs"),
        ("ManifestValueInvalid", "max_queue_depth"), ("ManifestValueInvalid", "format")}
    missing = next(p for p in problems if getattr(p, "key", None) == "key_retention_secs")
    assert isinstance(missing, ManifestValueInvalid) and "required" in missing.detail
    assert all(isinstance(p, (ManifestKeyUnknown, ManifestValueInvalid)) for p in problems)
    assert check_config("src", {"key_retention_secs": True})  # a boolean is not a number of seconds
    assert check_config("src", {"key_retention_secs": 86400, "max_queue_depth": 8, "format": "json"}) == []
    config = ReceiveConfig.from_config({"key_retention_secs": 30})
    assert (config.key_retention_secs, config.max_queue_depth, config.format) == (30.0, 64, "ndjson")
    with pytest.raises(ManifestInvalid) as raised:
        ReceiveConfig.from_config({})
    assert [p.key for p in raised.value.problems] == ["key_retention_secs"]  # type: ignore[attr-defined]


def test_take_group_bounds_depth_and_bytes_and_keeps_duplicates_out() -> None:
    def member(n: int, key: str, size: int) -> Member:
        return Member(f"{n:020d}-1-00", PIPELINE, key, key_digest(PIPELINE, key), n, size, "", size, {PIPELINE: 1})

    mib = 1 << 20
    queue = [member(1, "a", 30 * mib), member(2, "a", 30 * mib), member(3, "b", 30 * mib), member(4, "c", 10 * mib)]
    assert [m.key for m in take_group(queue, 64)] == ["a", "b"]  # the duplicate of a waits; 64 MiB stops c
    assert [m.key for m in take_group(queue, 1)] == ["a"]
    assert [m.key for m in take_group([member(1, "big", 2 * MAX_GROUP_BYTES)], 64)] == ["big"]  # at least one


# --- run.land.receive-spool ----------------------------------------------------------------------


@pytest.mark.clause("run.land.receive-spool")
def test_malformed_body_answers_alone_while_good_batches_land(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    with ThreadPoolExecutor(4) as pool:
        with land_lock_held(tmp_path):
            good = {key: pool.submit(post, server.url, key, ndjson(key, 5)) for key in ("g1", "g2", "g3")}
            wait_for(lambda: len(sidecars(tmp_path)) == 3, "three spooled members")
            # every good member is spooled (sidecar and Arrow file) before any holder landed it
            assert all((queue_dir(tmp_path) / p.name.replace(".json", ".clicks.arrow")).is_file()
                       for p in sidecars(tmp_path))
            status, doc = post(server.url, "bad", b'{"batch": "bad", "i": 0}\n{"batch": "bad", "i": \n')
            assert (status, doc["error"]) == (400, "InputMalformed")
            assert "line 2" in doc["detail"] and "'bad'" in doc["detail"]
            assert len(sidecars(tmp_path)) == 3 and not any(f.done() for f in good.values())
        answers = {key: f.result(timeout=30) for key, f in good.items()}
    assert all(status == 200 and not doc["replayed"] for status, doc in answers.values())
    assert rows_by_batch(tmp_path) == {"g1": 5, "g2": 5, "g3": 5}
    assert sidecars(tmp_path) == []


@pytest.mark.clause("run.land.receive-spool", "run.land.receive-batch-key")
def test_next_leader_lands_a_dead_receivers_member(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    child = subprocess.run([sys.executable, "-c", SPOOL_AND_DIE, str(tmp_path / ".contextful" / "queue"), "dead-1"],
                           env=_env(), capture_output=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    [sidecar] = sidecars(tmp_path)
    assert json.loads(sidecar.read_text())["key"] == "dead-1"

    status, doc = post(server.url, "live-1", ndjson("live-1", 2))
    assert status == 200 and not doc["replayed"]
    both = group_digest(PIPELINE, ["dead-1", "live-1"])
    assert doc["tables"][0]["run_id"] == run_stem(both, PIPELINE)  # one run for both, keyed by the group
    assert rows_by_batch(tmp_path) == {"dead-1": 3, "live-1": 2}
    assert sidecars(tmp_path) == []
    # the dead receiver's sender retries: its key replays the group's run and lands nothing
    status, again = post(server.url, "dead-1", ndjson("dead-1", 3))
    assert (status, again["replayed"], again["tables"][0]["run_id"]) == (200, True, run_stem(both, PIPELINE))
    assert again["tables"][0]["rows"] == 3 and len(receive_commits(tmp_path)) == 1


@pytest.mark.clause("run.land.receive-spool")
def test_a_starting_server_lands_what_dead_receivers_spooled(tmp_path: Path, serve: Serve) -> None:
    for key in ("dead-1", "dead-2"):
        child = subprocess.run([sys.executable, "-c", SPOOL_AND_DIE, str(tmp_path / ".contextful" / "queue"), key],
                               env=_env(), capture_output=True, timeout=60, check=False)
        assert child.returncode == -signal.SIGKILL, child.stderr
    leftovers = [p.name for p in queue_dir(tmp_path).iterdir() if p.name.startswith(".tmp-") or "deadbeef" in p.name]
    assert len(leftovers) == 4 and len(list((queue_dir(tmp_path) / "incoming").iterdir())) == 2
    serve()  # no batch arrives: the server's start lands the queue
    wait_for(lambda: rows_by_batch(tmp_path) == {"dead-1": 3, "dead-2": 3}, "the spooled members to land")
    wait_for(lambda: sidecars(tmp_path) == [], "the queue to empty")
    names = [p.name for p in queue_dir(tmp_path).iterdir()]
    assert not [n for n in names if n.endswith(".arrow") or n.startswith(".tmp-")]  # half-written files swept
    assert list((queue_dir(tmp_path) / "incoming").iterdir()) == []
    [commit] = receive_commits(tmp_path)
    assert commit.run_id == run_stem(group_digest(PIPELINE, ["dead-1", "dead-2"]), PIPELINE)


@pytest.mark.clause("run.land.receive-spool")
def test_a_pipeline_run_drains_the_queue(tmp_path: Path) -> None:
    child = subprocess.run([sys.executable, "-c", SPOOL_AND_DIE, str(tmp_path / ".contextful" / "queue"), "dead-1"],
                           env=_env(), capture_output=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    manifest = manifest_for(tmp_path)
    with open_store(tmp_path) as store:
        result = drain_queue(store, manifest, manifest.pipelines[0])
        again = drain_queue(store, manifest, manifest.pipelines[0])
    assert result.ok and result.inputs_landed == ["dead-1"]
    assert [(t.table, t.rows, t.run_ids) for t in result.tables] == [
        (PIPELINE, 3, [run_stem(key_digest(PIPELINE, "dead-1"), PIPELINE)])]
    assert again.inputs_landed == [] and again.tables[0].rows == 0  # an empty queue lands nothing
    assert rows_by_batch(tmp_path) == {"dead-1": 3} and sidecars(tmp_path) == []


# --- run.land.receive-group ----------------------------------------------------------------------


@pytest.mark.clause("run.land.receive-group", "run.land.receive-batch-key")
def test_batches_behind_the_lock_land_as_one_run_and_push_once(tmp_path: Path, serve: Serve) -> None:
    pushes: list[Any] = []
    server = serve(push=pushes.append, types={"i": "int32"})
    keys = [f"k{n}" for n in range(5)]
    with ThreadPoolExecutor(5) as pool, land_lock_held(tmp_path):
        futures = [pool.submit(post, server.url, key, ndjson(key, n + 1)) for n, key in enumerate(keys)]
        wait_for(lambda: len(sidecars(tmp_path)) == 5, "five spooled members")
        assert receive_commits(tmp_path) == []  # nothing lands while another holds the lock
    answers = [f.result(timeout=30) for f in futures]
    digest = group_digest(PIPELINE, keys)
    for n, (status, doc) in enumerate(answers):
        assert status == 200 and doc["replayed"] is False and doc["key"] == keys[n]
        assert doc["tables"] == [{"table": PIPELINE, "run_id": run_stem(digest, PIPELINE), "commit_seq": 1,
                                  "rows": n + 1, "group": digest}]
    [commit] = receive_commits(tmp_path)
    assert (commit.run_id, commit.rows) == (run_stem(digest, PIPELINE), 15)
    with open_store(tmp_path) as store:
        table = store.table(PIPELINE)
        meta = table.manifest(commit.run_id).meta
        assert meta["pipeline"] == PIPELINE and sorted(meta["receive_group"]) == keys
        assert len(table.snapshot().parts) == 1  # one part for the group, not one per batch
        assert table.schema is not None and table.schema.field("i").type == pa.int32()  # typed landing
        for key in keys:  # each key's owner scope names the group's run
            value, seq = table.cursor(owner_scope(key_digest(PIPELINE, key)))
            assert (value["run_id"], value["group"], seq) == (commit.run_id, digest, 1)
    assert len(pushes) == 1 and sorted(m.key for m in pushes[0].landed) == keys
    # a member of the group re-sent replays the group's run
    status, doc = post(server.url, "k3", ndjson("k3", 4))
    assert (status, doc["replayed"], doc["tables"][0]["run_id"]) == (200, True, run_stem(digest, PIPELINE))
    assert len(receive_commits(tmp_path)) == 1 and len(pushes) == 1


@pytest.mark.clause("run.land.receive-group")
def test_max_queue_depth_bounds_a_group(tmp_path: Path, serve: Serve) -> None:
    server = serve(max_queue_depth=2)
    keys = [f"d{n}" for n in range(5)]
    with ThreadPoolExecutor(5) as pool, land_lock_held(tmp_path):
        futures = []
        for n, key in enumerate(keys):  # spooled one after another: the queue's order is the keys' order
            futures.append(pool.submit(post, server.url, key, ndjson(key, 2)))
            wait_for(lambda n=n: len(sidecars(tmp_path)) == n + 1, f"member {n} spooled")
    answers = [f.result(timeout=30) for f in futures]
    assert all(status == 200 for status, _ in answers)
    expected = [run_stem(group_digest(PIPELINE, ["d0", "d1"]), PIPELINE),
                run_stem(group_digest(PIPELINE, ["d2", "d3"]), PIPELINE),
                run_stem(key_digest(PIPELINE, "d4"), PIPELINE)]  # a lone member keys its run by itself
    assert [c.run_id for c in receive_commits(tmp_path)] == expected
    assert [doc["tables"][0]["run_id"] for _, doc in answers] == [expected[0]] * 2 + [expected[1]] * 2 + [expected[2]]
    assert rows_by_batch(tmp_path) == {key: 2 for key in keys}


# --- run.land.receive-batch-key ------------------------------------------------------------------


@pytest.mark.clause("run.land.receive-batch-key")
def test_a_key_fixes_its_run_id_and_a_landed_key_replays(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    status, first = post(server.url, "order-17", ndjson("order-17", 3))
    digest = key_digest(PIPELINE, "order-17")
    assert status == 200 and first["replayed"] is False
    assert first["tables"] == [{"table": PIPELINE, "run_id": f"receive-{digest}.clicks", "commit_seq": 1,
                                "rows": 3, "group": digest}]
    for body in (ndjson("order-17", 3), ndjson("order-17", 9), b"not even json"):  # replays read no body
        status, again = post(server.url, "order-17", body)
        assert (status, again["replayed"], again["tables"]) == (200, True, first["tables"])
    assert [c.run_id for c in receive_commits(tmp_path)] == [f"receive-{digest}.clicks"]
    assert rows_by_batch(tmp_path) == {"order-17": 3}
    status, doc = post(server.url, None, ndjson("x", 1))
    assert (status, doc["error"]) == (400, "SpecInvalid") and KEY_HEADER in doc["detail"]


@pytest.mark.clause("run.land.receive-batch-key")
def test_an_attempt_after_a_planned_uncommitted_run_takes_the_next_suffix(tmp_path: Path, serve: Serve) -> None:
    child = subprocess.run([sys.executable, "-c", PLAN_AND_DIE, str(tmp_path), "late-1"], env=_env(),
                           capture_output=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    stem = run_stem(key_digest(PIPELINE, "late-1"), PIPELINE)
    with open_store(tmp_path) as store:
        history = store.runs.history().to_pylist()
    assert [(r["run_id"], r["phase"]) for r in history if r["run_id"].startswith(stem)] == [(stem, "plan")]
    assert receive_commits(tmp_path) == []

    server = serve()  # its start-up drain lands the dead leader's spooled member under the next attempt
    wait_for(lambda: len(receive_commits(tmp_path)) == 1, "the spooled member to land")
    status, doc = post(server.url, "late-1", ndjson("late-1", 4))
    assert (status, doc["replayed"], doc["tables"][0]["run_id"]) == (200, True, attempt_run_id(stem, 2))
    assert doc["tables"][0]["run_id"] == f"{stem}.2"
    assert [c.run_id for c in receive_commits(tmp_path)] == [f"{stem}.2"]
    assert rows_by_batch(tmp_path) == {"late-1": 4}
    with open_store(tmp_path) as store:
        phases = {(r["run_id"], r["phase"]) for r in store.runs.history().to_pylist()}
    assert (stem, "commit") not in phases and (f"{stem}.2", "commit") in phases


# --- run.land.receive-key-expired ----------------------------------------------------------------


def _raw_post(url: str, key: str, length: int, body: bytes, expect: bool = False) -> tuple[int, dict[str, Any], bytes]:
    """POST declaring ``length`` body bytes but sending only ``body``; the status, JSON and what followed."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = (f"POST /pipelines/{PIPELINE}/batches HTTP/1.1\r\nHost: {host}\r\n{KEY_HEADER}: {key}\r\n{auth(url)}"
                f"Content-Length: {length}\r\nContent-Type: application/x-ndjson\r\n"
                + ("Expect: 100-continue\r\n" if expect else "") + "\r\n")
        sock.sendall(head.encode() + body)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            assert chunk, "the server closed without answering"
            received += chunk
        header, rest = received.split(b"\r\n\r\n", 1)
        size = int(re.search(rb"Content-Length: (\d+)", header).group(1))  # type: ignore[union-attr]
        while len(rest) < size:
            rest += sock.recv(65536)
        after = sock.recv(65536)  # b"" once the server closed the connection
    return int(header.split()[1]), json.loads(rest[:size]), after


@pytest.mark.clause("run.land.receive-key-expired")
def test_an_expired_key_answers_410_before_reading_the_body_and_lands_nothing(tmp_path: Path, serve: Serve) -> None:
    clock = ManualClock()
    server = serve(clock=clock, key_retention_secs=1)
    malformed = b'{"batch": "x", "i": \n'
    status, doc = post(server.url, "k-bad", malformed)  # the key's first attempt, at t0
    assert (status, doc["error"]) == (400, "InputMalformed")
    clock.advance(0.6)
    status, doc = post(server.url, "k-bad", malformed)  # within the window: the body is read again
    assert status == 400
    clock.advance(0.6)  # 1.2 s after the first attempt (0.6 s after the last)

    # headers only: a server that read the body would wait for it; this one answers at once
    status, doc, after = _raw_post(server.url, "k-bad", 10_000, b"")
    assert (status, doc["error"]) == (410, "ReceiveBatchKeyExpired")
    assert "'k-bad'" in doc["detail"] and "key_retention_secs = 1" in doc["detail"]
    assert after == b""  # the unread body is not taken for the next request: the connection closes
    # a sender asking before it uploads gets 410 in place of "100 Continue"
    status, doc, _ = _raw_post(server.url, "k-bad", 10_000, b"", expect=True)
    assert (status, doc["error"]) == (410, "ReceiveBatchKeyExpired")
    # a body that would be malformed answers 410, not 400: it was never read
    status, doc, _ = _raw_post(server.url, "k-bad", len(malformed), malformed)
    assert (status, doc["error"]) == (410, "ReceiveBatchKeyExpired")
    status, doc = post(server.url, "k-bad", ndjson("k-bad", 2))  # a good body under it lands nothing either
    assert (status, doc["error"]) == (410, "ReceiveBatchKeyExpired")
    assert receive_commits(tmp_path) == [] and sidecars(tmp_path) == []

    # a landed key replays only within the window too
    status, doc = post(server.url, "k-good", ndjson("k-good", 2))
    assert status == 200 and not doc["replayed"]
    clock.advance(0.9)
    assert post(server.url, "k-good", b"")[1]["replayed"] is True
    clock.advance(0.2)
    status, doc = post(server.url, "k-good", ndjson("k-good", 2))
    assert (status, doc["error"]) == (410, "ReceiveBatchKeyExpired")
    assert rows_by_batch(tmp_path) == {"k-good": 2} and len(receive_commits(tmp_path)) == 1


def test_http_face_compressed_bodies_and_expect_continue(tmp_path: Path, serve: Serve) -> None:
    server = serve(format="json")
    records = json.dumps([{"batch": "gz", "i": i} for i in range(4)]).encode()
    status, doc = post(server.url, "gz", gzip.compress(records), headers={"Content-Encoding": "gzip"})
    assert status == 200 and doc["tables"][0]["rows"] == 4
    status, doc = post(server.url, "br", records, headers={"Content-Encoding": "br"})
    assert (status, doc["error"]) == (422, "InputUnreadable") and "'br'" in doc["detail"]
    status, doc = post(server.url, "nd", ndjson("nd", 2))  # format = "json": one array, not lines
    assert (status, doc["error"]) == (400, "InputMalformed")

    records = json.dumps([{"batch": "ex", "i": i} for i in range(3)]).encode()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST /pipelines/{PIPELINE}/batches HTTP/1.1\r\nHost: {host}\r\n{KEY_HEADER}: ex\r\n{auth(server.url)}"
                      f"Content-Length: {len(records)}\r\nExpect: 100-continue\r\n\r\n").encode())
        interim = sock.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 ")  # the key is live: the receiver asks for the body
        sock.sendall(records)
        answer = b""
        while b"}]}" not in answer:
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert rows_by_batch(tmp_path) == {"gz": 4, "ex": 3}


# --- crash proof and the command ---------------------------------------------------------------


def _spooled_or_done(root: Path, futures: list[Future[Any]]) -> bool:
    return bool(sidecars(root)) or all(f.done() for f in futures)


@pytest.mark.slow
@pytest.mark.clause("run.land.receive-spool", "run.land.receive-batch-key")
def test_sigkilled_receiver_loses_no_acknowledged_batch_and_retries_land_once(tmp_path: Path) -> None:
    """Each round a serve child receives the batches not yet acknowledged plus fresh ones, and is
    SIGKILLed within 60 ms of its first spooled member: while batches decode, spool, wait for the
    lock or land. After every kill each acknowledged batch is in the table, whole and once; a last
    unkilled round retries everything and every batch is there exactly once."""
    rng = random.Random(7)
    rounds, fresh = 5, 8
    size = {f"b{n:02d}": 1000 + 150 * n for n in range(rounds * fresh)}
    acknowledged: set[str] = set()
    cut_short = 0  # kills that left a batch sent in their round unacknowledged
    config = {"key_retention_secs": 3600, "max_queue_depth": 3}
    for n in range(rounds):
        sent = [k for k in list(size)[: (n + 1) * fresh] if k not in acknowledged]
        proc, url = start_child(tmp_path, config)
        pool = ThreadPoolExecutor(len(sent))
        futures = {key: pool.submit(post, url, key, ndjson(key, size[key]), timeout=30) for key in sent}
        wait_for(partial(_spooled_or_done, tmp_path, list(futures.values())), "a spooled member")
        time.sleep(rng.uniform(0, 0.06))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        answered = set()
        for key, future in futures.items():
            try:
                status, _ = future.result(timeout=30)
            except (OSError, http.client.HTTPException):
                continue  # the connection died with the server: not acknowledged
            if status == 200:
                answered.add(key)
        pool.shutdown()
        acknowledged |= answered
        cut_short += answered != set(sent)
        landed = rows_by_batch(tmp_path)
        assert all(landed.get(key) == size[key] for key in acknowledged)  # no acknowledged batch lost
        assert all(landed[key] == size[key] for key in landed)  # nothing landed twice or in part
    assert cut_short >= 1, "every kill came after all its batches were answered: nothing was proven"

    proc, url = start_child(tmp_path, config)
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = dict(zip(size, pool.map(lambda k: post(url, k, ndjson(k, size[k])), size)))
        assert all(status == 200 for status, _ in answers.values())
        assert all(doc["replayed"] for key, (_, doc) in answers.items() if key in acknowledged)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert rows_by_batch(tmp_path) == size  # every batch exactly once
    assert all(RUN_ID.fullmatch(c.run_id) for c in receive_commits(tmp_path))
    names = [p.name for p in queue_dir(tmp_path).iterdir()]
    assert not [n for n in names if n.endswith((".json", ".arrow")) or n.startswith(".tmp-")]


def test_serve_prints_its_address_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc, url = start_child(tmp_path, {"key_retention_secs": 60})
    try:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/healthz")
        assert json.loads(conn.getresponse().read()) == {"ok": True}  # names nothing to an unauthenticated caller
        conn.close()
        assert post(url, "one", ndjson("one", 2))[0] == 200
        status, doc = post(url, "one", b"", pipeline="nope")  # the key names only clicks
        assert (status, doc["error"]) == (403, "WriterPipelineRefused")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert rows_by_batch(tmp_path) == {"one": 2}


def test_register_serve_adds_the_command() -> None:
    from contextful.engine.cli.serve import register_serve

    group = click.Group("pipeline")
    register_serve(group)
    result = CliRunner().invoke(group, ["serve", "--help"])
    assert result.exit_code == 0 and "--http" in result.output


@pytest.mark.skipif("receive" not in SOURCE_KINDS, reason="the manifest parser does not know kind 'receive' yet")
def test_the_serve_command_serves_a_project(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(
        '[[pipeline]]\nid = "clicks"\n[pipeline.source]\nkind = "receive"\n'
        '[pipeline.source.config]\nkey_retention_secs = 60\n')
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli.serve", "--project", str(tmp_path), "--http",
                             "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout is not None
        url = re.fullmatch(r"listening on (http://\S+)\n", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
        issue_writer(tmp_path, url)
        assert post(url, "cli-1", ndjson("cli-1", 3))[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert rows_by_batch(tmp_path) == {"cli-1": 3}


def test_a_batch_with_names_differing_only_in_case_is_refused_by_name(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    status, doc = post(server.url, "k1", b'{"ID": 1, "id": 10}\n')
    assert (status, doc["error"]) == (422, "ColumnNamesCollide")
    assert "'ID' and 'id'" in doc["detail"] and "'k1'" in doc["detail"]
    assert sidecars(tmp_path) == []  # nothing spooled, nothing to land
