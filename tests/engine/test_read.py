"""The DuckDB read path: every table a view at a snapshot, as notebooks use it."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from contextful.engine import read as read_path
from contextful.storage import ManualClock, Store
from contextful.storage.clock import from_us
from contextful.storage.errors import ArgumentInvalid, SnapshotNotFound


def test_every_table_is_a_view_at_head_with_keys_resolved(store: Store) -> None:
    store.append("events", pa.table({"id": [1, 2], "kind": ["a", "b"]}))
    users = store.create_table("users", primary_key=["id"])
    users.append(pa.table({"id": [1, 2], "name": ["ann", "bob"]}))
    users.append(pa.table({"id": [2], "name": ["bea"]}))
    con = read_path.connect(store)
    assert con.sql("SELECT count(*) FROM events").fetchall() == [(2,)]
    assert con.sql("SELECT id, name FROM users ORDER BY id").fetchall() == [(1, "ann"), (2, "bea")]
    views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert {"events", "users", "_runs"} <= views


def test_views_are_pinned_and_as_of_reads_the_past(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store.open(tmp_path / "store", clock=clock)
    store.append("t", pa.table({"n": [1]}))
    clock.advance(10)
    middle = from_us(clock.now_us())
    clock.advance(10)
    store.append("t", pa.table({"n": [2]}))
    store.append("late", pa.table({"x": [1]}))
    con = read_path.connect(store)
    store.append("t", pa.table({"n": [3]}))
    assert con.sql("SELECT sum(n) FROM t").fetchall() == [(3,)]  # pinned at connect
    past = read_path.connect(store, as_of=middle.isoformat())
    assert past.sql("SELECT n FROM t").fetchall() == [(1,)]
    with pytest.raises(duckdb.Error) as caught:  # it had no commit yet: SnapshotNotFound, not "no such table"
        past.sql("SELECT * FROM late").fetchall()
    error = read_path.deferred_error(caught.value)
    assert isinstance(error, SnapshotNotFound) and error.table == "late"
    assert "its first commit landed at" in error.wanted
    store.close()


def test_connect_opens_a_project_directory_and_reads_evolved_and_empty_tables(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "demo"\nstore = "data/store"\n')
    store = Store.open(tmp_path / "data" / "store")
    store.append("t", pa.table({"a": pa.array([1], pa.int32())}))
    store.append("t", pa.table({"a": [2.5], "b": [{"x": 1}]}))
    empty = store.create_table("e")
    empty.append(pa.table({"z": pa.array([], pa.int64())}))
    store.close()
    con = read_path.connect(tmp_path)
    assert con.sql("SELECT a, b FROM t ORDER BY a").fetchall() == [(1.0, None), (2.5, {"x": 1})]
    assert con.sql("SELECT count(*) FROM e").fetchall() == [(0,)]
    assert [d[0] for d in con.sql("SELECT * FROM e").description] == ["z"]


def test_the_view_query_matches_reading_the_parts_directly(local_store: Store) -> None:
    for i in range(20):
        local_store.append("t", pa.table({"g": [i % 3] * 5, "v": list(range(5))}))
    con = read_path.connect(local_store)
    files = [local_store.objects.uri(p.path) for p in local_store.table("t").snapshot().parts]
    direct = con.sql(f"SELECT g, sum(v) FROM read_parquet({files!r}) GROUP BY g ORDER BY g").fetchall()
    assert con.sql("SELECT g, sum(v) FROM t GROUP BY g ORDER BY g").fetchall() == direct


def test_parse_instant_accepts_z_suffix() -> None:
    assert read_path.parse_instant("2026-01-01T00:00:00Z").utcoffset().total_seconds() == 0
    with pytest.raises(ArgumentInvalid):  # a catalogue error naming the value and the forms it takes
        read_path.parse_instant("yesterday")


def test_runs_view_at_head_includes_rows_still_in_the_catalog_cache(local_store: Store) -> None:
    result = local_store.append("t", pa.table({"n": [1]}))
    assert "_runs" not in local_store.table_names(include_reserved=True)  # not flushed yet
    con = read_path.connect(local_store)
    phases = con.execute("SELECT phase, status FROM _runs WHERE run_id = ? ORDER BY phase", [result.run_id]).fetchall()
    assert phases == [("commit", "committed"), ("plan", "planned")]


def test_views_follow_the_merge_rule_in_force_at_their_snapshot(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store.open(tmp_path / "store", clock=clock)
    users = store.create_table("users", primary_key=["id"])
    users.append(pa.table({"id": [1], "at": [9], "name": ["ann-9"]}))
    users.append(pa.table({"id": [1], "at": [1], "name": ["ann-1"]}))
    clock.advance(10)
    before = from_us(clock.now_us())
    clock.advance(10)
    store.create_table("users", primary_key=["id"], order_by="at")  # a commit of its own
    users.append(pa.table({"id": [1], "at": [5], "name": ["ann-5"]}))
    users.append(pa.table({"id": [1], "at": [3], "name": ["ann-3"]}))
    # Before the declaration: commit order. After it: ann-1 (the winner before it) competes by `at`.
    assert read_path.connect(store, as_of=before).sql("SELECT name FROM users").fetchall() == [("ann-1",)]
    assert read_path.connect(store).sql("SELECT name FROM users").fetchall() == [("ann-5",)]
    store.close()


@pytest.mark.parametrize("store_kind", ["local", "postgres"])
def test_a_table_whose_view_cannot_bind_never_keeps_the_others_from_reading(make_store, store_kind: str) -> None:
    import duckdb

    store = make_store()
    store.append("good", pa.table({"x": [1, 2]}))
    store.create_table("broken", ["id"]).append(pa.table({"id": [1], "v": ["a"]}))
    [part] = store.table("broken").snapshot().parts
    store.objects.delete([part.path])  # its view can no longer bind
    con = read_path.connect(store)
    assert con.sql("SELECT sum(x) FROM good").fetchall() == [(3,)]
    with pytest.raises(duckdb.Error) as caught:
        con.sql("SELECT count(*) FROM broken").fetchall()
    error = read_path.deferred_error(caught.value)
    assert error is not None and error.table == "broken" and part.path.split("/")[-1] in error.reason


def test_contextful_sql_names_the_unreadable_table_and_still_reads_the_rest(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    (tmp_path / "contextful.toml").write_text('[project]\nname = "r"\n')
    with Store.open(tmp_path / ".contextful" / "store") as store:
        store.append("good", pa.table({"x": [1, 2]}))
        store.append("broken", pa.table({"y": [1]}))
        store.objects.delete([p.path for p in store.table("broken").snapshot().parts])
    assert json.loads(contextful(tmp_path, "--json", "sql", "SELECT count(x) AS n FROM good").stdout) == [{"n": 2}]
    failed = contextful(tmp_path, "sql", "SELECT * FROM broken", check=False)
    assert failed.returncode == 1 and "error: TableUnreadable: table 'broken' cannot be read" in failed.stderr


@pytest.mark.parametrize("store_kind", ["local", "postgres"])
def test_tables_differing_only_in_case_never_answer_for_each_other(make_store, store_kind: str) -> None:
    import duckdb

    store = make_store(clock=ManualClock())
    store.append("events", pa.table({"x": [1]}))
    store.append("other", pa.table({"y": [1]}))
    store.catalog.create_table("Events", "3f1f9c2e-0000-4000-8000-000000000001", (), store.clock.now_us())
    store.table("Events").append(pa.table({"x": [2]}))  # as a store written before the refusal could hold
    con = read_path.connect(store)
    assert con.sql("SELECT count(*) FROM other").fetchall() == [(1,)]
    for spelling in ("events", "Events"):
        with pytest.raises(duckdb.Error) as caught:
            con.sql(f'SELECT * FROM "{spelling}"').fetchall()
        error = read_path.deferred_error(caught.value)
        assert error is not None and "differs only in case" in error.reason
