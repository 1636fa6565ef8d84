"""``contextful build run`` past a failing model (a real child process): every model that published is
reported (text and ``--json``), each failure on its own ``error:`` line, the models reading a failed one
are skipped and said to be, and the exit code is the first failure's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "builds"

[[model]]
name = "a_counts"
sql = "SELECT kind, count(*) AS n FROM users GROUP BY kind"

[[model]]
name = "b_broken"
sql = "SELECT no_such_column FROM users"

[[model]]
name = "c_after_broken"
sql = "SELECT * FROM b_broken"

[[model]]
name = "d_contract"
sql = "SELECT id FROM users"
contract = {{ version = "1.0", columns = {{ id = {{ type = "{id_type}", nullable = false }} }} }}

[[model]]
name = "e_after_counts"
sql = "SELECT sum(n) AS total FROM a_counts"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "users.csv").write_text("id,kind\n1,a\n2,b\n3,a\n")
    (tmp_path / "contextful.toml").write_text('[project]\nname = "builds"\n')
    contextful(tmp_path, "table", "load", "users", str(tmp_path / "users.csv"))
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(id_type="boolean"))
    return tmp_path


def published(project: Path) -> dict[str, int | None]:
    return {r["model"]: r["build_id"] for r in json.loads(contextful(project, "--json", "build", "list").stdout)}


def test_every_published_model_is_reported_beside_the_failures(project: Path) -> None:
    proc = contextful(project, "build", "run", check=False)
    assert proc.returncode == 3  # QueryInvalid, b_broken's: the first failure in build order
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2 and "Traceback" not in proc.stderr
    assert errors[0].startswith("error: QueryInvalid: ") and "no_such_column" in errors[0]
    assert errors[1].startswith("error: ContractMismatch: ") and "d_contract" in errors[1]
    out = proc.stdout
    assert "a_counts: build 1 published" in out and "e_after_counts: build 1 published" in out
    assert "c_after_broken: skipped, it reads b_broken, which did not build" in out
    assert published(project) == {"a_counts": 1, "b_broken": None, "c_after_broken": None, "d_contract": None,
                                  "e_after_counts": 1}
    tables = [r["table"] for r in json.loads(contextful(project, "--json", "table", "list").stdout)]
    assert tables == ["a_counts", "e_after_counts", "users"]  # a failed first build leaves no empty table


def test_json_reports_each_model_with_its_status(project: Path) -> None:
    proc = contextful(project, "--json", "build", "run", check=False)
    assert proc.returncode == 3
    report = {r["model"]: r for r in json.loads(proc.stdout)}
    assert [r["status"] for r in report.values()] == ["published", "failed", "skipped", "failed", "published"]
    assert report["a_counts"]["build_id"] == 1 and report["a_counts"]["rows"] == 2
    assert report["b_broken"]["error"] == "QueryInvalid"
    assert report["c_after_broken"]["after"] == ["b_broken"]
    assert report["d_contract"]["error"] == "ContractMismatch"
    assert proc.stderr.count("error: ") == 2


def test_a_clean_build_exits_zero_and_reports_all(project: Path) -> None:
    (project / "contextful.toml").write_text(MANIFEST.format(id_type="bigint").replace(
        "SELECT no_such_column FROM users", "SELECT id FROM users"))
    proc = contextful(project, "--json", "build", "run")
    assert [r["status"] for r in json.loads(proc.stdout)] == ["published"] * 5
    assert proc.stderr == ""
