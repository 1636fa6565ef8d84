"""``contextful table load`` and ``table drop`` as a user runs them (real child processes): a failed
load leaves no table behind, a path that is no file is refused before anything is created, and a drop
takes the table whole, refusing one a model or an export reads unless ``--force``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.engine.cli import cli

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "tables"

[[model]]
name = "by_kind"
sql = "SELECT kind, count(*) AS n FROM users GROUP BY kind"

[[export]]
name = "people"
source = "users"
namespace = "bi"
credential = "analysts"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text('[project]\nname = "tables"\n')
    (root / "users.csv").write_text("id,kind\n1,a\n2,b\n3,a\n")
    return root


def tables(project: Path) -> list[dict[str, object]]:
    return json.loads(contextful(project, "--json", "table", "list").stdout)


def table_dirs(project: Path) -> list[str]:
    root = project / ".contextful" / "store" / "tables"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("_") and any(p.rglob("*.*"))) if root.exists() else []


def one_error(proc: object, name: str) -> str:
    err = proc.stderr.strip()  # type: ignore[attr-defined]
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {name}: "), err
    assert "Traceback" not in err
    return err


def test_table_group_lives_in_its_own_module() -> None:
    from contextful.engine.cli import table as module

    assert cli.commands["table"] is module.table
    assert set(module.table.commands) >= {"list", "show", "load", "fold", "drop"}


@pytest.mark.parametrize(("make", "error", "code"), [
    (lambda root: root / "missing.csv", "InputNotFound", 6),
    (lambda root: (root / "folder").mkdir() or root / "folder", "InputUnreadable", 4),
])
def test_load_refuses_a_path_that_is_no_file_before_creating_anything(project: Path, make, error: str,
                                                                        code: int) -> None:
    path = make(project)
    proc = contextful(project, "table", "load", "users", str(path), check=False)
    assert proc.returncode == code
    assert str(path) in one_error(proc, error)
    assert tables(project) == []
    assert table_dirs(project) == []


@pytest.mark.parametrize(("content", "args", "error"), [
    ("id,kind\n1,a\n,b\n", ["--primary-key", "id"], "PrimaryKeyNull"),
    ("id,kind\n1,a\n", ["--primary-key", "nope"], "PrimaryKeyColumnMissing"),
    ("id,kind\n1,a\n2,b,c,d\n", [], "InputMalformed"),
    ("\x00\xff\xfe garbage", ["--format", "parquet"], "InputMalformed"),
])
def test_a_failed_load_of_a_new_table_leaves_no_table_and_a_rerun_works(project: Path, content: str,
                                                                        args: list[str], error: str) -> None:
    bad = project / "bad.csv"
    bad.write_text(content)
    proc = contextful(project, "table", "load", "users", str(bad), *args, check=False)
    assert proc.returncode == 4, proc.stderr
    one_error(proc, error)
    assert tables(project) == []
    assert table_dirs(project) == []
    loaded = json.loads(contextful(project, "--json", "table", "load", "users", str(project / "users.csv"),
                                   "--primary-key", "id").stdout)
    assert loaded["commit_seq"] == 1 and loaded["rows"] == 3


def test_a_failed_load_into_an_existing_table_keeps_it(project: Path) -> None:
    contextful(project, "table", "load", "users", str(project / "users.csv"), "--primary-key", "id")
    (project / "bad.csv").write_text("id,kind\n4,a\n,b\n")
    proc = contextful(project, "table", "load", "users", str(project / "bad.csv"), check=False)
    assert proc.returncode == 4
    one_error(proc, "PrimaryKeyNull")
    [row] = tables(project)
    assert row["table"] == "users" and row["commit_seq"] == 1 and row["rows_stored"] == 3


def test_drop_refuses_a_table_a_model_or_export_reads_unless_forced(project: Path) -> None:
    contextful(project, "table", "load", "users", str(project / "users.csv"), "--primary-key", "id")
    (project / "contextful.toml").write_text(MANIFEST)
    proc = contextful(project, "table", "drop", "users", check=False)
    assert proc.returncode == 5
    err = one_error(proc, "TableStillRead")
    assert "model 'by_kind'" in err and "export 'people'" in err and "--force" in err
    assert [r["table"] for r in tables(project)] == ["users"]
    assert table_dirs(project) == ["users"]

    dropped = json.loads(contextful(project, "--json", "table", "drop", "users", "--force").stdout)
    # its one part (its manifest rides in its commit's catalog row, docs/store.md)
    assert dropped["table"] == "users" and dropped["commit_seq"] == 1 and dropped["objects"] == 1
    assert tables(project) == []
    assert table_dirs(project) == []
    contextful(project, "run", "history")  # the dropped table's runs still list
    gone = contextful(project, "sql", "SELECT count(*) FROM users", check=False)
    assert gone.returncode != 0
    again = json.loads(contextful(project, "--json", "table", "load", "users", str(project / "users.csv")).stdout)
    assert again["commit_seq"] == 1  # a new incarnation, from its first commit


def test_drop_of_a_table_nothing_reads(project: Path) -> None:
    contextful(project, "table", "load", "users", str(project / "users.csv"))
    out = contextful(project, "table", "drop", "users").stdout
    assert out.startswith("users: dropped")
    assert tables(project) == [] and table_dirs(project) == []


@pytest.mark.parametrize(("name", "error", "code"), [("nothing", "TableNotFound", 6),
                                                     ("_runs", "TableNameInvalid", 3)])
def test_drop_refuses_unknown_and_reserved_tables(project: Path, name: str, error: str, code: int) -> None:
    contextful(project, "table", "load", "users", str(project / "users.csv"))
    proc = contextful(project, "table", "drop", name, check=False)
    assert proc.returncode == code
    assert repr(name) in one_error(proc, error)
    assert [r["table"] for r in tables(project)] == ["users"]
    assert "_runs" in [r["table"] for r in json.loads(contextful(project, "--json", "table", "list", "--all").stdout)]


def test_collect_removes_what_a_drop_left_behind(project: Path) -> None:
    contextful(project, "table", "load", "users", str(project / "users.csv"))
    contextful(project, "table", "drop", "users")
    left = project / ".contextful" / "store" / "tables" / "users" / "parts" / "r1-abc-00000.parquet"
    left.parent.mkdir(parents=True, exist_ok=True)
    left.write_bytes(b"a part a run in flight wrote after the drop")
    result = json.loads(contextful(project, "--json", "store", "collect", "--grace-seconds", "0").stdout)
    assert result["orphans"] == 1
    assert not left.exists()
