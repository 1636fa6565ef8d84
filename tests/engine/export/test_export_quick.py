"""Short work is quick (issue 28): ``export status`` and an ``export run`` whose source did not change
answer from the export's state file without importing pyiceberg, while the catalog still points at
the metadata file the state file recorded; anything else goes through pyiceberg and says the same
thing it always did. Each command runs as a user runs it, a child process, which reports at exit
whether pyiceberg was ever imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.storage import Store
from pyiceberg.catalog import Catalog, load_catalog

SALES = pa.table({"region": ["n", "n", "s"], "amount": pa.array([1, 2, 3], pa.int64())})

# Runs ``contextful ARGS...`` (the real ``__main__``) and prints, once it exits, whether any
# pyiceberg module was ever loaded in the process.
PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("PYICEBERG-LOADED" if any(m == "pyiceberg" or m.startswith("pyiceberg.")
                                                          for m in sys.modules) else "PYICEBERG-NOT-LOADED",
                              file=sys.stderr))
sys.argv = ["contextful", *sys.argv[1:]]
runpy.run_module("contextful.engine.cli", run_name="__main__")
"""


def probed(project: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``contextful --project PROJECT ARGS...`` in a child; its result and whether it imported pyiceberg."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    proc = subprocess.run([sys.executable, "-c", PROBE, "--project", str(project), *args], capture_output=True,
                          text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    marks = [line for line in proc.stderr.splitlines() if line.startswith("PYICEBERG-")]
    assert len(marks) == 1, proc.stderr
    return proc, marks[0] == "PYICEBERG-LOADED"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_line(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ``[[export]]`` block's catalog: the default local SQLite one, or a PostgreSQL SQL catalog."""
    if request.param == "sqlite":
        return ""
    parts = dict(item.split("=", 1) for item in request.getfixturevalue("pg_dsn").split())
    uri = f"postgresql+psycopg://{parts.get('user', 'postgres')}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    name = f"quick_{uuid.uuid4().hex[:8]}"  # the catalog name keys its rows in the shared database
    return f'catalog = {{ uri = "{uri}", name = "{name}", warehouse = "{(tmp_path / "wh").as_uri()}" }}\n'


def project(root: Path, catalog_line: str, extra: str = "") -> Path:
    (root / "contextful.toml").write_text(
        '[project]\nname = "p"\n\n[[export]]\nname = "out"\nsource = "sales"\nnamespace = "bi"\n'
        f'credential = "analysts"\n{catalog_line}{extra}')
    return root


def iceberg_catalog(root: Path) -> Catalog:
    spec = load_manifest(root).export("out").catalog
    return load_catalog(spec.name, **spec.pyiceberg_properties())


def test_status_and_an_unchanged_run_answer_without_importing_pyiceberg(tmp_path: Path, catalog_line: str) -> None:
    root = project(tmp_path, catalog_line)
    with Store.open(load_manifest(root).project.store) as store:
        landed = store.append("sales", SALES)
    before, loaded = probed(root, "--json", "export", "status")
    assert json.loads(before.stdout)[0]["snapshot_id"] is None and not loaded  # no table yet: nothing to load
    published = json.loads(probed(root, "--json", "export", "run")[0].stdout)[0]
    assert published["operation"] == "append" and published["rows"] == 3
    current = iceberg_catalog(root).load_table("bi.out").current_snapshot()  # the oracle: pyiceberg itself
    assert current is not None and current.snapshot_id == published["snapshot_id"]

    status, loaded = probed(root, "--json", "export", "status")
    assert not loaded
    assert json.loads(status.stdout) == [{
        "export": "out", "identifier": "bi.out", "credential": "analysts", "snapshot_id": current.snapshot_id,
        "source": {"kind": "table", "name": "sales", "commit_seq": landed.commit_seq, "build_id": None},
        "rows": 3, "files": 1}]
    text, loaded = probed(root, "export", "status")
    assert not loaded and f"snapshot: {current.snapshot_id}" in text.stdout
    assert f"table sales at commit_seq {landed.commit_seq}" in text.stdout

    again, loaded = probed(root, "export", "run")
    assert not loaded
    assert f"out: unchanged, snapshot {current.snapshot_id} of bi.out" in again.stdout
    assert "nothing published" in again.stdout and "expired" not in again.stdout
    assert [s.snapshot_id for s in iceberg_catalog(root).load_table("bi.out").snapshots()] == [current.snapshot_id]

    # Another writer commits: the recorded state no longer describes the table, so status asks
    # pyiceberg (the source is unknown) and the run exports again.
    iceberg_catalog(root).load_table("bi.out").append(
        pa.table({"region": ["x"], "amount": pa.array([0], pa.int64())}))
    rival = iceberg_catalog(root).load_table("bi.out").current_snapshot()
    assert rival is not None
    status, loaded = probed(root, "--json", "export", "status")
    (doc,) = json.loads(status.stdout)
    assert loaded and (doc["snapshot_id"], doc["source"], doc["rows"]) == (rival.snapshot_id, None, 4)
    redo = json.loads(probed(root, "--json", "export", "run")[0].stdout)[0]
    assert redo["operation"] == "overwrite" and redo["rows"] == 3
    status, loaded = probed(root, "--json", "export", "status")
    assert not loaded and json.loads(status.stdout)[0]["snapshot_id"] == redo["snapshot_id"]

    # A changed source exports, through pyiceberg.
    with Store.open(load_manifest(root).project.store) as store:
        store.append("sales", SALES)
    changed, loaded = probed(root, "--json", "export", "run")
    assert loaded and json.loads(changed.stdout)[0]["rows"] == 6


def test_an_unchanged_run_still_expires_what_retention_no_longer_keeps(tmp_path: Path, catalog_line: str) -> None:
    """The quick answer weighs retention over the recorded snapshots: a tighter ``keep_snapshots``
    with an unchanged source expires (through pyiceberg) at the next run, not never."""
    root = project(tmp_path, catalog_line)
    runs = []
    for _ in range(3):
        with Store.open(load_manifest(root).project.store) as store:
            store.append("sales", SALES)
        runs.append(json.loads(probed(root, "--json", "export", "run")[0].stdout)[0])
    quiet, loaded = probed(root, "--json", "export", "run")
    assert not loaded and json.loads(quiet.stdout)[0]["expired"] == []

    project(tmp_path, catalog_line, "keep_snapshots = 1\n")
    tightened, loaded = probed(root, "--json", "export", "run")
    (doc,) = json.loads(tightened.stdout)
    assert loaded and doc["operation"] == "unchanged"
    assert doc["expired"] == [runs[0]["snapshot_id"], runs[1]["snapshot_id"]]
    assert [s.snapshot_id for s in iceberg_catalog(root).load_table("bi.out").snapshots()] == [runs[2]["snapshot_id"]]
    settled, loaded = probed(root, "--json", "export", "run")
    assert not loaded and json.loads(settled.stdout)[0]["expired"] == []


def test_importing_contextful_and_its_cli_leaves_pyiceberg_unloaded() -> None:
    code = ("import sys, contextful, contextful.engine.cli, contextful.engine.export.run\n"
            "contextful.open_project\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyiceberg'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip() == "[]"
