"""Which tables a model reads: the names its SQL references, resolved per scope and
case-insensitively as DuckDB resolves them (a CTE hides a table only where it is visible)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import contextful.engine.read
import duckdb
import pyarrow as pa
import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.model.build import build_models
from contextful.storage import Store
from contextful.storage.errors import QueryInvalid


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "store")
    s.append("src", pa.table({"v": ["table"]}))
    s.append("other", pa.table({"w": ["other"]}))
    yield s
    s.close()


def build(store: Store, root: Path, sql: str, extra: str = "") -> dict[str, int]:
    text = f'[project]\nname = "i"\n[[model]]\nname = "m"\nsql = """{sql}"""\n{extra}'
    return build_models(store, parse_manifest(tomllib.loads(text), root))[0].watermark


SCOPES = [  # (statement, the store tables it reads)
    ("SELECT v FROM SRC", {"src"}),
    ('SELECT v FROM "SRC"', {"src"}),  # quoted identifiers are case-insensitive in DuckDB too
    ("SELECT v FROM Src AS s WHERE s.v IN (SELECT w || '' FROM OTHER) OR true", {"src", "other"}),
    # a CTE in an inner scope hides the table only there
    ("SELECT v FROM src UNION ALL SELECT v FROM (WITH src AS (SELECT 'cte' AS v) SELECT v FROM src)", {"src"}),
    ("SELECT (WITH src AS (SELECT 'sub' AS v) SELECT v FROM src) AS v FROM other", {"other"}),
    (("WITH x AS (SELECT 'x' AS v) SELECT v FROM x UNION ALL"
     " SELECT v FROM (WITH src AS (SELECT 'inner' AS v) SELECT v FROM x) UNION ALL SELECT v FROM src"), {"src"}),
    # a CTE sees only the CTEs declared before it, and a non-recursive one not itself
    ("WITH a AS (SELECT v FROM src), src AS (SELECT 'cte' AS v) SELECT v FROM a", {"src"}),
    ("WITH src AS (SELECT v || '!' AS v FROM src) SELECT v FROM src", {"src"}),
    ("WITH RECURSIVE src AS (SELECT v FROM src) SELECT v FROM src", {"src"}),
    (("WITH RECURSIVE src AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM src WHERE n < 3)"
     " SELECT n::VARCHAR AS v FROM src"), set()),
    (("WITH RECURSIVE src AS (SELECT 1 AS n FROM src UNION ALL SELECT n + 1 FROM src WHERE n < 3)"
     " SELECT n::VARCHAR AS v FROM src"), {"src"}),  # the anchor's src is the table
    # a CTE's name matches references case-insensitively, quoted or not
    ("WITH \"SRC\" AS (SELECT 'cte' AS v) SELECT v FROM src", set()),
    ("WITH S AS (SELECT w AS v FROM other) SELECT v FROM s", {"other"}),
    # a schema-qualified name is never a CTE
    ("WITH src AS (SELECT 'cte' AS v) SELECT v FROM main.src", {"src"}),
]


@pytest.mark.parametrize(("sql", "reads"), SCOPES)
def test_inputs_are_the_tables_duckdb_resolves(tmp_path: Path, store: Store, sql: str, reads: set[str]) -> None:
    assert set(build(store, tmp_path, sql)) == reads
    truth = duckdb.connect()  # DuckDB itself over the same tables is what the model must answer
    truth.execute("CREATE TABLE src AS SELECT 'table' AS v")
    truth.execute("CREATE TABLE other AS SELECT 'other' AS w")
    expected = sorted(truth.execute(sql).fetchall())
    assert sorted(contextful.engine.read.connect(store).execute("SELECT * FROM m").fetchall()) == expected


def test_declared_inputs_and_relationships_resolve_case_insensitively(tmp_path: Path, store: Store) -> None:
    assert set(build(store, tmp_path, "SELECT v FROM src", 'inputs = ["SRC"]\n')) == {"src"}
    assert set(build(store, tmp_path, "SELECT w AS v FROM other",
                     'tests = [{ relationships = { column = "v", to = "OTHER", field = "w" } }]\n')) == {"other"}


def test_tables_whose_names_differ_only_in_case_refuse_as_ambiguous(tmp_path: Path, store: Store) -> None:
    # A store written before case twins were refused at creation can hold both spellings.
    store.catalog.create_table("SRC", "3f1f9c2e-0000-4000-8000-000000000002", (), store.clock.now_us())
    store.table("SRC").append(pa.table({"v": ["upper"]}))
    with pytest.raises(QueryInvalid) as info:  # DuckDB would answer one of the two for both names
        build(store, tmp_path, "SELECT v FROM src UNION ALL SELECT v FROM SRC")
    assert "'SRC'" in str(info.value) and "'src'" in str(info.value)
    store.catalog.create_table("Other", "3f1f9c2e-0000-4000-8000-000000000003", (), store.clock.now_us())
    store.table("Other").append(pa.table({"w": ["mixed"]}))
    with pytest.raises(QueryInvalid) as info:  # neither spelling is the reference's: which one is meant?
        build(store, tmp_path, "SELECT w FROM OTHER")
    assert "'Other'" in str(info.value) and "'other'" in str(info.value)


def test_a_model_named_like_a_table_or_model_but_for_case_refuses(tmp_path: Path) -> None:
    from contextful.storage.errors import ManifestInvalid, TableNameCollision

    text = ('[project]\nname = "i"\n[[pipeline]]\nid = "sales"\n[pipeline.source]\nkind = "files"\n'
            'config = { paths = "x.csv" }\n[[model]]\nname = "Sales"\nsql = "SELECT 1 AS v"\n'
            '[[model]]\nname = "m"\nsql = "SELECT 1 AS v"\n[[model]]\nname = "M"\nsql = "SELECT 2 AS v"\n')
    with pytest.raises(ManifestInvalid) as info:  # DuckDB would show one view for both names
        parse_manifest(tomllib.loads(text), tmp_path)
    assert [(type(p), p.table, p.first, p.second) for p in info.value.problems] == [
        (TableNameCollision, "Sales", "table 'sales' of pipeline 'sales'", "model 'Sales'"),
        (TableNameCollision, "M", "table 'm' of model 'm'", "model 'M'")]


def test_a_name_in_another_schema_is_not_a_store_table(tmp_path: Path, store: Store) -> None:
    store.append("schemata", pa.table({"x": [1]}))  # a store table named like a system view
    sql = ("SELECT v FROM memory.main.src WHERE EXISTS (SELECT 1 FROM information_schema.schemata)"
           " UNION ALL SELECT w FROM memory.other")
    assert set(build(store, tmp_path, sql)) == {"src", "other"}
