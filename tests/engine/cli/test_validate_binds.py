"""``contextful pipeline validate`` binds every model's SQL before any build (a real child process):
over the landed schema of a pipeline's table, over a model's contract or its own bound schema when
it was never built; a binder error names the model, its file and DuckDB's hint, and every problem
of the manifest is listed at once. ``build run`` names the model and file the same way."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "binds"

[[pipeline]]
id = "orders"
source = {{ kind = "files", config = {{ paths = ["orders.ndjson"] }} }}

[[model]]
name = "daily"
sql_file = "models/daily.sql"

[[model]]
name = "top"
sql = "SELECT amount FROM daily"

[[model]]
name = "by_id"
sql = "SELECT id, total FROM per_id"

[[model]]
name = "per_id"
sql = "SELECT id, sum(amount) AS total FROM orders GROUP BY id"

[[model]]
name = "contracted"
sql = "SELECT id FROM orders"
[model.contract]
version = "1.0"
grain = ["id"]
columns = {{ id = {{ type = "bigint" }} }}

[[model]]
name = "reads_contract"
sql = "SELECT {contract_column} FROM contracted"
{extra}"""

DAILY = "SELECT id,\n       amout\nFROM orders\n"


def _hint(sql: str, setup: str) -> str:
    """DuckDB's own message for ``sql`` over ``setup`` (the oracle), on one line."""
    con = duckdb.connect()
    con.execute(setup)
    with pytest.raises(duckdb.Error) as told:
        con.sql(sql)
    return " ".join(line.strip() for line in str(told.value).splitlines() if line.strip())


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "orders.ndjson").write_text('{"id": 1, "amount": 2.5}\n{"id": 2, "amount": 4}\n')
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "daily.sql").write_text(DAILY)
    return tmp_path


def _write(project: Path, contract_column: str = "id", extra: str = "") -> None:
    (project / "contextful.toml").write_text(MANIFEST.format(contract_column=contract_column, extra=extra))


def test_a_typo_in_a_model_is_found_by_validate_before_any_build(project: Path) -> None:
    _write(project)
    before = contextful(project, "pipeline", "validate", check=False)
    assert before.returncode == 0, before.stderr  # nothing landed yet: nothing tells orders' columns
    contextful(project, "pipeline", "run")
    proc = contextful(project, "pipeline", "validate", check=False)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    oracle = _hint(DAILY, "CREATE TABLE orders (id BIGINT, amount DOUBLE)")
    assert "Candidate bindings" in oracle
    assert proc.stderr.splitlines() == [
        f"error: QueryInvalid: [[model]] 'daily' (models/daily.sql): {oracle} (in: {' '.join(DAILY.split())})"]
    # top reads daily, which did not bind: nothing tells its schema, so top is not reported as well
    built = contextful(project, "build", "run", check=False)
    assert built.returncode == 3
    assert f"error: QueryInvalid: [[model]] 'daily' (models/daily.sql): {oracle}" in built.stderr


def test_models_never_built_bind_over_their_contract_or_their_bound_schema(project: Path) -> None:
    _write(project, contract_column="idd", extra='\n[[model]]\nname = "on_per_id"\nsql = "SELECT totl FROM per_id"\n')
    (project / "models" / "daily.sql").write_text("SELECT id, amount FROM orders\n")
    contextful(project, "pipeline", "run")
    proc = contextful(project, "pipeline", "validate", check=False)
    assert proc.returncode == 3
    lines = proc.stderr.splitlines()
    contract_hint = _hint("SELECT idd FROM contracted", "CREATE TABLE contracted (id BIGINT)")
    bound_hint = _hint("SELECT totl FROM per_id", "CREATE TABLE per_id (id BIGINT, total DOUBLE)")
    assert lines == [
        (f"error: QueryInvalid: [[model]] 'on_per_id' (inline sql in contextful.toml): {bound_hint} "
        "(in: SELECT totl FROM per_id)"),
        (f"error: QueryInvalid: [[model]] 'reads_contract' (inline sql in contextful.toml): {contract_hint} "
        "(in: SELECT idd FROM contracted)")], lines
    assert "Candidate bindings" in bound_hint and "Candidate bindings" in contract_hint
    assert contextful(project, "build", "list", check=False).returncode == 0
    assert not (project / ".contextful" / "store" / "tables" / "per_id").exists()  # validate built nothing


def test_validate_lists_every_problem_at_once(project: Path) -> None:
    _write(project)
    contextful(project, "pipeline", "run", "orders")
    _write(project, extra='\n[[model]]\nname = "ghost"\nsql = "SELECT * FROM nowhere"\n\n'
                          '[[pipeline]]\nid = "broken"\nnormalise = "nested"\n'
                          'source = { kind = "files", config = { paths = ["x.ndjson"] } }\n\n'
                          '[[model]]\nname = "on_broken"\nsql = "SELECT * FROM broken"\n')
    proc = contextful(project, "pipeline", "validate", check=False)
    assert proc.returncode == 3
    names = [line.split(":")[1].strip() for line in proc.stderr.splitlines()]
    assert names == ["ManifestKeyUnknown", "ModelInputUnknown", "QueryInvalid"], proc.stderr
    assert "'normalise'" in proc.stderr and "'ghost' reads 'nowhere'" in proc.stderr
    assert "[[model]] 'daily' (models/daily.sql)" in proc.stderr and "[[model]] 'on_broken'" not in proc.stderr
    as_json = json.loads(contextful(project, "--json", "pipeline", "validate", check=False).stdout)
    assert [p["error"] for p in as_json["problems"]] == names


def test_a_model_over_tables_not_landed_yet_is_not_bound(tmp_path: Path) -> None:
    """A relational pipeline's child table exists once it lands: before, nothing tells its schema, so
    a model reading it (or a model reading that model) is not refused for a table DuckDB cannot see."""
    (tmp_path / "contextful.toml").write_text(
        '[project]\nname = "later"\n\n[[pipeline]]\nid = "events"\nnormalize = "relational"\n'
        'source = { kind = "files", config = { paths = ["events.ndjson"] } }\n\n'
        '[[model]]\nname = "items"\nsql = "SELECT * FROM events__items"\n\n'
        '[[model]]\nname = "counted"\nsql = "SELECT count(*) AS n FROM items"\n')
    proc = contextful(tmp_path, "pipeline", "validate", check=False)
    assert proc.returncode == 0, proc.stderr
