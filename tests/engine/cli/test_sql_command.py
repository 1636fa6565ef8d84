"""``contextful sql`` as a user runs it: ``--limit``, ``--format table|csv|json|parquet`` with ``-o``,
multi-line cells on one line, and every statement that would write refused by its DuckDB type."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.cli import contextful


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sql")
    (root / "contextful.toml").write_text('[project]\nname = "sql"\n')
    (root / "notes.ndjson").write_text(
        '{"id": 1, "note": "first line\\nsecond line", "meta": {"tags": ["a", "b"]}}\n'
        '{"id": 2, "note": "plain", "meta": {"tags": []}}\n')
    contextful(root, "table", "load", "notes", str(root / "notes.ndjson"))
    return root


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def test_limit_bounds_the_rows_shown_and_the_default_stays_100(project: Path) -> None:
    default = contextful(project, "sql", "SELECT range AS n FROM range(250)").stdout.splitlines()
    assert default[-1] == "(250 rows) (first 100 shown)" and len(default) == 2 + 100 + 1
    three = contextful(project, "sql", "--limit", "3", "SELECT range AS n FROM range(250)").stdout.splitlines()
    assert three[2:] == ["0", "1", "2", "(250 rows) (first 3 shown)"]
    as_json = json.loads(contextful(project, "--json", "sql", "--limit", "2", "SELECT range AS n FROM range(250)").stdout)
    assert as_json == [{"n": 0}, {"n": 1}]
    every = json.loads(contextful(project, "--json", "sql", "SELECT range AS n FROM range(250)").stdout)
    assert len(every) == 250  # no --limit: JSON holds every row, as before
    bad = contextful(project, "sql", "--limit", "-1", "SELECT 1", check=False)
    assert bad.returncode == 2 and "--limit" in bad.stderr


def test_a_multi_line_cell_stays_on_its_row(project: Path) -> None:
    out = contextful(project, "sql", "SELECT id, note FROM notes ORDER BY id").stdout.splitlines()
    assert out[2].split() == ["1", "first", "line\\nsecond", "line"] and out[-1] == "(2 rows)"
    assert len(out) == 5


def test_formats_on_stdout(project: Path) -> None:
    query = "SELECT id, note, meta FROM notes ORDER BY id"
    rows = list(csv.reader(io.StringIO(contextful(project, "sql", "--format", "csv", query).stdout)))
    assert rows == [["id", "note", "meta"], ["1", "first line\nsecond line", '{"tags":["a","b"]}'],
                    ["2", "plain", '{"tags":[]}']]
    as_format = json.loads(contextful(project, "sql", "--format", "json", query).stdout)
    assert as_format == json.loads(contextful(project, "--json", "sql", query).stdout)
    assert as_format[0] == {"id": 1, "note": "first line\nsecond line", "meta": {"tags": ["a", "b"]}}
    assert json.loads(contextful(project, "--json", "sql", "--format", "json", query).stdout) == as_format
    empty = contextful(project, "sql", "--format", "csv", "SELECT id FROM notes WHERE id < 0").stdout
    assert empty.splitlines() == ['"id"']  # the header, even with no row


def test_formats_into_a_file(project: Path, tmp_path: Path) -> None:
    query = "SELECT id, note, meta FROM notes ORDER BY id"
    target = tmp_path / "notes.parquet"
    out = contextful(project, "sql", "--format", "parquet", "-o", str(target), query)
    assert out.stdout.strip() == f"2 rows written to {target} (parquet)"
    table = pq.read_table(target)
    assert table.column_names == ["id", "note", "meta"] and table.column("note").to_pylist()[0] == "first line\nsecond line"
    as_csv = tmp_path / "notes.csv"
    contextful(project, "sql", "--format", "csv", "--limit", "1", "-o", str(as_csv), query)
    assert list(csv.reader(as_csv.open())) == [["id", "note", "meta"], ["1", "first line\nsecond line",
                                                                       '{"tags":["a","b"]}']]
    as_json = tmp_path / "notes.json"
    contextful(project, "--json", "sql", "-o", str(as_json), query)
    assert json.loads(as_json.read_text())[1]["note"] == "plain"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.csv", "notes.json", "notes.parquet"]


@pytest.mark.parametrize(("args", "said"), [
    (["--format", "parquet"], "--format parquet writes a file: give it with -o FILE"),
    (["--format", "table", "-o", "{dir}/out.txt"], "-o FILE takes --format csv, json or parquet"),
    (["--format", "csv", "--json-first"], "--json and --format csv disagree"),
])
def test_options_that_disagree_are_usage_errors_and_write_nothing(project: Path, tmp_path: Path, args: list[str],
                                                                  said: str) -> None:
    words = [a.format(dir=tmp_path) for a in args if a != "--json-first"]
    front = ["--json"] if "--json-first" in args else []
    proc = contextful(project, *front, "sql", *words, "SELECT 1", check=False)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_query_failing_midway_leaves_no_file(project: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    proc = contextful(project, "sql", "--format", "csv", "-o", str(target),
                      "SELECT range, CASE WHEN range > 70000 THEN error('boom') END FROM range(100000)", check=False)
    assert proc.returncode == 3 and proc.stderr.startswith("error: QueryInvalid: ") and "boom" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("query", "statement"), [
    ("CREATE TABLE copy AS SELECT * FROM notes", "CREATE"),
    ("INSERT INTO notes SELECT * FROM notes", "INSERT"),
    ("UPDATE notes SET id = 3", "UPDATE"),
    ("DELETE FROM notes", "DELETE"),
    ("DROP VIEW notes", "DROP"),
    ("COPY (SELECT * FROM notes) TO '{dir}/leak.csv'", "COPY"),
    ("ATTACH '{dir}/other.duckdb' AS other", "ATTACH"),
    ("INSTALL httpfs", "INSTALL (DuckDB statement type LOAD)"),
    ("SELECT 1; CREATE TABLE t AS SELECT 1", "CREATE"),
    ("PRAGMA enable_profiling", "PRAGMA"),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{dir}/explained.csv'", "EXPLAIN"),
])
def test_writes_are_refused_by_statement_type(project: Path, tmp_path: Path, query: str, statement: str) -> None:
    before = _files(project)
    proc = contextful(project, "sql", query.format(dir=tmp_path), check=False)
    assert proc.returncode == 8, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: QueryWriteRefused: `contextful sql` only reads: {statement} is not a SELECT statement (in: ")
    assert list(tmp_path.iterdir()) == [] and _files(project) == before
    assert json.loads(contextful(project, "--json", "sql", "SELECT count(*) AS n FROM notes").stdout) == [{"n": 2}]


def test_reading_statements_of_every_spelling_answer(project: Path) -> None:
    for query in ("DESCRIBE notes", "SHOW TABLES", "SUMMARIZE notes", "FROM notes", "VALUES (1)",
                  "WITH x AS (SELECT 1 AS a) SELECT * FROM x", "SELECT 1; SELECT 2 AS two"):
        proc = contextful(project, "sql", query, check=False)
        assert proc.returncode == 0, (query, proc.stderr)
    assert json.loads(contextful(project, "--json", "sql", "SELECT 1; SELECT 2 AS two").stdout) == [{"two": 2}]


def test_a_duckdb_error_keeps_every_line_of_its_hint_on_one_error_line(project: Path) -> None:
    """DuckDB's hint lines (``Did you mean``, ``Candidate bindings``) are what the engine knows: the one
    ``error:`` line keeps all of them, its line breaks become spaces, and no traceback follows."""
    import duckdb

    oracle = duckdb.connect()
    oracle.execute("CREATE TABLE notes (id BIGINT, note VARCHAR)")
    for query, hint in (("SELECT * FROM note", 'Did you mean "notes"?'),
                        ("SELECT nte FROM notes", "Candidate bindings:")):
        with pytest.raises(duckdb.Error) as told:
            oracle.sql(query)
        lines = [line.strip() for line in str(told.value).splitlines() if line.strip()]
        assert any(hint in line for line in lines[1:]), lines  # DuckDB says it on a line after the first
        proc = contextful(project, "sql", query, check=False)
        assert proc.returncode == 3 and "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: QueryInvalid: "), proc.stderr
        assert " ".join(lines) in proc.stderr, (lines, proc.stderr)
