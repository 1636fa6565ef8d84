"""Any column name a user can land also reads: the read path, folds, models and exports add no name
to the user's namespace (issue 11, "an answer once given never changes").

Each name below is one the read path once added to a scan (DuckDB's ``filename`` and
``file_row_number``), one DuckDB offers as a virtual column of a Parquet scan (``file_index``), one a
reader query names internally (its relation and column aliases, contextful.storage.snapshot.INTERNAL_NAMES), or
a hive partition a directory above the store looks like. A keyed and an unkeyed table holding user
columns of those names answer the user's values through every reader: Table.to_arrow and count,
contextful.engine.read views, a fold, a model built over them, and Iceberg exports of the tables and the model.
"""

from __future__ import annotations

from pathlib import Path

import contextful.engine.read
import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.export.run import run_exports
from contextful.engine.model.build import build_models
from contextful.storage import Store
from contextful.storage.snapshot import INTERNAL_NAMES, quote
from pyiceberg.catalog.sql import SqlCatalog

NAMES = sorted({"filename", "file_row_number", "file_index", "part_uri", "ord_seq", "ord_idx", "src",
                "part_order", "{brace}", 'quo"te', "it's", *INTERNAL_NAMES})
COLUMN_SETS = {"every-name": tuple(NAMES), "case": ("File_Row_Number",)}
"""Every name as a column of one table (DuckDB compares names case-insensitively, so a name
differing only in case from another goes in a table of its own)."""

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



def land(store: Store, names: tuple[str, ...], widen: bool) -> tuple[list[tuple], list[tuple]]:
    """A keyed and an unkeyed table with a user column of each of ``names``; with ``widen`` the
    columns arrive in the second run only (the snapshot then reads parts of two schemas). Returns
    what each answers, as :func:`answer` spells it."""

    def rows(ids: list[int], tags: list[str]) -> pa.Table:
        return pa.table({"id": ids, **{n: [f"{n}:{t}" for t in tags] for n in names}, "v": tags})

    for table, key in (("keyed", ("id",)), ("plain", ())):
        t = store.create_table(table, key)
        if widen:
            t.append(pa.table({"id": [1, 2], "v": ["a", "b"]}))
            t.append(rows([1], ["a"]))  # key 1 again, now with the columns
            t.append(rows([2], ["b"]))
        else:
            t.append(rows([1, 2], ["a", "b"]))
        t.append(rows([2], ["c"]))
        t.append(rows([3], ["d"]))

    def spelled(i: int, tag: str, present: bool = True) -> tuple:
        return (i, tag, *(f"{n}:{tag}" if present else None for n in names))

    keyed = [spelled(1, "a"), spelled(2, "c"), spelled(3, "d")]
    plain = [spelled(1, "a"), spelled(2, "b"), spelled(2, "c"), spelled(3, "d")]
    if widen:
        plain += [spelled(1, "a", present=False), spelled(2, "b", present=False)]
    return ordered(keyed), ordered(plain)


def ordered(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=lambda r: tuple(str(v) for v in r))


def answer(rows: list[dict], names: tuple[str, ...]) -> list[tuple]:
    return ordered([(r["id"], r["v"], *(r[n] for n in names)) for r in rows])


def select(names: tuple[str, ...], table: str) -> str:
    return "SELECT id, v, " + ", ".join(quote(n) for n in names) + f" FROM {table}"


def iceberg_rows(project: Path, identifier: str) -> list[dict]:
    cat = SqlCatalog("contextful", uri=f"sqlite:///{project / '.contextful/iceberg/catalog.sqlite'}",
                     warehouse=(project / ".contextful/iceberg/warehouse").as_uri())
    return cat.load_table(identifier).scan().to_arrow().to_pylist()


def check_every_reader(project: Path, names: tuple[str, ...], keyed: list[tuple], plain: list[tuple]) -> None:
    m = load_manifest(project)
    with Store.open(m.project.store) as store:
        for table, want in (("keyed", keyed), ("plain", plain)):
            assert sorted(store.table(table).to_arrow().column_names) == sorted(["id", "v", *names])
            assert answer(store.table(table).to_arrow().to_pylist(), names) == want, table
            assert store.table(table).count() == len(want)
            con = contextful.engine.read.connect(store)
            assert ordered(con.sql(select(names, table)).fetchall()) == want, table
        build_models(store, m)
        con = contextful.engine.read.connect(store)
        assert ordered(con.sql(select(names, "keyed_copy")).fetchall()) == keyed
        assert ordered(con.sql(select(names, "plain_copy")).fetchall()) == plain
        run_exports(store, m)
    assert answer(iceberg_rows(project, "bi.keyed_out"), names) == keyed
    assert answer(iceberg_rows(project, "bi.plain_out"), names) == plain
    assert answer(iceberg_rows(project, "bi.model_out"), names) == keyed
    with Store.open(m.project.store) as store:  # a fold changes no answer
        for table, want in (("keyed", keyed), ("plain", plain)):
            before = store.table(table).snapshot().commit_seq
            assert store.fold(table, small_bytes=1 << 30) is not None
            assert answer(store.table(table).to_arrow().to_pylist(), names) == want, table
            assert answer(store.table(table).to_arrow(commit_seq=before).to_pylist(), names) == want, table
            con = contextful.engine.read.connect(store)
            assert ordered(con.sql(select(names, table)).fetchall()) == want, table


@pytest.mark.parametrize("widen", [False, True], ids=["one-schema", "widened"])
@pytest.mark.parametrize("columns", list(COLUMN_SETS))
def test_user_columns_named_like_internal_ones_read_through_every_reader(
        tmp_path: Path, columns: str, widen: bool) -> None:
    (tmp_path / "contextful.toml").write_text(PROJECT.format(contract=""))
    names = COLUMN_SETS[columns]
    with Store.open(load_manifest(tmp_path).project.store) as store:
        keyed, plain = land(store, names, widen)
    check_every_reader(tmp_path, names, keyed, plain)


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
    keyed = [(1, 10, "p1"), (2, 30, "p3"), (3, 40, "p4")]
    plain = [(1, 10, "p1"), (2, 20, "p2"), (2, 30, "p3"), (3, 40, "p4")]
    m = load_manifest(project)
    with Store.open(m.project.store) as store:
        for table, want in (("keyed", keyed), ("plain", plain)):
            assert answer(store.table(table).to_arrow().to_pylist(), ("part",)) == want
            con = contextful.engine.read.connect(store)
            assert sorted(con.sql(f"SELECT id, v, part FROM {table}").fetchall()) == want
        build_models(store, m)  # the grain check reads the staged parts: four distinct `part` values
        con = contextful.engine.read.connect(store)
        assert sorted(con.sql("SELECT id, v, part FROM plain_copy").fetchall()) == plain
