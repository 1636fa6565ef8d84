"""Any column name a user can land also reads: the read path, folds, models and exports add no name
to the user's namespace (issue 11, "an answer once given never changes").

Each name below is one the read path once added to a scan (DuckDB's ``filename`` and
``file_row_number``), one DuckDB offers as a virtual column of a Parquet scan (``file_index``), one a
reader query names internally (its relation and column aliases, storage.snapshot.INTERNAL_NAMES), or
a hive partition a directory above the store looks like. A keyed and an unkeyed table holding a
user column of that name answer the user's values through every reader.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

import engine.read
from engine.config import load_manifest
from engine.export.run import run_exports
from engine.model.build import build_models
from storage import Store
from storage.snapshot import INTERNAL_NAMES

NAMES = sorted({"filename", "file_row_number", "file_index", "File_Row_Number", "part_uri", "ord_seq",
                "ord_idx", "src", "part_order", *INTERNAL_NAMES})

PROJECT = """
[project]
name = "names"

[[model]]
name = "keyed_copy"
sql = "SELECT * FROM keyed"

[[model]]
name = "plain_copy"
sql = "SELECT * FROM plain"
{contract}
[[export]]
name = "keyed_out"
source = "keyed"
namespace = "bi"
credential = "analysts"

[[export]]
name = "plain_out"
source = "plain"
namespace = "bi"
credential = "analysts"

[[export]]
name = "model_out"
source = "keyed_copy"
namespace = "bi"
credential = "analysts"
"""

KEYED_ANSWER = [(1, "a", 10), (2, "c", 30), (3, "d", 40)]
PLAIN_ANSWER = [(1, "a", 10), (2, "b", 20), (2, "c", 30), (3, "d", 40)]


def land(store: Store, name: str, widen: bool) -> None:
    """A keyed and an unkeyed table with a user column ``name``; with ``widen`` the column arrives
    in the second run only (the snapshot then reads parts written under two schemas)."""
    first = {"id": [1, 2], name: ["a", "b"], "v": [10, 20]}
    second = {"id": [2, 3], name: ["c", "d"], "v": [30, 40]}
    for table, key in (("keyed", ("id",)), ("plain", ())):
        t = store.create_table(table, key)
        if widen:
            t.append(pa.table({"id": [1, 2], "v": [10, 20]}))
            t.append(pa.table({"id": [1], name: ["a"], "v": [10]}))  # key 1 again, now with the column
            t.append(pa.table({"id": [2], name: ["b"], "v": [20]}))
        else:
            t.append(pa.table(first))
        t.append(pa.table(second))


def ordered(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=lambda r: (r[0], str(r[1]), r[2]))


def answer(rows: list[dict], name: str) -> list[tuple]:
    return ordered([(r["id"], r[name], r["v"]) for r in rows])


def iceberg_rows(project: Path, identifier: str) -> list[dict]:
    cat = SqlCatalog("contextful", uri=f"sqlite:///{project / '.contextful/iceberg/catalog.sqlite'}",
                     warehouse=(project / ".contextful/iceberg/warehouse").as_uri())
    return cat.load_table(identifier).scan().to_arrow().to_pylist()


def check_every_reader(project: Path, name: str, plain_answer: list[tuple]) -> None:
    m = load_manifest(project)
    with Store.open(m.project.store) as store:
        for table, want in (("keyed", KEYED_ANSWER), ("plain", plain_answer)):
            assert sorted(store.table(table).to_arrow().column_names) == sorted(["id", name, "v"])
            assert answer(store.table(table).to_arrow().to_pylist(), name) == want, table
            assert store.table(table).count() == len(want)
            con = engine.read.connect(store)
            got = con.sql(f'SELECT id, "{name}", v FROM {table}').fetchall()
            assert ordered(got) == want, table
        build_models(store, m)
        con = engine.read.connect(store)
        assert ordered(con.sql(f'SELECT id, "{name}", v FROM keyed_copy').fetchall()) == KEYED_ANSWER
        assert ordered(con.sql(f'SELECT id, "{name}", v FROM plain_copy').fetchall()) == plain_answer
        run_exports(store, m)
    assert answer(iceberg_rows(project, "bi.keyed_out"), name) == KEYED_ANSWER
    assert answer(iceberg_rows(project, "bi.plain_out"), name) == plain_answer
    assert answer(iceberg_rows(project, "bi.model_out"), name) == KEYED_ANSWER
    with Store.open(m.project.store) as store:  # a fold changes no answer
        for table, want in (("keyed", KEYED_ANSWER), ("plain", plain_answer)):
            before = store.table(table).snapshot().commit_seq
            assert store.fold(table, small_bytes=1 << 30) is not None
            assert answer(store.table(table).to_arrow().to_pylist(), name) == want, table
            assert answer(store.table(table).to_arrow(commit_seq=before).to_pylist(), name) == want, table
            con = engine.read.connect(store)
            assert ordered(con.sql(f'SELECT id, "{name}", v FROM {table}').fetchall()) == want, table


@pytest.mark.parametrize("widen", [False, True], ids=["one-schema", "widened"])
@pytest.mark.parametrize("name", NAMES)
def test_a_user_column_named_like_an_internal_one_reads_through_every_reader(
        tmp_path: Path, name: str, widen: bool) -> None:
    (tmp_path / "contextful.toml").write_text(PROJECT.format(contract=""))
    with Store.open(load_manifest(tmp_path).project.store) as store:
        land(store, name, widen)
    plain = PLAIN_ANSWER if not widen else [(1, None, 10), (2, None, 20), (1, "a", 10), (2, "b", 20),
                                            (2, "c", 30), (3, "d", 40)]
    check_every_reader(tmp_path, name, ordered(plain))


def test_a_store_under_a_directory_named_like_a_hive_partition_reads_its_own_columns(tmp_path: Path) -> None:
    # DuckDB reads `part=1` in a path as a hive partition column `part` unless told not to; a table
    # with its own column `part` then answered "1" for every row, and a model's grain check failed.
    project = tmp_path / "part=1"
    project.mkdir()
    contract = ('contract = { version = "1.0", grain = ["part"], columns = { id = { type = "int64" },'
                ' part = { type = "string" }, v = { type = "int64" } } }\n')
    (project / "contextful.toml").write_text(PROJECT.format(contract=contract))
    with Store.open(load_manifest(project).project.store) as store:
        assert "part=1" in store.objects.uri("x")
        for table, key in (("keyed", ("id",)), ("plain", ())):
            t = store.create_table(table, key)
            t.append(pa.table({"id": [1, 2], "part": ["p1", "p2"], "v": [10, 20]}))
            t.append(pa.table({"id": [2, 3], "part": ["p3", "p4"], "v": [30, 40]}))
    keyed = [(1, "p1", 10), (2, "p3", 30), (3, "p4", 40)]
    plain = [(1, "p1", 10), (2, "p2", 20), (2, "p3", 30), (3, "p4", 40)]
    m = load_manifest(project)
    with Store.open(m.project.store) as store:
        for table, want in (("keyed", keyed), ("plain", plain)):
            assert answer(store.table(table).to_arrow().to_pylist(), "part") == want
            con = engine.read.connect(store)
            assert sorted(con.sql(f"SELECT id, part, v FROM {table}").fetchall()) == want
        build_models(store, m)  # the grain check reads the staged parts: four distinct `part` values
        con = engine.read.connect(store)
        assert sorted(con.sql("SELECT id, part, v FROM plain_copy").fetchall()) == plain
