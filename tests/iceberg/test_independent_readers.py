"""Independent Iceberg readers, not ours, read what an export committed: pyiceberg's own scan and
DuckDB's iceberg extension (PyPI ``duckdb-extension-iceberg`` with ``duckdb-extension-avro``, which
pin a DuckDB of their own, so they run in a virtual environment this test builds), including every
snapshot snapshot retention kept."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.iceberg.commit import export_table
from contextful.iceberg.expire import Retention, expire_snapshots
from pyiceberg.catalog.sql import SqlCatalog

READER = r"""
import glob, json, sys
import duckdb
site, metadata, snapshot = sys.argv[1], sys.argv[2], sys.argv[3]
con = duckdb.connect()
for name in ("avro", "iceberg"):
    (path,) = glob.glob(f"{site}/duckdb_extension_{name}/extensions/*/{name}.duckdb_extension")
    con.execute(f"LOAD '{path}'")
extra = f", snapshot_from_id={int(snapshot)}" if snapshot != "-" else ""
rows = con.execute(f"SELECT * FROM iceberg_scan('{metadata}'{extra}) ORDER BY id").fetchall()
print(json.dumps([list(r) for r in rows], default=str))
"""


@pytest.fixture(scope="module")
def duckdb_iceberg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A virtual environment holding DuckDB's iceberg and avro extensions: (python, site-packages)."""
    venv = tmp_path_factory.mktemp("duckdb-iceberg-venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "duckdb-extension-iceberg", "duckdb-extension-avro"], check=True, timeout=600)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    yield python, site


def duckdb_rows(reader: tuple[Path, Path], metadata: str, snapshot: int | None = None) -> list[list[object]]:
    python, site = reader
    out = subprocess.run([str(python), "-c", READER, str(site), metadata, str(snapshot) if snapshot else "-"],
                         check=True, capture_output=True, text=True, timeout=120)
    rows: list[list[object]] = json.loads(out.stdout)
    return rows


def test_pyiceberg_and_duckdb_read_exactly_the_latest_export_and_time_travel(
        tmp_path: Path, duckdb_iceberg: tuple[Path, Path]) -> None:
    catalog = SqlCatalog("readers", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    catalog.create_namespace("exports")
    exports = [
        pa.table({"id": [1, 2, 3], "name": ["a", "b", None], "score": [1.5, None, 3.25]}),
        pa.table({"id": [4, 5], "name": ["d", "é"], "score": [4.0, 5.5]}),
        pa.table({"id": [6], "name": ["f"], "score": [None]}, schema=pa.schema(
            [("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])),
    ]
    snapshots = []
    for data in exports:
        snapshots.append(export_table(catalog, "exports.scores", data).snapshot_id)
        table = catalog.load_table("exports.scores")
        expected = sorted(data.to_pylist(), key=lambda r: r["id"])
        assert sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == expected  # (a) pyiceberg
        got = duckdb_rows(duckdb_iceberg, table.metadata_location)  # (b) DuckDB's iceberg extension
        assert got == [[r["id"], r["name"], r["score"]] for r in expected]
    table = catalog.load_table("exports.scores")
    first = sorted(exports[0].to_pylist(), key=lambda r: r["id"])
    assert sorted(table.scan(snapshot_id=snapshots[0]).to_arrow().to_pylist(), key=lambda r: r["id"]) == first
    assert duckdb_rows(duckdb_iceberg, table.metadata_location, snapshots[0]) == \
        [[r["id"], r["name"], r["score"]] for r in first]


def test_duckdb_reads_every_snapshot_retention_kept(tmp_path: Path, duckdb_iceberg: tuple[Path, Path]) -> None:
    catalog = SqlCatalog("kept", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    catalog.create_namespace("exports")
    ids = []
    for n in range(15):
        data = pa.table({"id": list(range(n + 1)), "name": [f"e{n}"] * (n + 1), "score": [float(n)] * (n + 1)})
        ids.append(export_table(catalog, "exports.kept", data).snapshot_id)
        expire_snapshots(catalog, "exports.kept", Retention(keep_snapshots=3))
    table = catalog.load_table("exports.kept")
    assert [s.snapshot_id for s in table.snapshots()] == ids[-3:]
    for n, snapshot_id in zip(range(12, 15), ids[-3:], strict=True):
        expected = [[i, f"e{n}", float(n)] for i in range(n + 1)]
        assert duckdb_rows(duckdb_iceberg, table.metadata_location, snapshot_id) == expected
        got = table.scan(snapshot_id=snapshot_id).to_arrow().sort_by("id").to_pylist()
        assert [[r["id"], r["name"], r["score"]] for r in got] == expected
    assert duckdb_rows(duckdb_iceberg, table.metadata_location) == [[i, "e14", 14.0] for i in range(15)]
