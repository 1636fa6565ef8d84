"""Two processes exporting one Iceberg table at once: every export ends committed in some order or
raises ExportCommitConflict after its attempts; the metadata stays readable and no live file is
lost. On a SQLite and on a PostgreSQL catalog."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog

EXPORTER = r"""
import json, sys
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from contextful.iceberg.commit import export_table
from contextful.iceberg.expire import Retention, expire_snapshots
from contextful.storage.errors import ExportCommitConflict

name, uri, warehouse, writer, rounds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
keep = int(sys.argv[6])  # 0: no retention
catalog = SqlCatalog(name, uri=uri, warehouse=warehouse)
outcomes = []
for r in range(rounds):
    data = pa.table({"writer": [writer] * 50, "round": [r] * 50, "n": list(range(50))})
    try:
        result = export_table(catalog, "exports.shared", data)
        outcomes.append({"round": r, "snapshot": result.snapshot_id, "attempts": result.attempts})
    except ExportCommitConflict as exc:
        outcomes.append({"round": r, "conflict": str(exc)})
    if keep:
        expire_snapshots(catalog, "exports.shared", Retention(keep_snapshots=keep))
print(json.dumps(outcomes))
"""


def _race(name: str, uri: str, warehouse: str, rounds: int = 6, keep: int = 0) -> list[list[dict[str, object]]]:
    catalog = SqlCatalog(name, uri=uri, warehouse=warehouse)
    catalog.create_namespace("exports")
    procs = [subprocess.Popen([sys.executable, "-c", EXPORTER, name, uri, warehouse, w, str(rounds), str(keep)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in ("a", "b")]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def _check(name: str, uri: str, warehouse: str, outs: list[list[dict[str, object]]]) -> None:
    catalog = SqlCatalog(name, uri=uri, warehouse=warehouse)
    table = catalog.load_table("exports.shared")
    committed = {o["snapshot"] for out in outs for o in out if "snapshot" in o}
    assert committed, "no export committed"
    history = {s.snapshot_id for s in table.metadata.snapshots}
    assert committed <= history  # every export that answered committed is in the table's history
    current = table.current_snapshot()
    assert current is not None
    for task in table.scan().plan_files():  # no live file lost
        assert Path(task.file.file_path.removeprefix("file://")).exists()
    rows = table.scan().to_arrow().to_pylist()
    assert len(rows) == 50 and len({(r["writer"], r["round"]) for r in rows}) == 1  # one export's rows, whole
    chain = []
    snapshot = current
    while snapshot is not None:  # the main chain is linear and every snapshot on it readable
        chain.append(snapshot.snapshot_id)
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    assert set(chain) == history and len(chain) == len(history)


def test_two_processes_exporting_one_table_on_a_sqlite_catalog(tmp_path: Path) -> None:
    uri, warehouse = f"sqlite:///{tmp_path / 'catalog.db'}", f"file://{tmp_path / 'wh'}"
    outs = _race("race", uri, warehouse)
    _check("race", uri, warehouse, outs)


@pytest.mark.postgres
def test_two_processes_exporting_one_table_on_a_postgres_catalog(tmp_path: Path, pg_dsn: str) -> None:
    parts = dict(item.split("=", 1) for item in pg_dsn.split())
    uri = f"postgresql+psycopg://{parts.get('user', 'postgres')}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    name = f"race_{uuid.uuid4().hex[:8]}"  # the catalog name keys its rows: tests share nothing
    warehouse = f"file://{tmp_path / 'wh'}"
    outs = _race(name, uri, warehouse)
    _check(name, uri, warehouse, outs)


def test_two_processes_exporting_and_expiring_one_table_lose_no_retained_file(tmp_path: Path) -> None:
    """Each export is followed by an expiry keeping 2 snapshots: expiries race exports and each other,
    yet every retained snapshot stays whole and nothing unreferenced stays on disk."""
    uri, warehouse = f"sqlite:///{tmp_path / 'catalog.db'}", f"file://{tmp_path / 'wh'}"
    outs = _race("retained", uri, warehouse, keep=2)
    assert any("snapshot" in o for out in outs for o in out)
    table = SqlCatalog("retained", uri=uri, warehouse=warehouse).load_table("exports.shared")
    assert 1 <= len(table.snapshots()) <= 3  # the last expiry may have run before the other's last export
    referenced: set[str] = set()
    for snapshot in table.snapshots():
        rows = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
        assert len(rows) == 50 and len({(r["writer"], r["round"]) for r in rows}) == 1  # whole and readable
        referenced.add(snapshot.manifest_list)
        for m in snapshot.manifests(table.io):
            referenced.add(m.manifest_path)
            referenced.update(e.data_file.file_path
                              for e in m.fetch_manifest_entry(table.io, discard_deleted=True))
    on_disk = {f"file://{p}" for p in (tmp_path / "wh").rglob("*") if p.suffix in (".avro", ".parquet")}
    assert on_disk == referenced
