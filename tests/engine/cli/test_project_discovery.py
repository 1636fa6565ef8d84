"""Every command finds its project one way, and a command that reads never creates a store.

Each test runs the ``contextful`` command as a user does (a child process, in a chosen working
directory) and checks the exit code, the one ``error:`` line, and which files exist afterwards.
Also here: ``contextful init``, ``--version``, shell completion, the global options after the
subcommand, and the catalog errors a misconfigured or unreachable store gives.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import contextful
from tests.support.cli import contextful_in

READERS = (
    ("table", "list"), ("table", "show", "events"), ("table", "fold", "events"), ("sql", "SELECT 1"),
    ("run", "history"), ("run", "executions"), ("run", "rewind", "x", "--reason", "r"), ("run", "cancel", "x"),
    ("store", "collect"),
    ("build", "hold", "m", "1"), ("build", "release", "m", "1"), ("build", "run"), ("export", "run"),
)
"""Commands that read or maintain an existing store: none may create one."""

UNLANDED = (("build", "list"), ("build", "status"))
"""Commands that answer before anything landed (every model unbuilt), creating nothing."""

MANIFEST = ('[project]\nname = "disc"\n\n[[pipeline]]\nid = "events"\n\n[pipeline.source]\nkind = "files"\n\n'
            '[pipeline.source.config]\npaths = ["raw/*.ndjson"]\n')


def one_line(proc: subprocess.CompletedProcess[str], name: str, code: int) -> str:
    """The one ``error: NAME: …`` line ``proc`` failed with (asserted: exit ``code``, no trace)."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {name}: "), lines[0]
    return lines[0]


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose pipeline has landed once (so its store exists)."""
    root = tmp_path / "proj"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "a.ndjson").write_text('{"id": 1, "kind": "view"}\n{"id": 2, "kind": "buy"}\n')
    (root / "contextful.toml").write_text(MANIFEST)
    contextful_in(root, "pipeline", "run")
    return root


# --- item 1: one project, found the same way everywhere -----------------------------------------


def test_outside_a_project_every_command_says_so_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for words in (*READERS, *UNLANDED, ("export", "status"), ("pipeline", "run"), ("pipeline", "plan"),
                  ("table", "load", "t", "x.csv")):
        line = one_line(contextful_in(empty, *words, check=False), "ProjectNotFound", 6)
        assert str(empty) in line and "no contextful.toml" in line and "contextful init" in line, line
        assert tree(empty) == set(), words  # no catalog.sqlite, store.json or .contextful


def test_a_mistyped_project_path_is_an_error_naming_it_never_the_project_around_it(project: Path) -> None:
    typo = project / "sub" / "typo"  # inside a project: a search upwards would find it
    for words in (("table", "list"), ("pipeline", "run"), ("build", "status")):
        line = one_line(contextful_in(project, "--project", str(typo), *words, check=False), "ProjectNotFound", 6)
        assert f"{typo}: no such directory" in line
    assert not (project / "sub").exists()


def test_commands_find_the_project_at_or_above_the_working_directory(project: Path) -> None:
    deep = project / "notebooks" / "week1"
    deep.mkdir(parents=True)
    listed = json.loads(contextful_in(deep, "--json", "table", "list").stdout)
    assert [t["table"] for t in listed] == ["events"]
    assert json.loads(contextful_in(deep, "--json", "sql", "SELECT count(*) AS n FROM events").stdout) == [{"n": 2}]
    assert len(json.loads(contextful_in(deep, "--json", "run", "history").stdout)) == 1
    assert json.loads(contextful_in(deep, "--json", "pipeline", "plan").stdout)["pipelines"][0]["pull"] == []
    contextful_in(deep, "table", "load", "more", str(project / "raw" / "a.ndjson"))
    contextful_in(deep, "store", "collect")
    assert tree(deep) == set()
    assert json.loads(contextful_in(project, "--json", "table", "show", "more").stdout)["rows"] == 2


def test_a_project_without_a_store_yet_is_read_without_creating_one(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    before = tree(tmp_path)
    for words in READERS:
        line = one_line(contextful_in(tmp_path, *words, check=False), "StoreNotFound", 6)
        assert f"no store at {tmp_path / '.contextful' / 'store'}" in line and "pipeline run" in line, line
    for words in UNLANDED:
        assert contextful_in(tmp_path, *words).returncode == 0
    plan = json.loads(contextful_in(tmp_path, "--json", "pipeline", "plan").stdout)["pipelines"]  # plans against nothing landed
    assert len(plan[0]["pull"]) == 1 and plan[0]["skip"] == []
    assert tree(tmp_path) == before
    contextful_in(tmp_path, "pipeline", "run")  # a writer creates the project's store
    assert (tmp_path / ".contextful" / "store" / "store.json").is_file()


def test_export_status_before_any_export_creates_no_iceberg_catalog(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST + '\n[[export]]\nname = "ev"\nsource = "events"\n'
                                              'namespace = "bi"\ncredential = "analysts"\n')
    [status] = json.loads(contextful_in(tmp_path, "export", "status", "--json").stdout)
    assert status["export"] == "ev" and status["snapshot_id"] is None
    assert tree(tmp_path) == {"contextful.toml"}  # no .contextful/iceberg/catalog.sqlite


def test_store_url_reads_an_existing_store_without_a_project(project: Path, tmp_path: Path) -> None:
    root = project / ".contextful" / "store"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = json.loads(contextful_in(elsewhere, "--store", str(root), "--json", "table", "list").stdout)
    assert [t["table"] for t in listed] == ["events"]
    by_env = contextful_in(elsewhere, "--json", "sql", "SELECT count(*) AS n FROM events",
                           env={"CONTEXTFUL_STORE": str(root)})
    assert json.loads(by_env.stdout) == [{"n": 2}]
    missing = elsewhere / "no-store"
    line = one_line(contextful_in(elsewhere, "--store", str(missing), "table", "list", check=False), "StoreNotFound", 6)
    assert str(missing) in line
    assert tree(elsewhere) == set()


def test_the_public_api_finds_projects_as_the_command_does(project: Path, tmp_path: Path) -> None:
    deep = project / "a" / "b"
    deep.mkdir(parents=True)
    with contextful.open_project(deep) as opened:
        assert opened.root == project
    assert contextful.connect(deep).sql("SELECT count(*) FROM events").fetchall() == [(2,)]
    with pytest.raises(contextful.errors.ProjectNotFound, match="no such directory"):
        contextful.open_store(project / "typo")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "contextful.toml").write_text('[project]\nname = "bare"\n')
    with pytest.raises(contextful.errors.StoreNotFound):
        contextful.connect(bare)
    with pytest.raises(contextful.errors.StoreNotFound):
        contextful.open_store(bare)
    assert tree(bare) == {"contextful.toml"}
    store = contextful.open_store(project / ".contextful" / "store")  # a store root, given directly
    try:
        assert store.table_names() == ["events"]
    finally:
        store.close()


# --- item 2: contextful init -----------------------------------------------------------------------


def test_init_starts_a_project_that_runs_at_once_and_never_overwrites_one(tmp_path: Path) -> None:
    out = contextful_in(tmp_path, "init", "shop").stdout
    root = tmp_path / "shop"
    assert f"wrote {root / 'contextful.toml'}" in out and "contextful pipeline run" in out
    assert tree(root) == {"contextful.toml", "raw", "raw/events.ndjson", ".gitignore"}
    assert (root / ".gitignore").read_text() == "/.contextful/secrets.toml\n"  # the secrets file stays out of git
    text = (root / "contextful.toml").read_text()
    assert text.startswith("#") and 'name = "shop"' in text
    [ran] = json.loads(contextful_in(root, "--json", "pipeline", "run").stdout)
    assert ran["ok"] and ran["tables"][0]["rows"] == 4
    answer = contextful_in(root, "--json", "sql", "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind")
    assert json.loads(answer.stdout) == [{"kind": "purchase", "n": 1}, {"kind": "signup", "n": 2},
                                         {"kind": "view", "n": 1}]
    line = one_line(contextful_in(tmp_path, "init", "shop", check=False), "ProjectExists", 5)
    assert str(root / "contextful.toml") in line
    assert (root / "contextful.toml").read_text() == text


# --- item 3: --version and shell completion --------------------------------------------------------


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    proc = contextful_in(tmp_path, "--version")
    assert proc.stdout.strip() == f"contextful {contextful.__version__}"


def _complete(tmp_path: Path, env: dict[str, str]) -> str:
    """What the command prints for the completion request in ``env`` (the variables click reads)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTFUL_", "_CONTEXTFUL_", "COMP_"))}
    proc = subprocess.run([sys.executable, "-m", "contextful.engine.cli"], cwd=tmp_path, env=clean | env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_shell_completion_source_and_subcommand_completion(tmp_path: Path) -> None:
    source = _complete(tmp_path, {"_CONTEXTFUL_COMPLETE": "bash_source"})
    assert "_contextful_completion" in source and "complete " in source
    assert "_contextful_completion" in _complete(tmp_path, {"_CONTEXTFUL_COMPLETE": "zsh_source"})
    top = _complete(tmp_path, {"_CONTEXTFUL_COMPLETE": "bash_complete", "COMP_WORDS": "contextful bu",
                               "COMP_CWORD": "1"})
    assert top.split() == ["plain,build"]
    nested = _complete(tmp_path, {"_CONTEXTFUL_COMPLETE": "bash_complete", "COMP_WORDS": "contextful build st",
                                  "COMP_CWORD": "2"})
    assert nested.split() == ["plain,status"]
    flag = _complete(tmp_path, {"_CONTEXTFUL_COMPLETE": "bash_complete", "COMP_WORDS": "contextful build status --js",
                                "COMP_CWORD": "3"})
    assert flag.split() == ["plain,--json"]


# --- item 4: the global options after the subcommand -----------------------------------------------


def test_global_options_work_after_the_subcommand_as_before_it(project: Path, tmp_path: Path) -> None:
    (project / "contextful.toml").write_text(MANIFEST + '\n[[model]]\nname = "kinds"\n'
                                             'sql = "SELECT kind, count(*) AS n FROM events GROUP BY kind"\n')
    contextful_in(project, "build", "run")
    after = json.loads(contextful_in(project, "build", "status", "--json").stdout)
    before = json.loads(contextful_in(project, "--json", "build", "status").stdout)
    assert after == before and after[0]["model"] == "kinds"
    assert json.loads(contextful_in(project, "export", "status", "--json").stdout) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    listed = contextful_in(elsewhere, "table", "list", "--project", str(project), "--json").stdout
    assert [t["table"] for t in json.loads(listed)] == ["events", "kinds"]  # the model's build is a table too
    by_store = contextful_in(elsewhere, "table", "list", "--json", "--store", str(project / ".contextful" / "store"))
    assert json.loads(by_store.stdout) == json.loads(listed)
    assert contextful_in(project, "pipeline", "key", "list", "--json").stdout.strip() == "[]"  # a nested leaf
    debug = contextful_in(project, "table", "show", "nope", "--debug", check=False)
    assert debug.returncode == 6 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.splitlines()[-1] == "error: TableNotFound: no table 'nope' in this store"
    verbose = contextful_in(project, "pipeline", "run", "-v")
    assert verbose.returncode == 0
    assert tree(elsewhere) == set()


# --- item 5: catalog errors from the catalogue ----------------------------------------------------


def test_a_remote_store_without_a_catalog_names_the_key_to_set(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "remote"\nstore = "s3://bucket/prefix"\n')
    for words in (("table", "list"), ("pipeline", "run")):
        line = one_line(contextful_in(tmp_path, *words, check=False), "CatalogPathMissing", 3)
        assert "s3://bucket/prefix" in line and "[project] catalog" in line and "CONTEXTFUL_STORAGE_PROFILE" in line
    assert tree(tmp_path) == {"contextful.toml"}


def _closed_port() -> int:
    """A loopback port nothing listens on: bound to learn it, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_postgres_profile_with_a_dead_server_is_catalog_unavailable(project: Path, tmp_path: Path) -> None:
    port = _closed_port()
    env = {"CONTEXTFUL_STORAGE_PROFILE": "postgres",
           "CONTEXTFUL_POSTGRES_DSN": f"host=127.0.0.1 port={port} user=postgres password=hunter2sekrit dbname=x"}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "contextful.toml").write_text(MANIFEST)
    (fresh / "raw").mkdir()
    (fresh / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    line = one_line(contextful_in(fresh, "pipeline", "run", env=env, check=False), "CatalogUnavailable", 75)
    assert f"port {port}" in line and "hunter2sekrit" not in line
    assert not (fresh / ".contextful" / "store" / "store.json").exists()  # nothing published without a catalog
    for words in (("table", "list"), ("sql", "SELECT 1"), ("run", "executions")):  # an existing store's root
        proc = contextful_in(tmp_path, "--store", str(project / ".contextful" / "store"), *words, env=env, check=False)
        assert "hunter2sekrit" not in one_line(proc, "CatalogUnavailable", 75)
    url = env | {"CONTEXTFUL_POSTGRES_DSN": f"postgresql://postgres:hunter2sekrit@127.0.0.1:{port}/x"}
    line = one_line(contextful_in(fresh, "pipeline", "run", env=url, check=False), "CatalogUnavailable", 75)
    assert "hunter2sekrit" not in line
