"""Run history (``_runs``) read in one columnar query answers what the row-by-row merge answered.

The oracle is the merge ``RunRecord.history`` did before it became one DuckDB query
(``storage.run_record.history_sql``): every row of ``_runs`` and every row of the catalog's cache
(flushed or not) as Python dicts, one row per ``(run_id, phase)`` (the latest ``recorded_at``, a
cached row winning a tie), sorted by ``recorded_at``, ``run_id``, plan rows first. Hypothesis draws
histories of plans, commits, fail rows, re-recorded rows, flushes, folds of ``_runs`` and clock
steps (zero steps make ties); after each, ``store.runs.history()`` and the ``_runs`` view of
``engine.read.connect`` must answer the oracle's rows, in its order wherever it defines one.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
from contextful.engine.read import connect
from contextful.storage import ManualClock, Store
from contextful.storage.fold import fold_table
from contextful.storage.reserved import RUNS_TABLE
from contextful.storage.run_record import RUNS_SCHEMA, RunFailure, _row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.hooked_catalog import HookedSqliteCatalog, Hooks

Row = dict[str, Any]


def oracle(store: Store) -> list[Row]:
    """The history as the row-by-row merge read it (the former ``RunRecord.history``)."""
    cached = pa.Table.from_pylist([_row(r.run_id, r.phase, r.table, r.payload) for r in store.catalog.run_records()],
                                  schema=RUNS_SCHEMA)
    names = store.table_names(include_reserved=True)
    durable = store.table(RUNS_TABLE).to_arrow() if RUNS_TABLE in names else RUNS_SCHEMA.empty_table()
    merged: dict[tuple[str, str], Row] = {}
    for row in durable.to_pylist() + cached.to_pylist():
        key = (row["run_id"], row["phase"])
        if key not in merged or row["recorded_at"] >= merged[key]["recorded_at"]:
            merged[key] = row
    return sorted(merged.values(), key=lambda r: (r["recorded_at"], r["run_id"], r["phase"] != "plan"))


def order_key(row: Row) -> tuple[Any, ...]:
    return row["recorded_at"], row["run_id"], row["phase"] != "plan"


def full_key(row: Row) -> tuple[Any, ...]:
    return tuple(repr(row[n]) for n in RUNS_SCHEMA.names)


def assert_same(got: list[Row], want: list[Row]) -> None:
    """The same rows, in the oracle's order wherever it defines one (exact ties keep either order)."""
    assert [order_key(r) for r in got] == [order_key(r) for r in want]
    assert sorted(got, key=full_key) == sorted(want, key=full_key)


def check(store: Store) -> None:
    want = oracle(store)
    history = store.runs.history()
    assert history.schema == RUNS_SCHEMA
    assert_same(history.to_pylist(), want)
    con = connect(store)
    try:
        view = con.sql(f'SELECT * FROM "{RUNS_TABLE}"').to_arrow_table().cast(RUNS_SCHEMA).to_pylist()
    finally:
        con.close()
    assert_same(view, want)


operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3)),
    st.tuples(st.just("plan"), st.integers(0, 5)),
    st.tuples(st.just("fail"), st.booleans()),
    st.tuples(st.just("replan"), st.integers(0, 9)),
    st.tuples(st.just("flush"), st.none()),
    st.tuples(st.just("fold"), st.none()),
    st.tuples(st.just("tick"), st.sampled_from([0, 0, 1, 2])),
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=12))
def test_history_answers_what_the_row_by_row_merge_answered(ops: list[tuple[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as root:
        clock = ManualClock()
        store = Store.open(root, clock=clock)
        store.runs.flush_rows = 1_000_000  # flushes happen only where the history says
        try:
            run_ids: list[str] = []
            for op, arg in ops:
                if op == "append":
                    result = store.append("t", pa.table({"k": list(range(arg))}), meta={
                        "bound_hits": [{"step": "pull", "attempt": arg, "bound": "rows"}]} if arg == 2 else None)
                    run_ids.append(result.run_id)
                elif op == "plan":
                    run_ids.append(f"r-planned-{len(run_ids)}-{arg}")
                    store.runs.plan(run_ids[-1], "t", "append")
                elif op == "fail" and run_ids:
                    failure = RunFailure("Canceled", "stopped", "canceled") if arg else RunFailure("Boom", "it broke")
                    store.runs.fail(run_ids[-1], "t", "append", failure)
                elif op == "replan" and run_ids:
                    store.runs.plan(run_ids[arg % len(run_ids)], "t", "replace")  # the same key, recorded again
                elif op == "flush":
                    store.runs.flush()
                elif op == "fold" and RUNS_TABLE in store.table_names(include_reserved=True):
                    fold_table(store, RUNS_TABLE, small_bytes=1 << 30, min_parts=2)
                elif op == "tick":
                    clock.advance(arg / 1_000_000)
                if op in ("flush", "fold"):
                    check(store)
            check(store)
        finally:
            store.close()


def test_a_row_recorded_again_while_a_flush_lands_stays_pending(tmp_path: Path) -> None:
    """A flush marks only the payload it flushed: the row recorded again meanwhile is still read from
    the cache (and flushed by the next flush), so history shows its newer payload."""
    hooks = Hooks()
    clock = ManualClock()
    store = Store.open(tmp_path / "s", clock=clock, catalog=HookedSqliteCatalog(str(tmp_path / "c.sqlite"), hooks))
    try:
        store.runs.plan("r1", "t", "append")
        clock.advance(1)

        def record_again(statement: str, _params: Any) -> None:
            if "WHERE flushed_seq IS NULL ORDER BY" in statement and "LIMIT" in statement:
                hooks.after_read = None
                store.runs.plan("r1", "t", "replace")

        hooks.after_read = record_again
        assert store.runs.flush() == 1
        assert [(r.run_id, r.payload["kind"]) for r in store.catalog.pending_run_records(10)] == [("r1", "replace")]
        [row] = store.runs.history().to_pylist()
        assert row["kind"] == "replace"
        check(store)
        assert store.runs.flush() == 1
        assert store.catalog.pending_run_records(10) == []
        assert [r["kind"] for r in store.table(RUNS_TABLE).to_arrow().to_pylist()] == ["replace"]
        check(store)
    finally:
        store.close()


def test_history_of_a_store_without_runs_is_empty_and_typed(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s", clock=ManualClock())
    try:
        assert store.runs.history() == RUNS_SCHEMA.empty_table()
        check(store)
    finally:
        store.close()


def test_the_read_path_does_not_import_pandas(tmp_path: Path) -> None:
    """Opening the read path and counting, in a fresh process (pytest's plugins may import pandas)."""
    with Store.open(tmp_path / "s") as store:
        store.append("t", pa.table({"k": [1]}))
        store.runs.flush()
        store.runs.plan("r-open", "t", "append")
    script = f"""
import sys
from contextful.engine.read import connect
con = connect({str(tmp_path / "s")!r})
assert con.sql("SELECT count(*) FROM t").fetchall() == [(1,)]
assert con.sql('SELECT count(*) FROM "_runs"').fetchall() == [(3,)]
assert con.sql('SELECT count(*) FROM "_items"').fetchall() == [(0,)]
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
