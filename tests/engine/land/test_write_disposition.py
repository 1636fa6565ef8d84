"""A source exported in full, through ``contextful`` child processes as a user runs them: a CSV
overwritten every night merges by key (or replaces the table, the old version readable as of its
time), an unkeyed appending pipeline refuses the changed file naming the ways out, and
``pipeline reset`` forgets the cursor (``--yes`` off a terminal). Oracles are plain DuckDB over the
same files. On the SQLite (local) and PostgreSQL catalogs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.storage.container_site import ContainerSite
from tests.support.cli import contextful_in

MANIFEST = """[project]
name = "shop"

[[pipeline]]
id = "customers"
{extra}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["exports/customers.{ext}"]
"""

NIGHT_1 = "id,name,city\n1,Ada,Paris\n2,Bea,Lyon\n3,Cy,Nice\n4,Dan,Metz\n"
NIGHT_2 = "id,name,city\n2,Bea,Lille\n3,Cyril,Nice\n5,Eve,Brest\n6,Flo,Pau\n"


@pytest.fixture(params=["local", pytest.param("postgres", marks=pytest.mark.postgres)])
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The storage profile each test runs under: the embedded default (SQLite catalog, local root), or
    the postgres profile (PostgreSQL catalog, the corpus in an S3-compatible bucket)."""
    if request.param == "local":
        return {}
    site = ContainerSite.fresh(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema"),
                               request.getfixturevalue("s3_server"))
    return site.env


class Project:
    def __init__(self, root: Path, env: dict[str, str], extra: str = "", ext: str = "csv") -> None:
        self.root, self.env, self.ext = root, env, ext
        (root / "exports").mkdir(parents=True)
        (root / "contextful.toml").write_text(MANIFEST.format(extra=extra, ext=ext))
        if env:  # the postgres profile: a first set-up records the corpus's recovery identity
            self.cli("store", "provision")

    @property
    def export(self) -> Path:
        return self.root / "exports" / f"customers.{self.ext}"

    def night(self, text: str, keep: Path) -> None:
        """Overwrite the export in place (as a nightly job does), keeping a copy for the oracle."""
        self.export.write_text(text)
        keep.write_text(text)

    def cli(self, *args: str, check: bool = True) -> Any:
        return contextful_in(self.root, *args, env=self.env, check=check)

    def rows(self, sql: str, *options: str) -> list[dict[str, Any]]:
        return json.loads(self.cli("--json", "sql", *options, sql).stdout)


def oracle(sql: str) -> list[dict[str, Any]]:
    con = duckdb.connect()
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


@pytest.mark.parametrize("declared", ['write_disposition = "merge"', ""], ids=["merge", "keyed-default"])
def test_a_nightly_overwritten_csv_merges_by_its_primary_key(tmp_path: Path, env: dict[str, str],
                                                             declared: str) -> None:
    """Declared ``merge``, or the default of a keyed pipeline."""
    p = Project(tmp_path / "p", env, f'primary_key = ["id"]\n{declared}')
    n1, n2 = tmp_path / "n1.csv", tmp_path / "n2.csv"
    p.night(NIGHT_1, n1)
    p.cli("pipeline", "run")
    p.night(NIGHT_2, n2)
    plan = json.loads(p.cli("--json", "pipeline", "plan").stdout)["pipelines"][0]
    assert [i["input"] for i in plan["pull"]] == [str(p.export)] and plan["changed"] == []
    ran = p.cli("pipeline", "run", check=False)
    assert ran.returncode == 0, ran.stderr
    assert "InputChanged" not in ran.stderr
    # latest export wins per key; keys it no longer holds stay (merge upserts, never deletes)
    expected = oracle(f"SELECT id, name, city FROM read_csv('{n2}') UNION ALL SELECT id, name, city "
                      f"FROM read_csv('{n1}') WHERE id NOT IN (SELECT id FROM read_csv('{n2}')) ORDER BY id")
    assert p.rows("SELECT id, name, city FROM customers ORDER BY id") == expected
    assert p.rows("SELECT count(*) AS n FROM customers") == [{"n": len(expected)}] == [{"n": 6}]
    # the same export again lands nothing
    again = json.loads(p.cli("--json", "pipeline", "run").stdout)
    assert again[0]["tables"][0]["rows"] == 0


def test_replace_makes_the_last_export_the_table_and_keeps_the_old_version(tmp_path: Path,
                                                                           env: dict[str, str]) -> None:
    p = Project(tmp_path / "p", env, 'write_disposition = "replace"')
    n1, n2 = tmp_path / "n1.csv", tmp_path / "n2.csv"
    p.night(NIGHT_1, n1)
    p.cli("pipeline", "run")
    first = json.loads(p.cli("--json", "table", "show", "customers").stdout)["commits"][-1]["committed_at"]
    p.night(NIGHT_2, n2)
    p.cli("pipeline", "run")
    query = "SELECT id, name, city FROM customers ORDER BY id"
    assert p.rows(query) == oracle(f"SELECT id, name, city FROM read_csv('{n2}') ORDER BY id")
    assert p.rows(query, "--as-of", first) == oracle(f"SELECT id, name, city FROM read_csv('{n1}') ORDER BY id")
    kinds = [c["kind"] for c in json.loads(p.cli("--json", "table", "show", "customers").stdout)["commits"]]
    assert kinds[-1] == "replace"
    # nothing new: no commit, the table stays
    p.cli("pipeline", "run")
    assert len(json.loads(p.cli("--json", "table", "show", "customers").stdout)["commits"]) == len(kinds)


def test_a_failing_input_never_empties_a_replaced_table(tmp_path: Path, env: dict[str, str]) -> None:
    p = Project(tmp_path / "p", env, 'write_disposition = "replace"\ntypes = { id = "int64" }')
    n1 = tmp_path / "n1.csv"
    p.night(NIGHT_1, n1)
    p.cli("pipeline", "run")
    p.night("id,name,city\n7,Gus,Caen\nnot-a-number,Hal,Dax\n", tmp_path / "bad.csv")
    failed = p.cli("pipeline", "run", check=False)
    assert failed.returncode != 0
    assert p.rows("SELECT id, name, city FROM customers ORDER BY id") == oracle(
        f"SELECT id, name, city FROM read_csv('{n1}') ORDER BY id")
    # emptied by a source that ran: an export holding no rows empties the table
    p.night("id,name,city\n", tmp_path / "empty.csv")
    p.cli("pipeline", "run")
    assert p.rows("SELECT count(*) AS n FROM customers") == [{"n": 0}]


ORDERS_1 = [{"id": 1, "items": [{"sku": "a"}, {"sku": "b"}]}, {"id": 2, "items": [{"sku": "c"}]}]
ORDERS_2 = [{"id": 1, "items": [{"sku": "z"}]}, {"id": 3, "items": [{"sku": "d"}, {"sku": "e"}]}]


def _ndjson(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _items(p: Project) -> list[tuple[int, str]]:
    rows = p.rows("SELECT c.id, i.sku FROM customers c JOIN customers__items i ON i._cf_parent_id = c._cf_id "
                  "ORDER BY c.id, i.sku")
    return [(r["id"], r["sku"]) for r in rows]


@pytest.mark.parametrize("disposition", ["merge", "replace"])
def test_relational_child_tables_follow_the_disposition(tmp_path: Path, env: dict[str, str], disposition: str) -> None:
    p = Project(tmp_path / "p", env, f'normalize = "relational"\nprimary_key = ["id"]\n'
                                     f'write_disposition = "{disposition}"', ext="ndjson")
    p.export.write_text(_ndjson(ORDERS_1))
    p.cli("pipeline", "run")
    p.export.write_text(_ndjson(ORDERS_2))
    p.cli("pipeline", "run")
    # merge: order 1's children are its new ones, order 2 stays with its own; replace: the last export alone
    second = [(o["id"], i["sku"]) for o in ORDERS_2 for i in o["items"]]
    expected = sorted(second + ([(2, "c")] if disposition == "merge" else []))
    assert _items(p) == expected
    assert p.rows("SELECT count(*) AS n FROM customers__items") == [{"n": len(expected)}]


def test_an_unkeyed_appending_pipeline_refuses_a_changed_input_naming_the_ways_out(tmp_path: Path,
                                                                                   env: dict[str, str]) -> None:
    p = Project(tmp_path / "p", env)
    p.night(NIGHT_1, tmp_path / "n1.csv")
    p.cli("pipeline", "run")
    p.night(NIGHT_2, tmp_path / "n2.csv")
    refused = p.cli("pipeline", "run", check=False)
    assert refused.returncode != 0 and "InputChanged" in refused.stderr
    for way_out in ("primary_key", 'write_disposition = "replace"', "contextful pipeline reset customers"):
        assert way_out in refused.stderr
    assert p.rows("SELECT count(*) AS n FROM customers") == [{"n": 4}]


def test_validate_refuses_merge_without_a_key_and_append_with_one(tmp_path: Path, env: dict[str, str]) -> None:
    p = Project(tmp_path / "p", env, 'write_disposition = "merge"')
    refused = p.cli("pipeline", "validate", check=False)
    assert refused.returncode != 0 and "write_disposition" in refused.stderr and "primary_key" in refused.stderr
    (p.root / "contextful.toml").write_text(MANIFEST.format(extra='primary_key = ["id"]\nwrite_disposition = '
                                                            '"append"', ext="csv"))
    refused = p.cli("pipeline", "validate", check=False)
    assert refused.returncode != 0 and "'append' keeps every row" in refused.stderr
    (p.root / "contextful.toml").write_text(MANIFEST.format(extra='write_disposition = "upsert"', ext="csv"))
    refused = p.cli("pipeline", "validate", check=False)
    assert refused.returncode != 0 and "'upsert' is not one of append, merge, replace" in refused.stderr


def test_reset_forgets_the_cursor_only_with_yes_off_a_terminal(tmp_path: Path, env: dict[str, str]) -> None:
    p = Project(tmp_path / "p", env)
    p.night(NIGHT_1, tmp_path / "n1.csv")
    p.cli("pipeline", "run")
    p.night(NIGHT_2, tmp_path / "n2.csv")
    refused = p.cli("pipeline", "reset", "customers", check=False)  # stdin is no terminal here
    assert refused.returncode != 0 and "ConfirmationRequired" in refused.stderr and "--yes" in refused.stderr
    assert "InputChanged" in p.cli("pipeline", "run", check=False).stderr  # nothing was forgotten
    reset = p.cli("pipeline", "reset", "customers", "--yes")
    assert "exports/customers.csv" in reset.stdout and "deletes no rows" in reset.stdout
    assert "lands twice" in reset.stdout  # an unkeyed append pipeline: re-read rows are appended again
    p.cli("pipeline", "run")
    expected = oracle(f"SELECT count(*) AS n FROM (SELECT * FROM read_csv('{tmp_path / 'n1.csv'}') UNION ALL "
                      f"SELECT * FROM read_csv('{tmp_path / 'n2.csv'}'))")
    assert p.rows("SELECT count(*) AS n FROM customers") == expected == [{"n": 8}]


def test_reset_then_a_keyed_run_reads_every_input_again(tmp_path: Path, env: dict[str, str]) -> None:
    p = Project(tmp_path / "p", env, 'primary_key = ["id"]')
    p.night(NIGHT_1, tmp_path / "n1.csv")
    p.cli("pipeline", "run")
    nothing = json.loads(p.cli("--json", "pipeline", "plan").stdout)["pipelines"][0]
    assert nothing["pull"] == []
    reset = json.loads(p.cli("--json", "pipeline", "reset", "customers", "--yes").stdout)
    assert reset["forgot"]["inputs"] == ["exports/customers.csv"] and reset["rows_kept"] == 4
    shown = json.loads(p.cli("--json", "run", "show", reset["run_id"]).stdout)  # the reset is in the run history
    assert shown["origin"] == "pipeline customers (reset: cursor forgotten)" and shown["rows"] == 0
    plan = json.loads(p.cli("--json", "pipeline", "plan").stdout)["pipelines"][0]
    assert [i["input"] for i in plan["pull"]] == [str(p.export)]
    ran = json.loads(p.cli("--json", "pipeline", "run").stdout)
    assert ran[0]["tables"][0]["rows"] == 4
    assert p.rows("SELECT count(*) AS n FROM customers") == [{"n": 4}]
    # a reset right after another forgets what the run landed since; one with nothing to forget changes nothing
    p.cli("pipeline", "reset", "customers", "--yes")
    commits = json.loads(p.cli("--json", "table", "show", "customers").stdout)["commits"]
    again = p.cli("pipeline", "reset", "customers", "--yes")
    assert "no cursor to forget" in again.stdout
    assert json.loads(p.cli("--json", "table", "show", "customers").stdout)["commits"] == commits


def test_reset_refuses_while_a_run_holds_the_pipeline(tmp_path: Path, env: dict[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The reset takes the run's guard: while a run's execution is open (held by a live process,
    here this one, as a run in flight holds it), the reset refuses by name and forgets nothing."""
    from contextful.engine.config import load_manifest
    from contextful.engine.land.journal import PullJournal
    from contextful.engine.land.pipeline import cursor_scope
    from contextful.engine.project import open_project_store

    p = Project(tmp_path / "p", env, 'primary_key = ["id"]')
    p.night(NIGHT_1, tmp_path / "n1.csv")
    p.cli("pipeline", "run")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    manifest = load_manifest(p.root)
    spec = manifest.pipeline("customers")
    with open_project_store(manifest.root, project=manifest.project) as store:
        held = PullJournal.open(store, spec, cursor_scope(spec))
        try:
            refused = p.cli("pipeline", "reset", "customers", "--yes", check=False)
        finally:
            held.close(ok=True)
    assert refused.returncode == 11 and "ExecutionHeld" in refused.stderr and "'customers'" in refused.stderr
    assert json.loads(p.cli("--json", "pipeline", "plan").stdout)["pipelines"][0]["pull"] == []  # nothing forgotten
    assert "cursor forgotten" in p.cli("pipeline", "reset", "customers", "--yes").stdout
