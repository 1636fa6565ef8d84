"""The relational projection by hand: naming, key columns, null markers, evolution, DuckDB joins."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pytest
from contextful.datasets.gharchive import expected_counts, write_shards
from contextful.engine.normalize import (
    ChildSpec,
    RelationalTables,
    check_child,
    child_table_name,
    child_tables_of,
    reassemble,
    shred,
    write_relational,
)
from contextful.engine.normalize.relational import column_name, split_column
from contextful.storage.errors import (
    PipelineListIndexMissing,
    PrimaryKeyColumnMissing,
    PrimaryKeyNull,
    SchemaIrreconcilable,
)

KEYS = ["_cf_id", "_cf_parent_id", "_cf_root_id", "_cf_list_idx"]
AUTHOR = pa.struct([("email", pa.string()), ("name", pa.string())])
COMMIT = pa.struct([("sha", pa.string()), ("author", AUTHOR), ("message", pa.string())])
EVENT = pa.schema([
    ("id", pa.int64()),
    ("type", pa.string()),
    ("actor", pa.struct([("id", pa.int64()), ("login", pa.string())])),
    ("payload", pa.struct([("action", pa.string()), ("commits", pa.list_(COMMIT))])),
    ("labels", pa.list_(pa.string())),
])
EVENTS = [
    {"id": 1, "type": "PushEvent", "actor": {"id": 7, "login": "ana"},
     "payload": {"action": None, "commits": [
         {"sha": "a1", "author": {"email": "z@x", "name": "Zoë"}, "message": "fix"},
         {"sha": "b2", "author": None, "message": None},
         None,
     ]},
     "labels": ["bug", None, "ドキュメント"]},
    {"id": 2, "type": "WatchEvent", "actor": None, "payload": {"action": "started", "commits": []},
     "labels": []},
    {"id": 3, "type": "IssuesEvent", "actor": {"id": None, "login": None}, "payload": None, "labels": None},
    {"id": 4, "type": "PushEvent", "actor": {"id": 9, "login": "li"},
     "payload": {"action": None, "commits": [{"sha": "c3", "author": {"email": None, "name": None},
                                               "message": "wip"}]},
     "labels": ["x"]},
]


def events() -> pa.Table:
    return pa.Table.from_pylist(EVENTS, schema=EVENT)


def test_github_events_shred_into_root_and_one_table_per_list() -> None:
    out = shred(events(), "events", id_prefix="run-1.0")

    assert list(out) == ["events", "events__payload__commits", "events__labels"]
    assert out.children == {
        "events__payload__commits": ChildSpec("events__payload__commits", "events", "payload.commits",
                                              "_cf_len__payload__commits"),
        "events__labels": ChildSpec("events__labels", "events", "labels", "_cf_len__labels"),
    }
    root = out["events"]
    assert root.column_names == ["_cf_id", "id", "type", "_cf_null__actor", "actor__id", "actor__login",
                                 "_cf_null__payload", "payload__action", "_cf_len__payload__commits",
                                 "_cf_len__labels"]
    assert root.column("_cf_id").to_pylist() == ["run-1.0.0", "run-1.0.1", "run-1.0.2", "run-1.0.3"]
    # a null struct and a struct of nulls differ only in the marker
    assert root.column("_cf_null__actor").to_pylist() == [False, True, False, False]
    assert root.column("actor__id").to_pylist() == [7, None, None, 9]
    # null list vs empty list: null vs 0
    assert root.column("_cf_len__payload__commits").to_pylist() == [3, 0, None, 1]
    assert root.column("_cf_len__labels").to_pylist() == [3, 0, None, 1]
    assert root.schema.field("_cf_len__labels").type == pa.int32()

    commits = out["events__payload__commits"]
    assert commits.column_names == KEYS + ["_cf_null", "sha", "_cf_null__author", "author__email", "author__name",
                                           "message"]
    assert commits.column("_cf_id").to_pylist() == ["run-1.0.0.0", "run-1.0.0.1", "run-1.0.0.2", "run-1.0.3.0"]
    assert commits.column("_cf_parent_id").to_pylist() == ["run-1.0.0"] * 3 + ["run-1.0.3"]
    assert commits.column("_cf_root_id").to_pylist() == commits.column("_cf_parent_id").to_pylist()
    assert commits.column("_cf_list_idx").to_pylist() == [0, 1, 2, 0]
    assert commits.column("_cf_null").to_pylist() == [False, False, True, False]  # null element
    assert commits.column("_cf_null__author").to_pylist() == [False, True, False, False]
    assert commits.column("author__name").to_pylist() == ["Zoë", None, None, None]

    labels = out["events__labels"]
    assert labels.column_names == KEYS + ["value"]
    assert labels.column("value").to_pylist() == ["bug", None, "ドキュメント", "x"]  # nulls inside lists stay
    assert labels.column("_cf_list_idx").to_pylist() == [0, 1, 2, 0]

    back = reassemble(out, "events")
    assert back.equals(events())
    assert back.to_pylist() == EVENTS


def test_lists_of_lists_land_in_grandchild_tables_keyed_to_child_and_root() -> None:
    t = pa.table({"k": ["a", "b", "c"],
                  "m": pa.array([[[1, 2], None, []], None, [[None], [3]]], pa.list_(pa.list_(pa.int64())))})
    out = shred(t, "t", id_prefix="p")

    assert [(c.name, c.parent, c.list_path, c.length_column) for c in out.children.values()] == [
        ("t__m", "t", "m", "_cf_len__m"), ("t__m__value", "t__m", "value", "_cf_len__value")]
    assert out["t"].column("_cf_len__m").to_pylist() == [3, None, 2]
    mid = out["t__m"]
    assert mid.column_names == KEYS + ["_cf_len__value"]
    assert mid.column("_cf_len__value").to_pylist() == [2, None, 0, 1, 1]
    assert mid.column("_cf_list_idx").to_pylist() == [0, 1, 2, 0, 1]
    leaf = out["t__m__value"]
    assert leaf.column("value").to_pylist() == [1, 2, None, 3]
    assert leaf.column("_cf_list_idx").to_pylist() == [0, 1, 0, 0]
    assert mid.column("_cf_id").to_pylist() == ["p.0.0", "p.0.1", "p.0.2", "p.2.0", "p.2.1"]  # parent id . list idx
    assert leaf.column("_cf_id").to_pylist() == ["p.0.0.0", "p.0.0.1", "p.2.0.0", "p.2.1.0"]
    assert leaf.column("_cf_parent_id").to_pylist() == ["p.0.0", "p.0.0", "p.2.0", "p.2.1"]  # ids of t__m rows
    assert leaf.column("_cf_root_id").to_pylist() == ["p.0", "p.0", "p.2", "p.2"]  # ids of t rows
    assert reassemble(out, "t").equals(t)


def test_lists_inside_structs_inside_lists() -> None:
    file = pa.struct([("path", pa.string()), ("hunks", pa.list_(pa.int64()))])
    schema = pa.schema([("commits", pa.list_(pa.struct([("sha", pa.string()),
                                                        ("stats", pa.struct([("files", pa.list_(file))]))])))])
    t = pa.Table.from_pylist([
        {"commits": [{"sha": "a", "stats": {"files": [{"path": "x", "hunks": [1, 2]}, {"path": "y", "hunks": None}]}},
                     {"sha": "b", "stats": None}]},
        {"commits": [{"sha": "c", "stats": {"files": []}}]},
    ], schema=schema)
    out = shred(t, "ev", id_prefix="r")

    assert [(c.name, c.parent, c.list_path) for c in child_tables_of(schema, "ev")] == [
        ("ev__commits", "ev", "commits"),
        ("ev__commits__stats__files", "ev__commits", "stats.files"),
        ("ev__commits__stats__files__hunks", "ev__commits__stats__files", "hunks"),
    ]
    assert list(out) == ["ev", "ev__commits", "ev__commits__stats__files", "ev__commits__stats__files__hunks"]
    assert out["ev__commits"].column("_cf_len__stats__files").to_pylist() == [2, None, 0]
    assert out["ev__commits__stats__files__hunks"].column("_cf_root_id").to_pylist() == ["r.0", "r.0"]
    assert reassemble(out, "ev").equals(t)


def test_every_child_table_is_returned_even_when_empty() -> None:
    t = pa.Table.from_pylist([{"id": 1, "tags": None}], schema=pa.schema([("id", pa.int64()),
                                                                         ("tags", pa.list_(pa.string()))]))
    out = shred(t, "t", id_prefix="r")
    assert out["t__tags"].num_rows == 0
    assert out["t__tags"].column_names == KEYS + ["value"]
    assert reassemble(out, "t").equals(t)


def test_column_names_split_back_into_exactly_one_path() -> None:
    assert column_name(("payload", "action")) == "payload__action"
    assert column_name(("_id", "x")) == "_id__x"
    tricky = [("a__b",), ("a", "_b"), ("a_", "b"), ("",), ("%", "value"), ("_cf_id",), ("ü name", "_")]
    names = [column_name(p) for p in tricky]
    assert len(set(names)) == len(names)
    assert [split_column(n) for n in names] == tricky
    assert not any(n.startswith("_cf_") for n in names)


def test_child_table_names_are_valid_and_deterministic_when_the_path_is_not() -> None:
    assert child_table_name("events", ("payload", "commits")) == "events__payload__commits"
    long = ("x" * 80, "y" * 80)
    unsafe = ("ünïcode list",)
    for path in (long, unsafe, ("a__b",)):
        name = child_table_name("events", path)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,127}", name)
        assert name == child_table_name("events", path)
    assert len(child_table_name("events", long)) == 128
    assert child_table_name("events", ("a b",)) != child_table_name("events", ("a-b",))
    t = pa.table({"x" * 80: [{"y" * 80: [1]}]})
    out = shred(t, "events", id_prefix="r")
    assert list(out)[1] == child_table_name("events", long)
    assert reassemble(out, "events").equals(t)


def test_ids_carry_the_prefix_and_batches_reassemble_together() -> None:
    first, second = events(), events().slice(1, 2)
    a, b = shred(first, "events", id_prefix="run-1.0"), shred(second, "events", id_prefix="run-1.1")
    assert b["events"].column("_cf_id").to_pylist() == ["run-1.1.0", "run-1.1.1"]
    union = {name: pa.concat_tables([a[name], b[name]]) for name in a}
    for table in union.values():
        assert pc.count_distinct(table.column("_cf_id")).as_py() == table.num_rows
    assert reassemble(union, "events").equals(pa.concat_tables([first, second]))


def test_a_keyed_root_gives_every_row_the_same_ids_in_any_batch_or_run() -> None:
    first = shred(events(), "events", id_prefix="run-1.0", primary_key=("id",))
    again = shred(events().slice(2).cast(events().schema), "events", id_prefix="run-9.4", primary_key=("id",))
    for name in first:
        ids = first[name].column("_cf_id").to_pylist()
        assert pc.count_distinct(first[name].column("_cf_id")).as_py() == len(ids)
        assert set(again[name].column("_cf_id").to_pylist()) <= set(ids)
        assert not any(i.startswith("run-") for i in ids)
    root = first["events"].column("_cf_id").to_pylist()
    commits = first["events__payload__commits"]
    assert commits.column("_cf_id").to_pylist() == [f"{root[0]}.0", f"{root[0]}.1", f"{root[0]}.2", f"{root[3]}.0"]
    # a key widened from int32 to int64 keeps its ids; a struct field keys by its column name
    narrow = pa.table({"id": pa.array([1, 2], pa.int32()), "actor": [{"login": "a"}, {"login": "b"}]})
    wide = pa.table({"id": pa.array([1, 2], pa.int64()), "actor": [{"login": "a"}, {"login": "b"}]})
    assert shred(narrow, "t", id_prefix="a", primary_key=("id",))["t"].column("_cf_id").equals(
        shred(wide, "t", id_prefix="b", primary_key=("id",))["t"].column("_cf_id"))
    by_login = shred(wide, "t", id_prefix="a", primary_key=("actor__login",))["t"].column("_cf_id")
    assert pc.count_distinct(by_login).as_py() == 2


def test_a_keyed_root_refuses_a_null_or_missing_key_naming_the_input_and_row() -> None:
    t = pa.table({"id": [1, None], "tags": [["a"], ["b"]]})
    with pytest.raises(PrimaryKeyNull) as caught:
        shred(t, "t", id_prefix="r", primary_key=("id",), input="input raw/a.ndjson", first_row=10)
    assert (caught.value.input, caught.value.row) == ("input raw/a.ndjson", 12)  # 10 rows before, then the second: row 12 (1-based)
    with pytest.raises(PrimaryKeyColumnMissing):
        shred(t, "t", id_prefix="r", primary_key=("tags",))


def test_child_rows_in_any_order_and_orphans_after_filtering_roots() -> None:
    out = shred(events(), "events", id_prefix="r")
    shuffled = dict(out)
    commits = out["events__payload__commits"]
    shuffled["events__payload__commits"] = commits.take(pa.array([3, 1, 0, 2]))
    assert reassemble(shuffled, "events").equals(events())

    shuffled["events"] = out["events"].take(pa.array([3, 1]))  # children of rows 0 and 2 are orphans now
    assert reassemble(shuffled, "events").equals(events().take(pa.array([3, 1])))


def test_reassembly_refuses_children_that_do_not_fill_their_lists() -> None:
    out = dict(shred(events(), "events", id_prefix="r"))
    commits = out["events__payload__commits"]
    index = commits.schema.get_field_index("_cf_list_idx")
    out["events__payload__commits"] = commits.set_column(index, "_cf_list_idx", pa.array([0, 1, 1, 0], pa.int32()))
    with pytest.raises(ValueError, match="do not fill"):
        reassemble(out, "events")
    out["events__payload__commits"] = commits.filter(pa.array([True, False, True, True]))
    with pytest.raises(ValueError, match="do not fill"):
        reassemble(out, "events")


@pytest.mark.clause("run.normalize.list-index-missing")
def test_a_child_table_without_its_list_index_is_refused_before_anything_stages() -> None:
    out = shred(events(), "events", id_prefix="r")
    bare = out["events__payload__commits"].drop_columns(["_cf_list_idx"])
    tables = RelationalTables("events", {**out, "events__payload__commits": bare}, out.children)
    staged: list[str] = []

    with pytest.raises(PipelineListIndexMissing) as caught:
        write_relational(tables, lambda name, table: staged.append(name))

    err = caught.value
    assert (err.parent, err.list_path, err.table) == ("events", "payload.commits", "events__payload__commits")
    assert "'events'" in str(err) and "payload.commits" in str(err)
    assert staged == []

    with pytest.raises(PipelineListIndexMissing):  # reassembly refuses it too
        reassemble(tables, "events")

    write_relational(out, lambda name, table: staged.append(name))
    assert staged == list(out)


@pytest.mark.clause("run.normalize.list-index-missing")
@pytest.mark.parametrize("key", KEYS)
def test_check_child_refuses_a_missing_key_or_null_list_index(key: str) -> None:
    labels = shred(events(), "events", id_prefix="r")["events__labels"]
    check_child("events", "labels", "events__labels", labels)
    with pytest.raises(PipelineListIndexMissing) as caught:
        check_child("events", "labels", "events__labels", labels.drop_columns([key]))
    assert (caught.value.parent, caught.value.list_path) == ("events", "labels")
    nulled = labels.set_column(3, "_cf_list_idx", pa.array([0, None, 2, 0], pa.int32()))
    with pytest.raises(PipelineListIndexMissing):
        check_child("events", "labels", "events__labels", nulled)


def test_a_later_batch_with_a_new_field_and_a_new_list() -> None:
    first = events()
    commit2 = pa.struct([("sha", pa.string()), ("author", AUTHOR), ("message", pa.string()), ("distinct", pa.bool_())])
    schema2 = pa.schema([
        ("id", pa.int64()), ("type", pa.string()), ("actor", pa.struct([("id", pa.int64()), ("login", pa.string())])),
        ("payload", pa.struct([("action", pa.string()), ("commits", pa.list_(commit2)),
                               ("pages", pa.list_(pa.struct([("title", pa.string())])))])),
        ("labels", pa.list_(pa.string())),
    ])
    rows2 = [{"id": 5, "type": "PushEvent", "actor": None,
              "payload": {"action": None, "commits": [{"sha": "d4", "author": None, "message": "m", "distinct": True}],
                          "pages": [{"title": "Home"}, {"title": None}]},
              "labels": None}]
    second = pa.Table.from_pylist(rows2, schema=schema2)
    a, b = shred(first, "events", id_prefix="r.0"), shred(second, "events", id_prefix="r.1")

    assert set(b) - set(a) == {"events__payload__pages"}
    assert b.children["events__payload__pages"].parent == "events"
    assert set(b["events__payload__commits"].column_names) - set(a["events__payload__commits"].column_names) == {
        "distinct"}
    assert set(b["events"].column_names) - set(a["events"].column_names) == {"_cf_len__payload__pages"}

    # the store's view after both runs: tables unified by name, missing columns null
    union = {name: pa.concat_tables([t for t in (a.get(name), b.get(name)) if t is not None],
                                    promote_options="default") for name in b}
    back = reassemble(union, "events")
    assert back.to_pylist() == [
        {**e, "payload": None if e["payload"] is None else {
            "action": e["payload"]["action"], "pages": None,
            "commits": [None if c is None else {**c, "distinct": None} for c in e["payload"]["commits"]]}}
        for e in EVENTS] + rows2


def test_duplicate_field_names_are_refused() -> None:
    twice = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    dup = pa.Table.from_arrays([twice], names=["s"])
    with pytest.raises(SchemaIrreconcilable, match="duplicate field name 'a'"):
        shred(dup, "t", id_prefix="r")


def test_list_kinds_come_back_as_lists() -> None:
    t = pa.table({
        "big": pa.array([[1, 2], None], pa.large_list(pa.int64())),
        "pair": pa.array([[1, 2], None], pa.list_(pa.int64(), 2)),
        "view": pa.array([None, [3]], pa.list_view(pa.int64())),
        "tags": pa.array([[("a", 1)], []], pa.map_(pa.string(), pa.int64())),
    })
    out = shred(t, "t", id_prefix="r")
    assert out["t__tags"].column_names == KEYS + ["_cf_null", "key", "value"]
    back = reassemble(out, "t")
    assert back.schema.field("big").type == pa.list_(pa.int64())
    assert back.schema.field("pair").type == pa.list_(pa.int64())
    assert back.schema.field("view").type == pa.list_(pa.int64())
    assert back.column("tags").to_pylist() == [[{"key": "a", "value": 1}], []]
    assert back.column("big").to_pylist() == t.column("big").to_pylist()
    assert back.column("pair").to_pylist() == t.column("pair").to_pylist()
    assert back.column("view").to_pylist() == t.column("view").to_pylist()


def test_duckdb_joins_children_to_parents_on_the_keys(tmp_path) -> None:
    n = 2000
    [path] = write_shards(n, tmp_path, shards=1)
    nested = pj.read_json(path)
    out = shred(nested, "events", id_prefix="run-7.0")
    con = duckdb.connect()
    for name, table in out.items():
        con.register(name, table)
    expected = expected_counts(n)

    pushes = con.sql("select count(*) from events e join events__payload__commits c on c._cf_parent_id = e._cf_id "
                     "where e.type = 'PushEvent'").fetchall()
    assert pushes == [(expected["push_commits"],)]
    mismatched = con.sql("""
        select count(*) from events e
        left join (select _cf_parent_id, count(*) as n from events__payload__commits group by 1) c
          on c._cf_parent_id = e._cf_id
        where coalesce(c.n, 0) <> coalesce(e._cf_len__payload__commits, 0)""").fetchall()
    assert mismatched == [(0,)]
    labels = con.sql("""
        select count(*) from events__payload__issue__labels l join events e on l._cf_root_id = e._cf_id
        """).fetchall()
    issue_labels = pc.list_value_length(pc.struct_field(nested.column("payload"), ["issue", "labels"]))
    assert labels == [(pc.sum(issue_labels).as_py(),)]
    positions = con.sql("""
        select count(*), count(distinct (c._cf_parent_id, c._cf_list_idx)),
               count(*) filter (where c._cf_list_idx >= e._cf_len__payload__commits)
        from events__payload__commits c join events e on c._cf_parent_id = e._cf_id""").fetchall()
    assert positions == [(expected["push_commits"], expected["push_commits"], 0)]
    assert reassemble(out, "events").equals(nested)


def test_key_ids_of_zoned_timestamps_do_not_depend_on_the_machines_time_zone() -> None:
    script = ("import datetime as d, pyarrow as pa; from engine.normalize import key_ids; "
              "t = pa.table({'t': pa.array([d.datetime(2020, 1, 1, tzinfo=d.timezone.utc)], pa.timestamp('us', 'UTC'))}); "
              "print(key_ids(t, ('t',))[0])")
    ids = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "TZ": zone}).stdout for zone in ("UTC", "America/New_York")}
    assert len(ids) == 1
