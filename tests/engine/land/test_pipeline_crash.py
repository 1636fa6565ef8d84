"""SIGKILL ``contextful pipeline run`` mid-run, re-run: every source row is in the table exactly once.

A files pipeline over 24 gzip shards of generated GitHub-archive events (ids unique, no primary key,
so a duplicate would show) runs as a real child process with a tiny checkpoint bound, so every input
is its own checkpoint commit carrying the cursor so far. The test SIGKILLs the child's whole process
group at a random instant inside the run: during start-up (a delay within a measured idle run), or a
random part of one input's measured time after the run's progress line for its first, second or third
input (so at a checkpoint commit, or while the next input decodes and stages). It then reopens the
store and checks that the table holds exactly the rows of the inputs the committed cursor records,
each once, and none of another input; that the cursor's inputs are a prefix of the sorted inputs; and
that no decoder fork server or child outlives the killed run. The next run resumes from the committed
cursor and is killed in turn; a last uninterrupted run finishes. Then every generated id is in the
table exactly once, and no decoder process survives.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from contextful.datasets.gharchive import write_shards
from contextful.engine.config import load_manifest
from contextful.engine.land.pipeline import cursor_scope
from contextful.storage import Store

from .test_pipeline import MANIFEST

EVENTS = 6000
SHARDS = 24
KILLS = 10
MIN_KILLS = 6
STRIDE = 2  # at most this many inputs of a run land before its kill is timed
CHECKPOINT_MIB = "0.001"  # ~1 KiB: every input reaches it, so every input is its own checkpoint commit
TAG = "CRASH_PROOF_TAG"  # env marker inherited by the CLI, its decoder server and children
DECODER = b"contextful.engine.land.decode_child"


def _env(tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    env[TAG] = tag
    return env


def _start(project: Path, tag: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "pipeline", "run",
         "--checkpoint-mib", CHECKPOINT_MIB],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=_env(tag), start_new_session=True)


def _run_to_end(project: Path, tag: str) -> float:
    started = time.monotonic()
    proc = _start(project, tag)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    return time.monotonic() - started


def _decoders(tag: str) -> list[int]:
    """Decoder fork servers and children started by this test (by the env marker), still alive."""
    marker = f"{TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if DECODER not in cmdline:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != b"Z":
            found.append(int(entry))
    return found


def _assert_no_decoders(tag: str) -> None:
    """Every decoder process of the run exits (its fork server hung up on): wait on each one's exit."""
    for pid in _decoders(tag):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([pidfd], [], [], 120)  # readable once it has exited; the bound only ends a hang
        finally:
            os.close(pidfd)
    alive = _decoders(tag)
    assert not alive, f"decoder processes outlived the run: {alive}"


def _landed(project: Path) -> tuple[list[str], list[int]]:
    """The committed cursor's inputs, in order, and the table's ids."""
    manifest = load_manifest(project)
    with Store.open(manifest.project.store, catalog_path=manifest.project.catalog) as store:
        spec = manifest.pipeline("gh")
        if spec.table not in store.table_names():
            return [], []
        table = store.table(spec.table)
        committed = table.cursor(cursor_scope(spec))
        # the cursor names inputs relative to the project
        inputs = [str(project / name) for name in committed[0]["inputs"]] if committed is not None else []
        ids = table.to_arrow().column("id").to_pylist() if table.count() else []
    return inputs, ids


def _shard_ids(path: Path) -> list[int]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [int(json.loads(line)["id"]) for line in f if line.strip()]


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_lands_every_row_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    tag = uuid.uuid4().hex

    # calibration: an uninterrupted run over all inputs, and a re-run with nothing to land
    calib = tmp_path / "calib"
    (calib / "raw").mkdir(parents=True)
    (calib / "contextful.toml").write_text(MANIFEST)
    write_shards(EVENTS, calib / "raw", shards=SHARDS, seed=11, gzip=True)
    full_s = _run_to_end(calib, tag)
    idle_s = _run_to_end(calib, tag)
    per_input_s = max(full_s - idle_s, 0.0) / SHARDS

    project = tmp_path / "project"
    (project / "raw").mkdir(parents=True)
    (project / "contextful.toml").write_text(MANIFEST)
    paths = write_shards(EVENTS, project / "raw", shards=SHARDS, seed=11, gzip=True)
    inputs = sorted(str(p) for p in paths)
    ids_of = {str(p): _shard_ids(p) for p in paths}
    all_ids = [i for p in inputs for i in ids_of[p]]
    assert len(all_ids) == EVENTS == len(set(all_ids))

    trail = []  # (progress lines waited for, delay after them, still running at the kill, inputs landed)
    while len(trail) < KILLS and (before := len(_landed(project)[0])) < SHARDS:
        # wait for k inputs of this run to land (k = 0: kill during start-up), then kill within the
        # time one input takes: at a checkpoint commit, or decoding and staging the next input
        k = rng.randint(0, min(STRIDE, SHARDS - before - 1))
        proc = _start(project, tag)
        assert proc.stderr is not None
        seen = 0
        while seen < k and (line := proc.stderr.readline()):
            seen += b" inputs, " in line
        delay = rng.uniform(0.0, per_input_s if k else idle_s)
        time.sleep(delay)
        running = proc.poll() is None
        if running:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        if not running:
            assert proc.returncode == 0, err.decode()

        landed, ids = _landed(project)
        trail.append((k, round(delay, 3), running, len(landed)))
        assert landed == inputs[:len(landed)], "the cursor's inputs are not a prefix of the sorted inputs"
        # an input's progress line follows the checkpoint commits of the inputs before it
        assert len(landed) >= before + max(k - 1, 0), f"a committed checkpoint was lost: {trail}"
        expected = [i for p in landed for i in ids_of[p]]
        assert len(ids) == len(expected), f"{len(ids)} rows for {len(expected)} rows of landed inputs"
        assert sorted(ids) == sorted(expected), "the rows are not exactly those of the cursor's inputs"
        _assert_no_decoders(tag)

    # enough kills, most of them mid-run, some between two checkpoints
    assert len(trail) >= MIN_KILLS, trail
    assert sum(running and n < SHARDS for _, _, running, n in trail) >= len(trail) // 2, trail
    assert any(running and 0 < n < SHARDS for _, _, running, n in trail), trail

    _run_to_end(project, tag)
    landed, ids = _landed(project)
    assert landed == inputs
    assert len(ids) == len(set(ids)) == EVENTS
    assert set(ids) == set(all_ids)
    sql = subprocess.run(
        [sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "--json", "sql",
         "SELECT count(*) AS n, count(DISTINCT id) AS d FROM gh_events"],
        capture_output=True, text=True, env=_env(tag), timeout=120, check=True)
    assert json.loads(sql.stdout) == [{"n": EVENTS, "d": EVENTS}]
    _assert_no_decoders(tag)
