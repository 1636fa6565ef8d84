"""The public surface: what ``import contextful`` offers, and that nothing internal leaks into it.

A name listed here is a promise to notebooks and embedding programs; removing one fails this test
on purpose (httpx keeps its surface the same way)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import contextful

PUBLIC = {"Project", "Store", "TaskJoin", "TaskUnit", "__version__", "attach_build", "build", "connect", "errors",
          "export", "open_project", "open_store", "register_task", "run_pipelines"}
INTERNAL = {"engine", "storage", "iceberg", "datasets", "api"}


def test_the_public_names_are_exactly_these_and_each_resolves() -> None:
    assert set(contextful.__all__) == PUBLIC
    assert not INTERNAL & set(contextful.__all__)
    for name in contextful.__all__:
        assert getattr(contextful, name) is not None
    assert contextful.Store.__module__.startswith("contextful.storage")
    assert isinstance(contextful.__version__, str) and contextful.__version__


def test_the_error_catalogue_is_public_whole() -> None:
    import contextful.storage.errors as catalogue

    tree = ast.parse(Path(catalogue.__file__).read_text(encoding="utf-8"))
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert classes <= set(contextful.errors.__all__)
    for name in classes:
        error = getattr(contextful.errors, name)
        assert issubclass(error, contextful.errors.ContextfulError) or error is contextful.errors.ContextfulError


def test_import_contextful_loads_no_engine_until_a_name_is_used() -> None:
    """``import contextful`` stays instant (the CLI imports it first): names load on first use."""
    probe = ("import sys, contextful; heavy = [m for m in ('pyarrow', 'duckdb', 'polars') if m in sys.modules];"
             " print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_a_project_runs_builds_and_reads_through_the_public_api(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text('{"id": 1, "kind": "view"}\n{"id": 2, "kind": "buy"}\n')
    (tmp_path / "contextful.toml").write_text(
        '[project]\nname = "api"\n[[pipeline]]\nid = "events"\n[pipeline.source]\nkind = "files"\n'
        '[pipeline.source.config]\npaths = ["raw/*.ndjson"]\n'
        '[[model]]\nname = "kinds"\nsql = "SELECT kind, count(*) AS n FROM events GROUP BY kind"\n')
    [landed] = contextful.run_pipelines(tmp_path)
    assert landed.ok and landed.inputs_landed
    [built] = contextful.build(tmp_path)
    con = contextful.connect(tmp_path)
    assert sorted(con.sql("SELECT kind, n FROM kinds").fetchall()) == [("buy", 1), ("view", 1)]
    with contextful.open_project(tmp_path) as project:
        project.store.append("events", pa.table({"id": [3], "kind": ["view"]}))
        rebuilt = project.build(["kinds"])[0]
        con = project.connect()
        old = contextful.attach_build(con, project, "kinds", built.build_id)
        assert con.sql(f'SELECT n FROM "{old}" WHERE kind = \'view\'').fetchall() == [(1,)]
        assert con.sql("SELECT n FROM kinds WHERE kind = 'view'").fetchall() == [(2,)]
        assert rebuilt.build_id != built.build_id
    store = contextful.open_store(tmp_path)
    try:
        past = contextful.connect(store, as_of="2000-01-01T00:00:00Z")  # before every first commit
        with pytest.raises(duckdb.Error, match="SnapshotNotFound: table 'events' has no snapshot as of 2000"):
            past.sql("SELECT count(*) FROM events").fetchall()
    finally:
        store.close()
