"""SIGKILL a writer anywhere: the store shows each run whole or not at all ("no torn publication").

A child process (``tests.storage.crash_writer``) commits numbered runs — appends to ``events``,
replaces of ``latest``, keyed appends to ``keyed``, and folds of all three — into one store until
the parent SIGKILLs it. Most trials kill after a random delay; some stall the child at one exact
step (a part or manifest written but not renamed, written but not committed, inside the catalog
transaction before COMMIT, after the commit but before the run record flush) and kill it there.
Runs keep their manifests in their commits (small runs, ``storage.manifest``) except in the trials
stalled at a manifest object's steps, whose child writes every manifest as an object.
Every trial reopens the same store, so the state and the debris of earlier crashes accumulate.

After each kill the parent checks, from the catalog alone, that every table — at its head and at
every newer commit_seq (plus a sample of older ones) — answers exactly the rows of the runs whose
commits landed: all rows of each landed run, none of an unlanded one, the last replace for
``latest``, the latest row per key for ``keyed``; that the landed runs are exactly a prefix of the
runs the child attempted (acknowledged runs always land; the one in flight lands or not, as the
step it was killed at dictates); and that the run record agrees with the commit log. At the end,
collection removes exactly the unreferenced objects, leaves no temporaries and no part the
catalog does not know, and changes no answer.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from contextful.storage import Store
from contextful.storage.errors import SnapshotCollected
from contextful.storage.manifest import manifest_key
from contextful.storage.objects import TMP_MARK
from contextful.storage.parts import part_key
from contextful.storage.reserved import RUNS_TABLE

from tests.storage import crash_writer as cw
from tests.support.soak import trials

REPO = Path(__file__).resolve().parents[2]
RANDOM_TRIALS = trials(short=12, long=48)
"""Trials with a kill at a random moment, beside one stall-and-kill per named step."""
MAX_DELAY_S = 0.5
SPAN = 10_000
"""Run numbers each trial may use: trial t numbers its operations from (t + 1) * SPAN."""
PRE_COMMIT_STEPS = frozenset({"plan", "part-tmp", "part-done", "manifest-tmp", "manifest-done", "commit-cas"})
STALLS = (
    "run:plan", "run:part-tmp", "run:part-done", "run:manifest-tmp", "run:manifest-done", "run:commit-cas",
    "run:landed", "run:runs-part-tmp", "run:runs-manifest-done", "run:runs-commit-cas",
    "fold:part-tmp", "fold:manifest-done", "fold:commit-cas",
)
SNAPSHOT_SAMPLE = 3


rows = functools.lru_cache(maxsize=None)(cw.rows)


def batches_rows(n: int) -> list[int]:
    return [b.num_rows for b in cw.batches(n) if b.num_rows]


# --- the child ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    start: int
    stall: str | None
    acked: list[int] = field(default_factory=list)
    """Operation numbers the child reported done, in order."""
    folds: list[tuple[str, int | None]] = field(default_factory=list)
    """Each acknowledged fold's table and commit_seq (None when there was nothing to fold)."""
    marker: str = ""
    """The last event the child passed before the kill."""

    @property
    def inflight(self) -> int:
        return self.acked[-1] + 1 if self.acked else self.start


def run_child(root: Path, work: Path, start: int, stall: str | None, delay: float) -> Outcome:
    marker = work / "marker"
    marker.write_bytes(b"\0" * cw.MARKER_BYTES)
    cmd = [sys.executable, "-m", "tests.storage.crash_writer", str(root), str(start), "--marker", str(marker)]
    if stall:
        cmd += ["--stall", stall]
    if stall and "manifest-" in stall:  # a manifest object's own steps (a small run's rides in its commit)
        cmd += ["--manifest-objects"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    lines: list[str] = []
    ready, stalled = threading.Event(), threading.Event()
    with open(work / "stderr", "w+") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.strip())
                if line.startswith("ready"):
                    ready.set()
                elif line.startswith("STALL"):
                    stalled.set()
            ready.set()
            stalled.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert ready.wait(300), "the writer never said it was ready"
            if stall:
                assert stalled.wait(300), f"the writer never reached its stall point {stall}"
            else:
                time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(10)
        err.seek(0)
        stderr = err.read()
    assert proc.returncode == -signal.SIGKILL, f"writer exited {proc.returncode} before the kill:\n{stderr}"
    assert "ready" in lines, f"writer never opened the store:\n{stderr}"
    if stall:
        assert f"STALL {stall.rpartition(':')[0]}" in lines, f"writer never reached {stall}:\n{lines[-5:]}\n{stderr}"
    out = Outcome(start, stall, marker=marker.read_bytes().rstrip(b"\0").decode())
    for line in lines:
        if line.startswith("done "):
            words = line.split()
            out.acked.append(int(words[1]))
            if len(words) > 2:
                out.folds.append((words[3], None if words[4] == "none" else int(words[4])))
    assert out.acked == list(range(start, start + len(out.acked)))
    return out


# --- what the catalog says must be answered -----------------------------------------------------


class Answer:
    """The rows a table answers after a sequence of landed runs, computed from their numbers."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.appended: list[tuple[Any, ...]] = []
        self.by_key: dict[Any, tuple[Any, ...]] = {}

    def apply(self, n: int) -> None:
        if self.name == cw.LATEST:
            self.appended = list(rows(n))
        elif self.name == cw.KEYED:
            self.by_key.update((row[0], row) for row in rows(n))
        else:
            self.appended.extend(rows(n))

    def expected(self) -> list[tuple[Any, ...]]:
        return sorted(self.by_key.values() if self.name == cw.KEYED else self.appended)


def answered(store: Store, name: str, seq: int) -> list[tuple[Any, ...]]:
    result = store.table(name).to_arrow(commit_seq=seq)
    if result.num_rows:
        assert result.schema.equals(cw.SCHEMAS[name]), f"{name}@{seq} answers schema {result.schema}"
    return sorted(tuple(r.values()) for r in result.to_pylist())


def assert_answers(store: Store, name: str, seq: int, expected: list[tuple[Any, ...]]) -> None:
    actual = answered(store, name, seq)
    if actual != expected:
        missing = Counter(expected) - Counter(actual)
        extra = Counter(actual) - Counter(expected)
        def runs(c: Counter) -> list:
            return sorted({r[0] if name != cw.KEYED else r[1] for r in c})

        pytest.fail(f"{name} at commit_seq {seq}: {len(actual)} rows, expected {len(expected)};"
                    f" missing rows of runs {runs(missing)}, extra rows of runs {runs(extra)}")


@dataclass
class Verified:
    landed: dict[str, tuple[str, int]]
    """run_id -> (table, commit_seq) of every landed numbered run."""
    refused: int
    """Snapshots that raised SnapshotCollected (only allowed with ``collected_ok``)."""
    heads: dict[str, int]
    folds: dict[str, list[int]]
    """Each table's fold commit_seqs."""


def verify(store: Store, since: dict[str, int], rng: random.Random | None, collected_ok: bool = False) -> Verified:
    """Check every table against its commit log.

    Snapshots newer than ``since[table]`` and the head are read; with ``rng`` a sample of older
    ones too, without it every one. Manifests of commits newer than ``since`` are checked. With
    ``collected_ok`` a snapshot before the head may refuse with SnapshotCollected.
    """
    landed: dict[str, tuple[str, int]] = {}
    refused = 0
    heads: dict[str, int] = {}
    folds: dict[str, list[int]] = {}
    for name in cw.TABLES:
        table = store.table(name)
        head = table.refresh().commit_seq
        commits = table.commits()
        assert [c.commit_seq for c in commits] == list(range(1, head + 1)), f"{name}: gaps in the commit log"
        old = since.get(name, 0)
        check = set(range(old + 1, head + 1)) | {head}
        if rng is None:
            check |= set(range(old + 1))
        else:
            check |= set(rng.sample(range(old + 1), min(SNAPSHOT_SAMPLE, old + 1)))
        added: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for p in store.catalog.all_parts(name):
            added[p.added_seq].append((p.path, p.rows))
        answer = Answer(name)
        last = -1
        folds[name] = []
        if 0 in check:
            assert_answers(store, name, 0, [])
        for c in commits:
            n = cw.run_no(c.run_id)
            if c.kind == "fold":
                assert n is None and c.run_id.startswith("fold-"), c
                folds[name].append(c.commit_seq)
            else:
                assert n is not None, c
                assert cw.operation(n) == ("run", name), f"run {n} landed on {name}"
                assert c.kind == cw.run_kind(name), c
                assert c.run_id not in landed, f"{c.run_id} landed twice"
                assert n > last, f"{name}: run {n} committed after run {last}"
                assert c.rows == len(rows(n)), c
                landed[c.run_id] = (name, c.commit_seq)
                last = n
                answer.apply(n)
            if c.commit_seq > old:
                assert c.manifest == manifest_key(name, c.run_id), c
                manifest = table.manifest(c.run_id)
                assert (manifest.run_id, manifest.kind) == (c.run_id, c.kind)
                assert sorted((p.path, p.rows) for p in manifest.parts) == sorted(added[c.commit_seq]), c
                if n is not None:
                    assert [(p.path, p.rows) for p in manifest.parts] == [
                        (part_key(name, c.run_id, i), r) for i, r in enumerate(batches_rows(n))]
            if c.commit_seq in check:
                try:
                    assert_answers(store, name, c.commit_seq, answer.expected())
                except SnapshotCollected:
                    if not collected_ok or c.commit_seq == head:
                        raise
                    refused += 1
        heads[name] = head
    verify_run_record(store, landed)
    return Verified(landed, refused, heads, folds)


def verify_run_record(store: Store, landed: dict[str, tuple[str, int]]) -> None:
    """The run record holds a commit row for exactly the landed runs, and a plan row for each."""
    history = store.runs.history().to_pylist()
    commits = {r["run_id"]: (r["table_name"], r["commit_seq"]) for r in history if r["phase"] == "commit"}
    assert commits == landed
    plans = {r["run_id"] for r in history if r["phase"] == "plan"}
    assert set(landed) <= plans
    durable = store.table(RUNS_TABLE).to_arrow() if RUNS_TABLE in store.table_names(include_reserved=True) else None
    for r in durable.to_pylist() if durable is not None else []:
        if r["phase"] == "commit":
            assert landed.get(r["run_id"]) == (r["table_name"], r["commit_seq"]), r


def verify_trial(outcome: Outcome, before: Verified, after: Verified) -> None:
    """Acknowledged operations landed; the one in flight did or did not, as its kill step says."""
    inflight = outcome.inflight
    op, table = cw.operation(inflight)
    ends = {inflight, inflight + 1}
    fold_extra = {0, 1} if op == "fold" else {0}
    if outcome.stall:
        stall_op, step, _k = outcome.stall.split(":")
        assert stall_op == op, f"stalled at {outcome.stall} during a {op}"
        lands = step not in PRE_COMMIT_STEPS
        ends = {inflight + 1 if lands else inflight}
        fold_extra = {1 if lands else 0}
    numbers = [cw.run_no(rid) for rid in after.landed]
    mine = sorted(n for n in numbers if n is not None and outcome.start <= n < outcome.start + SPAN)
    assert any(mine == [m for m in range(outcome.start, end) if cw.operation(m)[0] == "run"] for end in ends), (
        f"landed runs {mine[-5:]} of trial from {outcome.start}: acknowledged up to {inflight - 1},"
        f" in flight {inflight} ({op} {table}), stall {outcome.stall}")
    assert set(before.landed) <= set(after.landed)
    for name in cw.TABLES:
        new = [s for s in after.folds[name] if s > before.heads[name]]
        acked = [seq for t, seq in outcome.folds if t == name and seq is not None]
        assert set(acked) <= set(new), f"{name}: acknowledged folds {acked}, landed {new}"
        extra = fold_extra if (op, table) == ("fold", name) else {0}
        assert len(new) - len(acked) in extra, f"{name}: {len(new)} new folds, {len(acked)} acknowledged"


# --- objects on disk ----------------------------------------------------------------------------


def unreferenced(store: Store) -> set[str]:
    """Keys under ``tables/`` that no commit references: orphan parts, manifests, temporaries."""
    out = set()
    root = Path(store.objects.root)
    for name in store.table_names(include_reserved=True):
        referenced = {p.path for p in store.catalog.all_parts(name)}
        referenced |= {c.manifest for c in store.catalog.commits(name) if c.manifest}
        base = root / "tables" / name
        for path in base.rglob("*"):
            if path.is_file() and (key := path.relative_to(root).as_posix()) not in referenced:
                out.add(key)
    return out


def assert_tidy(store: Store) -> None:
    """Every file under parts/ is a part the catalog knows and has not collected, and vice versa;
    every file under runs/ is a committed manifest; no temporary anywhere under the root."""
    root = Path(store.objects.root)
    temps = [p for p in root.rglob(f"*{TMP_MARK}*")]
    assert temps == []
    for name in store.table_names(include_reserved=True):
        parts = {p.path for p in store.catalog.all_parts(name) if p.collected_us is None}
        manifests = {c.manifest for c in store.catalog.commits(name) if c.manifest}
        base = root / "tables" / name
        on_disk = {p.relative_to(root).as_posix() for p in (base / "parts").glob("*") if p.is_file()}
        assert on_disk == parts, f"{name}: unknown {sorted(on_disk - parts)[:3]}, missing {sorted(parts - on_disk)[:3]}"
        runs = {p.relative_to(root).as_posix() for p in (base / "runs").glob("*") if p.is_file()}
        assert runs <= manifests, f"{name}: uncommitted manifests {sorted(runs - manifests)[:3]}"
        assert {p.relative_to(root).as_posix() for p in base.rglob("*") if p.is_file()} == on_disk | runs


# --- the test -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_leaves_each_run_whole_or_absent(tmp_path: Path) -> None:
    seed = int(os.environ.get("CONTEXTFUL_CRASH_SEED", random.randrange(2**32)))
    print(f"crash test seed {seed}")
    rng = random.Random(seed)
    root = tmp_path / "store"
    plans: list[str | None] = [None] * RANDOM_TRIALS
    plans += [f"{s}:{rng.randint(1, 2) if s.startswith('fold:') else rng.randint(1, 6)}" for s in STALLS]
    rng.shuffle(plans)

    with Store.open(root) as store:
        for name in cw.TABLES:
            store.create_table(name, cw.PRIMARY_KEYS[name])
        state = verify(store, {}, rng)
    kills: Counter[str] = Counter()
    for trial, stall in enumerate(plans):
        start = (trial + 1) * SPAN
        outcome = run_child(root, tmp_path, start, stall, rng.uniform(0, MAX_DELAY_S))
        if stall is None:
            kills[outcome.marker or "(before any step)"] += 1
        with Store.open(root) as store:
            after = verify(store, state.heads, rng)
        verify_trial(outcome, state, after)
        state = after
    print(f"{len(plans)} kills, {len(state.landed)} runs landed; last step before each random kill: {dict(kills)}")

    with Store.open(root) as store:
        debris = unreferenced(store)
        # the stalls guarantee each kind of debris: a temporary, an orphan part, an orphan manifest
        assert any(TMP_MARK in k for k in debris)
        assert any("/parts/" in k and TMP_MARK not in k for k in debris)
        assert any("/runs/" in k and TMP_MARK not in k for k in debris)
        result = store.collect(grace_seconds=0)
        assert set(result.orphans) == debris
        assert result.removed_parts == []
        assert_tidy(store)
        verify(store, {}, None)

        # past retention, parts replaced or folded away go too: the heads answer the same, and a
        # snapshot that read a collected part refuses instead of answering short
        removed = {p.path for name in store.table_names(include_reserved=True)
                   for p in store.catalog.all_parts(name) if p.removed_seq is not None}
        result = store.collect(grace_seconds=0, retain_seconds=0)
        assert set(result.removed_parts) == removed and result.orphans == []
        assert_tidy(store)
        assert verify(store, {}, None, collected_ok=True).refused > 0
