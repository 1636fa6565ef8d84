"""The concurrency proof: separate OS processes appending to one table lose and duplicate nothing.

``WRITERS`` processes, each opening its own :class:`storage.Store` on the same root, start together
behind a barrier and append ``RUNS`` small batches each to one table. Afterwards the table holds
exactly ``WRITERS * RUNS`` appends, with the folds the writers' automatic compaction made between
them, numbered 1..N without a gap, every (writer, run) batch exactly once, and the run history
(``_runs`` merged with the catalog cache) a commit row for every run.
Runs on the embedded SQLite catalog (local store) and on the PostgreSQL catalog (local root,
``PostgresCatalog`` per process).
"""

from __future__ import annotations

import itertools
import multiprocessing
import queue
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.catalog.sqlite import SqliteCatalog
from contextful.storage.reserved import RUNS_TABLE

WRITERS = 4
RUNS = 50
ROWS_PER_RUN = 3
TABLE = "events"
START_TIMEOUT_S = 120.0
RESULT_TIMEOUT_S = 300.0


def _batch(writer: int, run: int) -> pa.Table:
    return pa.table({
        "writer": pa.array([writer] * ROWS_PER_RUN, pa.int32()),
        "run": pa.array([run] * ROWS_PER_RUN, pa.int32()),
        "i": pa.array(range(ROWS_PER_RUN), pa.int32()),
    })


def _open(root: str, pg: tuple[str, str] | None) -> Store:
    if pg is None:
        return Store.open(root)
    dsn, schema = pg
    return Store.open(root, catalog=PostgresCatalog(dsn, schema))


def _writer(writer: int, root: str, pg: tuple[str, str] | None, barrier: Any, results: Any) -> None:
    """One process: open its own store, wait for the others, append RUNS batches."""
    try:
        store = _open(root, pg)
        try:
            barrier.wait(START_TIMEOUT_S)
            landed = []
            for run in range(RUNS):
                result = store.append(TABLE, _batch(writer, run))
                landed.append((result.run_id, result.commit_seq, result.rows))
        finally:
            store.close()
        results.put((writer, "ok", landed))
    except BaseException:  # noqa: BLE001 - a child reports every failure to the test
        barrier.abort()  # release the other writers at once
        results.put((writer, "error", traceback.format_exc()))


def _knock_on(report: str) -> bool:
    """Whether a process failed only because another one had (it found the barrier broken)."""
    return "BrokenBarrierError" in report or "a writer failed" in report


def _run_writers(root: str, pg: tuple[str, str] | None) -> dict[int, list[tuple[str, int, int]]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    results = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(w, root, pg, barrier, results)) for w in range(WRITERS)]
    for proc in procs:
        proc.start()
    landed: dict[int, list[tuple[str, int, int]]] = {}
    errors: list[str] = []
    try:
        for _ in procs:
            writer, status, payload = results.get(timeout=RESULT_TIMEOUT_S)
            if status == "ok":
                landed[writer] = payload
            else:
                errors.append(f"writer {writer}:\n{payload}")
    except queue.Empty:
        errors.append("a writer process reported nothing in time")
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors.sort(key=_knock_on)  # the failure that broke the barrier first
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    return landed


def _assert_no_lost_or_duplicate_commit(store: Store, landed: dict[int, list[tuple[str, int, int]]]) -> None:
    total = WRITERS * RUNS
    table = store.table(TABLE)
    everything = table.commits()
    assert table.head.commit_seq == len(everything)
    assert [c.commit_seq for c in everything] == list(range(1, len(everything) + 1))
    # The writers' commits fold the table's small parts as they go (storage.compaction); a fold
    # that lost a race was dropped, never a writer's append.
    assert {c.kind for c in everything} == {"append", "fold"}
    assert len(table.snapshot().parts) < total // 4

    commits = [c for c in everything if c.kind == "append"]
    assert len(commits) == total
    assert all(c.rows == ROWS_PER_RUN for c in commits)

    # Every process saw its own commits land at distinct sequence numbers, and together they are
    # exactly the table's commit log.
    reported = {run_id: seq for runs in landed.values() for run_id, seq, _rows in runs}
    assert len(reported) == total
    assert reported == {c.run_id: c.commit_seq for c in commits}
    assert all(rows == ROWS_PER_RUN for runs in landed.values() for _r, _s, rows in runs)
    for runs in landed.values():
        seqs = [seq for _r, seq, _rows in runs]
        assert seqs == sorted(seqs)
    # The writers really raced: a serial schedule would switch writers only WRITERS - 1 times.
    writer_of = {run_id: w for w, runs in landed.items() for run_id, _s, _rows in runs}
    order = [writer_of[c.run_id] for c in commits]
    assert sum(a != b for a, b in itertools.pairwise(order)) >= WRITERS

    data = table.to_arrow()
    assert data.num_rows == total * ROWS_PER_RUN
    assert table.count() == total * ROWS_PER_RUN
    rows = data.to_pylist()
    per_batch = Counter((r["writer"], r["run"]) for r in rows)
    assert set(per_batch) == {(w, r) for w in range(WRITERS) for r in range(RUNS)}
    assert set(per_batch.values()) == {ROWS_PER_RUN}
    assert len({(r["writer"], r["run"], r["i"]) for r in rows}) == total * ROWS_PER_RUN

    history = store.runs.history().to_pylist()
    committed = {r["run_id"]: r for r in history if r["phase"] == "commit" and r["table_name"] == TABLE}
    assert set(committed) == set(reported)
    for run_id, row in committed.items():
        assert row["status"] == "committed"
        assert row["commit_seq"] == reported[run_id]
        assert row["rows"] == ROWS_PER_RUN
    planned = {r["run_id"] for r in history if r["phase"] == "plan" and r["table_name"] == TABLE}
    assert planned == set(reported)

    # Drain what the writers' racing flushes left in the cache: then the durable _runs table alone
    # holds both rows of every run.
    store.runs.flush()
    assert store.catalog.pending_run_records(10_000) == []
    durable = store.table(RUNS_TABLE).to_arrow().to_pylist()
    keys = Counter((r["run_id"], r["phase"]) for r in durable if r["table_name"] == TABLE)
    assert keys == Counter({(run_id, phase): 1 for run_id in reported for phase in ("plan", "commit")})
    committed_seqs = {r["run_id"]: r["commit_seq"] for r in durable
                      if r["phase"] == "commit" and r["table_name"] == TABLE}
    assert committed_seqs == reported


def test_processes_appending_to_one_table_on_sqlite(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    landed = _run_writers(root, None)
    store = Store.open(root)
    try:
        assert isinstance(store.catalog, SqliteCatalog)
        _assert_no_lost_or_duplicate_commit(store, landed)
    finally:
        store.close()


@pytest.mark.postgres
def test_processes_appending_to_one_table_on_postgres(tmp_path: Path, pg_dsn: str, pg_schema: str) -> None:
    root = str(tmp_path / "store")
    landed = _run_writers(root, (pg_dsn, pg_schema))
    store = _open(root, (pg_dsn, pg_schema))
    try:
        assert not (tmp_path / "store" / "catalog.sqlite").exists()
        _assert_no_lost_or_duplicate_commit(store, landed)
    finally:
        store.close()
