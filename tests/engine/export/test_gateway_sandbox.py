"""The query gateway's SQL sandbox, decided on DuckDB's parse tree of the whole statement.

A hostile corpus (``sandbox_corpus.hostile``: attack classes x targets, several hundred SELECTs
DuckDB's parser accepts, plus statements that are no SELECT) must be refused with 403
``ExportQueryRefused`` before any engine opens; a corpus of analytic SELECTs must be admitted and
answer what DuckDB answers over the same rows. Real pieces: exports committed by ``run_exports``
to a SQLite catalog, the served face on loopback, the real engine factory wrapped to count opens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from contextful.engine.export.gateway import Gateway
from contextful.engine.export.sql_shape import read_shape
from contextful.storage.errors import ExportQueryRefused

from tests.engine.export.sandbox_corpus import LEGIT, STATEMENTS, hostile
from tests.engine.export.test_gateway import (
    ORDERS_BI,
    REGIONS,
    CountingReaders,
    call,
    keys,
    make_project,
    project_toml,
)

LEGIT_PARAMS = {"low": 15, "high": 35}


def single_audience(tmp_path: Path) -> Any:
    """The analysts' orders entry may take caller SQL: finance has a warehouse of its own."""
    return make_project(tmp_path, project_toml(finance_catalog=f"sqlite:///{tmp_path / 'fin.sqlite'}"))


def counted(served: Any) -> CountingReaders:
    counting = CountingReaders(served.gateway)
    served.gateway.reader_factory = counting
    return counting


@pytest.mark.clause("run.export-iceberg.query-refused")
def test_a_cte_in_a_subquery_does_not_excuse_a_path_read_outside_it(tmp_path: Path, serve: Any) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    manifest = single_audience(tmp_path)
    served = serve(manifest)
    counting = counted(served)
    token = keys(tmp_path)["analysts"]
    # The CTE "<path>" exists only inside the subquery t; the path after the comma is a replacement
    # scan of the file, at the outer level where no CTE of that name is in scope.
    sql = f"SELECT * FROM (WITH \"{secret}\" AS (SELECT 1) SELECT 1) t, '{secret}'"
    status, doc, _ = call(served.url, "POST", "/query", {"table": "orders", "sql": sql}, token)
    assert (status, doc["error"]) == (403, "ExportQueryRefused"), doc
    assert repr(str(secret)) in doc["detail"]
    assert counting.opened == 0


@pytest.mark.clause("run.export-iceberg.query-refused")
def test_every_hostile_statement_is_refused_before_any_engine_opens(tmp_path: Path, serve: Any) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    corpus = hostile(secret)
    assert len(corpus) + len(STATEMENTS) >= 600
    # Each hostile SELECT is one statement DuckDB's parser accepts: its refusal is the checker's.
    con = duckdb.connect()
    for sql, attack in corpus.items():
        tree = json.loads(con.execute("SELECT json_serialize_sql($1::VARCHAR)", [sql]).fetchone()[0])
        assert tree["error"] is False and len(tree["statements"]) == 1, (attack, sql)
    con.close()
    manifest = single_audience(tmp_path)
    gateway = Gateway(manifest)
    counting = CountingReaders(gateway)
    gateway.reader_factory = counting
    every = {**corpus, **{sql: "statement" for sql in STATEMENTS}}
    for sql, attack in every.items():
        with pytest.raises(ExportQueryRefused) as info:
            gateway.query("analysts", {"table": "orders", "sql": sql})
        assert info.value.reason.startswith("caller SQL"), (attack, sql, info.value.reason)
    assert counting.opened == 0

    served = serve(manifest)
    counting = counted(served)
    token = keys(tmp_path)["analysts"]
    for sql, attack in every.items():
        status, doc, _ = call(served.url, "POST", "/query", {"table": "orders", "sql": sql}, token)
        assert (status, doc["error"]) == (403, "ExportQueryRefused"), (attack, sql, doc)
    assert counting.opened == 0


def test_legitimate_analytic_selects_are_admitted_and_answer_as_duckdb_does(tmp_path: Path, serve: Any) -> None:
    manifest = single_audience(tmp_path)
    served = serve(manifest)
    counting = counted(served)
    token = keys(tmp_path)["analysts"]
    reference = duckdb.connect()
    reference.register("orders", ORDERS_BI)
    reference.register("regions", REGIONS)
    for sql in LEGIT:
        params = {k: v for k, v in LEGIT_PARAMS.items() if f"${k}" in sql}
        status, raw, _ = call(served.url, "POST", "/query", {"table": "orders", "sql": sql, "params": params},
                              token, {"Accept": "application/vnd.apache.arrow.stream"})
        assert status == 200, (sql, raw)
        answer = pa.ipc.open_stream(raw).read_all()
        expected = reference.sql(sql, params=params or None).to_arrow_table()
        assert answer.column_names == expected.column_names, sql
        assert sorted(map(repr, answer.to_pylist())) == sorted(map(repr, expected.to_pylist())), sql
    assert counting.opened == len(LEGIT)


def test_a_statement_nested_too_deep_to_check_is_refused(tmp_path: Path) -> None:
    gateway = Gateway(single_audience(tmp_path))
    counting = CountingReaders(gateway)
    gateway.reader_factory = counting
    for depth in (300, 900):
        sql = "SELECT * FROM " + "(SELECT * FROM " * depth + "orders" + ") t" * depth
        with pytest.raises(ExportQueryRefused, match="nests deeper|parser refused"):
            gateway.query("analysts", {"table": "orders", "sql": sql})
    assert counting.opened == 0


def test_the_engine_runs_the_checked_tree_rendered_back_to_sql() -> None:
    shape = read_shape("SELECT count(*) AS n /* a comment */ FROM orders o WHERE o.amount > $least")
    assert shape.tables == ("orders",) and shape.parameters == {"least"}
    assert "comment" not in shape.sql and read_shape(shape.sql).sql == shape.sql


SHADOWED = "WITH duckdb_tables AS (SELECT 42 AS x) "
CTE_PLACES = (
    "SELECT * FROM duckdb_tables UNION ALL SELECT max(x) FROM duckdb_tables",
    "SELECT * FROM range((SELECT max(x) FROM duckdb_tables))",
    "SELECT 1 LIMIT (SELECT max(x) FROM duckdb_tables)",
    "SELECT * FROM (VALUES ((SELECT max(x) FROM duckdb_tables))) v(a)",
    "SELECT * FROM range(1) r, LATERAL (SELECT max(x) FROM duckdb_tables) l",
    "SELECT (SELECT max(x) FROM (SELECT * FROM duckdb_tables))",
    ", b AS (SELECT max(x) AS y FROM duckdb_tables) SELECT * FROM b",
    "SELECT 1 ORDER BY (SELECT max(x) FROM duckdb_tables)",
    "SELECT sum(1) OVER (PARTITION BY (SELECT max(x) FROM duckdb_tables))",
    "SELECT 1 WHERE 42 IN (SELECT x FROM duckdb_tables)",
    "(SELECT * FROM duckdb_tables) UNION (SELECT max(x) FROM duckdb_tables) ORDER BY 1",
    "SELECT * FROM duckdb_tables a, LATERAL (SELECT * FROM duckdb_tables WHERE x = a.x)",
    "SELECT * FROM duckdb_tables WHERE x = (WITH duckdb_tables AS (SELECT 43 AS x) SELECT max(x) FROM duckdb_tables) - 1",
    "SELECT max(x) FILTER (WHERE x IN (SELECT x FROM duckdb_tables)) FROM duckdb_tables",
)


def test_where_the_checker_sees_a_cte_duckdb_binds_the_cte() -> None:
    # duckdb_tables is also a system view with no column x: a statement DuckDB bound to the view
    # instead of the CTE would fail on x. The checker and DuckDB must agree on every scope.
    con = duckdb.connect()
    for place in CTE_PLACES:
        sql = SHADOWED + place
        assert read_shape(sql).tables == (), sql
        assert con.execute(sql).fetchall(), sql
    outside = "WITH a AS (WITH duckdb_tables AS (SELECT 42 AS x) SELECT 1) SELECT * FROM a, duckdb_tables"
    assert read_shape(outside).tables == ("duckdb_tables",)  # a base table: no entry, refused by the gateway
