"""Snapshot retention of export tables (``iceberg.expire``): expired through the catalog, files only
they held deleted after, every retained snapshot still readable; metadata files bounded too.

A real pyiceberg SqlCatalog on a SQLite file with a local warehouse.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from contextful.iceberg.commit import export_table
from contextful.iceberg.expire import Retention, expire_snapshots
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from tests.iceberg.test_commit import IDENT, read, rows


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    cat.create_namespace("exports")
    return cat


def referenced(table: Table) -> set[str]:
    """Manifest lists, manifests and live data files of every snapshot the table holds."""
    found: set[str] = set()
    for snapshot in table.snapshots():
        found.add(snapshot.manifest_list)
        for m in snapshot.manifests(table.io):
            found.add(m.manifest_path)
            found.update(e.data_file.file_path for e in m.fetch_manifest_entry(table.io, discard_deleted=True))
    return found


def on_disk(root: Path, *suffixes: str) -> set[str]:
    return {f"file://{p}" for p in root.rglob("*") if p.suffix in suffixes}


def test_fifteen_exports_keeping_three_leave_three_snapshots_and_only_their_files(
        catalog: SqlCatalog, tmp_path: Path) -> None:
    retention = Retention(keep_snapshots=3)
    ids, expired = [], []
    for n in range(15):
        ids.append(export_table(catalog, IDENT, rows(list(range(n + 1)), f"e{n}")).snapshot_id)
        expired.append(expire_snapshots(catalog, IDENT, retention))
    table = catalog.load_table(IDENT)
    assert [s.snapshot_id for s in table.snapshots()] == ids[-3:]
    assert [e.expired for e in expired] == [()] * 3 + [(i,) for i in ids[:12]]  # one per export from the 4th
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == ids[-1]
    assert on_disk(tmp_path / "wh", ".avro", ".parquet") == referenced(table)
    for n, snapshot_id in zip(range(12, 15), ids[-3:], strict=True):  # time travel to each retained one
        assert read(table, snapshot_id) == rows(list(range(n + 1)), f"e{n}").to_pylist()
    for gone in ids[:12]:
        assert table.snapshot_by_id(gone) is None


def test_expiry_never_removes_the_current_snapshot_or_a_tagged_one(catalog: SqlCatalog, tmp_path: Path) -> None:
    ids = [export_table(catalog, IDENT, rows([n], f"e{n}")).snapshot_id for n in range(4)]
    catalog.load_table(IDENT).manage_snapshots().create_tag(ids[0], "audit").commit()
    # Past any age: everything but the head of main and the tagged snapshot expires.
    far = datetime.now(UTC) + timedelta(days=30)
    result = expire_snapshots(catalog, IDENT, Retention(keep_snapshots=10, max_snapshot_age=timedelta(days=7)),
                              now=far)
    assert result.expired == (ids[1], ids[2])
    table = catalog.load_table(IDENT)
    assert [s.snapshot_id for s in table.snapshots()] == [ids[0], ids[3]]
    assert read(table) == rows([3], "e3").to_pylist()
    assert read(table, ids[0]) == rows([0], "e0").to_pylist()  # the tag's files were kept
    assert on_disk(tmp_path / "wh", ".avro", ".parquet") == referenced(table)
    # Within the age limit nothing more expires.
    assert expire_snapshots(catalog, IDENT, Retention(keep_snapshots=1, max_snapshot_age=timedelta(days=7))
                            ).expired == ()


def test_an_export_table_keeps_a_bounded_number_of_metadata_files(catalog: SqlCatalog, tmp_path: Path) -> None:
    for n in range(8):
        export_table(catalog, IDENT, rows([n], "m"), properties={"write.metadata.previous-versions-max": "2"})
        expire_snapshots(catalog, IDENT, Retention(keep_snapshots=2))
    table = catalog.load_table(IDENT)
    listed = {e.metadata_file for e in table.metadata.metadata_log} | {table.metadata_location}
    assert len(listed) == 3
    assert on_disk(tmp_path / "wh", ".json") == {p if p.startswith("file://") else f"file://{p}" for p in listed}
    assert read(table) == rows([7], "m").to_pylist()


def test_retention_keeps_at_least_one_snapshot() -> None:
    with pytest.raises(ValueError, match="keep_snapshots"):
        Retention(keep_snapshots=0)
