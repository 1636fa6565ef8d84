"""The hand-written Iceberg export commit (``run.export-iceberg.create/overwrite/commit-retry``).

A real pyiceberg SqlCatalog on a SQLite file with a local warehouse. Rival writers are made
deterministic by a catalog wrapper that lands a rival commit just before ours.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.iceberg.commit import MAX_ATTEMPTS, export_table
from contextful.storage.errors import Conflict, ExportCommitConflict
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.update import (
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
)
from pyiceberg.types import LongType

IDENT = "exports.orders"


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    cat.create_namespace("exports")
    return cat


def rows(ids: list[int], tag: str) -> pa.Table:
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": [f"{tag}-{i}" for i in ids],
        "price": pa.array([i * 1.5 for i in ids], pa.float64()),
        "address": pa.array([{"city": f"c{i}", "zip": i} for i in ids],
                            pa.struct([("city", pa.string()), ("zip", pa.int32())])),
        "tags": pa.array([[tag, str(i)] for i in ids], pa.list_(pa.string())),
    })


def read(table: Table, snapshot_id: int | None = None) -> list[dict[str, Any]]:
    got = table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return sorted(got, key=lambda r: r["id"])


def entries(table: Table, snapshot_id: int) -> list[tuple[ManifestEntryStatus, str, int | None]]:
    snapshot = table.snapshot_by_id(snapshot_id)
    assert snapshot is not None
    return [(e.status, e.data_file.file_path, e.snapshot_id)
            for m in snapshot.manifests(table.io) for e in m.fetch_manifest_entry(table.io, discard_deleted=False)]


def assert_no_stray_files(table: Table, root: Path) -> None:
    """Every manifest, manifest list and data file on disk belongs to a committed snapshot."""
    referenced: set[str] = set()
    for snapshot in table.snapshots():
        referenced.add(snapshot.manifest_list)
        for m in snapshot.manifests(table.io):
            referenced.add(m.manifest_path)
            referenced.update(e.data_file.file_path for e in m.fetch_manifest_entry(table.io, discard_deleted=False))
    on_disk = {f"file://{p}" for p in root.rglob("*") if p.suffix in (".avro", ".parquet")}
    assert on_disk == {p if p.startswith("file://") else f"file://{p}" for p in referenced}


class RivalCatalog:
    """The real catalog, except that ``rival`` commits just before each of our next ``times`` commits.

    It also records the requirements of every commit we send.
    """

    def __init__(self, real: SqlCatalog, rival: Callable[[], None], times: int = 1) -> None:
        self._real, self._rival, self._times = real, rival, times
        self.sent: list[tuple[Any, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def commit_table(self, table: Table, requirements: tuple[Any, ...], updates: tuple[Any, ...]) -> Any:
        if self._times > 0:
            self._times -= 1
            self._rival()
        self.sent.append(requirements)
        return self._real.commit_table(table, requirements, updates)


@pytest.mark.clause("run.export-iceberg.create")
@pytest.mark.parametrize("format_version", [1, 2])
def test_first_export_creates_the_table_and_commits_one_append(catalog: SqlCatalog, format_version: int,
                                                               tmp_path: Path) -> None:
    recording = RivalCatalog(catalog, lambda: None, times=0)
    result = export_table(recording, IDENT, rows([1, 2, 3], "a"), format_version=format_version)  # type: ignore[arg-type]

    table = catalog.load_table(IDENT)
    assert table.metadata.format_version == format_version
    assert [s.snapshot_id for s in table.snapshots()] == [result.snapshot_id]
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == result.snapshot_id
    assert snapshot.parent_snapshot_id is None
    assert snapshot.summary is not None and snapshot.summary.operation.value == "append"
    assert (result.operation, result.rows, result.attempts, len(result.files)) == ("append", 3, 1, 1)
    summary = snapshot.summary
    assert (summary["added-data-files"], summary["added-records"], summary["total-records"],
            summary["total-data-files"]) == ("1", "3", "3", "1")
    assert entries(table, result.snapshot_id) == [(ManifestEntryStatus.ADDED, result.files[0], result.snapshot_id)]
    # The commit required that main does not exist yet.
    (requirements,) = recording.sent
    ref = [r for r in requirements if isinstance(r, AssertRefSnapshotId)]
    assert len(ref) == 1 and ref[0].ref == "main" and ref[0].snapshot_id is None
    assert read(table) == rows([1, 2, 3], "a").to_pylist()
    assert_no_stray_files(table, tmp_path / "wh")


@pytest.mark.clause("run.export-iceberg.create")
def test_create_requires_main_absent_so_a_rival_first_commit_turns_ours_into_an_overwrite(
        catalog: SqlCatalog, tmp_path: Path) -> None:
    # The rival's commit lands between our table creation and our commit: our append requiring
    # "main does not exist" fails, and the retry overwrites the rival's snapshot instead.
    rival = RivalCatalog(catalog, lambda: export_table(catalog, IDENT, rows([9], "rival")).snapshot_id)
    result = export_table(rival, IDENT, rows([1, 2], "ours"))  # type: ignore[arg-type]

    table = catalog.load_table(IDENT)
    first, second = table.snapshots()
    assert first.summary is not None and first.summary.operation.value == "append"
    assert result.attempts == 2 and result.operation == "overwrite"
    assert second.snapshot_id == result.snapshot_id and second.parent_snapshot_id == first.snapshot_id
    assert rival.sent[0][1] == AssertRefSnapshotId(ref="main", snapshot_id=None)
    assert read(table) == rows([1, 2], "ours").to_pylist()
    assert_no_stray_files(table, tmp_path / "wh")


@pytest.mark.clause("run.export-iceberg.overwrite")
def test_later_exports_overwrite_every_live_file_of_the_parent(catalog: SqlCatalog, tmp_path: Path) -> None:
    first = export_table(catalog, IDENT, rows([1, 2, 3], "a"))
    # A foreign writer adds a second live file to the parent snapshot: ours must delete it too.
    catalog.load_table(IDENT).append(rows([4], "foreign"))
    parent = catalog.load_table(IDENT).current_snapshot()
    assert parent is not None
    parent_live = {path for status, path, _ in entries(catalog.load_table(IDENT), parent.snapshot_id)
                   if status != ManifestEntryStatus.DELETED}
    assert len(parent_live) == 2

    recording = RivalCatalog(catalog, lambda: None, times=0)
    second = export_table(recording, IDENT, rows([10, 11], "b"))  # type: ignore[arg-type]
    table = catalog.load_table(IDENT)
    snapshot = table.snapshot_by_id(second.snapshot_id)
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite" and snapshot.parent_snapshot_id == parent.snapshot_id
    got = entries(table, second.snapshot_id)
    assert {p for s, p, _ in got if s == ManifestEntryStatus.DELETED} == parent_live
    assert {p for s, p, _ in got if s == ManifestEntryStatus.ADDED} == set(second.files)
    assert all(sid == second.snapshot_id for _, _, sid in got)
    assert not [s for s, _, _ in got if s == ManifestEntryStatus.EXISTING]
    summary = snapshot.summary
    assert {k: summary[k] for k in ("added-data-files", "deleted-data-files", "added-records", "deleted-records",
                                    "total-records", "total-data-files")} == {
        "added-data-files": "1", "deleted-data-files": "2", "added-records": "2", "deleted-records": "4",
        "total-records": "2", "total-data-files": "1"}
    # The requirements sent: the table uuid, main at the parent, the schema id and the spec id.
    (requirements,) = recording.sent
    assert set(map(type, requirements)) == {AssertTableUUID, AssertRefSnapshotId, AssertCurrentSchemaId,
                                            AssertDefaultSpecId}
    by_type = {type(r): r for r in requirements}
    assert by_type[AssertTableUUID].uuid == table.metadata.table_uuid
    assert by_type[AssertRefSnapshotId].ref == "main"
    assert by_type[AssertRefSnapshotId].snapshot_id == parent.snapshot_id
    assert by_type[AssertCurrentSchemaId].current_schema_id == table.metadata.current_schema_id
    assert by_type[AssertDefaultSpecId].default_spec_id == table.metadata.default_spec_id

    third = export_table(catalog, IDENT, rows([20, 21, 22], "c"))
    table = catalog.load_table(IDENT)
    assert read(table) == rows([20, 21, 22], "c").to_pylist()
    assert read(table, first.snapshot_id) == rows([1, 2, 3], "a").to_pylist()
    assert read(table, second.snapshot_id) == rows([10, 11], "b").to_pylist()
    assert [s.parent_snapshot_id for s in table.snapshots()][-1] == second.snapshot_id
    assert third.operation == "overwrite"
    assert_no_stray_files(table, tmp_path / "wh")


@pytest.mark.clause("run.export-iceberg.overwrite")
def test_an_export_of_zero_rows_is_a_valid_overwrite(catalog: SqlCatalog) -> None:
    first = export_table(catalog, IDENT, rows([1, 2], "a"))
    empty = rows([1], "x").slice(0, 0)
    reader = pa.RecordBatchReader.from_batches(empty.schema, [])
    result = export_table(catalog, IDENT, reader)
    table = catalog.load_table(IDENT)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert (result.operation, result.rows, result.files) == ("overwrite", 0, ())
    assert snapshot.parent_snapshot_id == first.snapshot_id
    assert (snapshot.summary["deleted-data-files"], snapshot.summary["deleted-records"],
            snapshot.summary["total-records"], snapshot.summary["total-data-files"]) == ("1", "2", "0", "0")
    assert [s for s, _, _ in entries(table, result.snapshot_id)] == [ManifestEntryStatus.DELETED]
    assert read(table) == []
    assert read(table, first.snapshot_id) == rows([1, 2], "a").to_pylist()


@pytest.mark.clause("run.export-iceberg.commit-retry")
def test_a_rival_commit_makes_the_first_attempt_fail_and_the_retry_win(catalog: SqlCatalog, tmp_path: Path) -> None:
    first = export_table(catalog, IDENT, rows([1], "a"))
    rival_ids: list[int] = []
    rival = RivalCatalog(catalog, lambda: rival_ids.append(export_table(catalog, IDENT, rows([5, 6], "r")).snapshot_id))
    result = export_table(rival, IDENT, rows([7, 8, 9], "ours"))  # type: ignore[arg-type]

    assert result.attempts == 2 and result.operation == "overwrite"
    table = catalog.load_table(IDENT)
    ours = table.snapshot_by_id(result.snapshot_id)
    assert ours is not None and ours.parent_snapshot_id == rival_ids[0]
    # Attempt 1 required main at our first parent; attempt 2 at the rival's snapshot.
    assert [r[1].snapshot_id for r in rival.sent] == [first.snapshot_id, rival_ids[0]]
    # The retry reused the data files written once, and deleted the rival's live file.
    got = entries(table, result.snapshot_id)
    assert {p for s, p, _ in got if s == ManifestEntryStatus.ADDED} == set(result.files)
    rival_files = {p for s, p, _ in entries(table, rival_ids[0]) if s == ManifestEntryStatus.ADDED}
    assert {p for s, p, _ in got if s == ManifestEntryStatus.DELETED} == rival_files
    assert ours.summary is not None and ours.summary["total-records"] == "3"
    assert read(table) == rows([7, 8, 9], "ours").to_pylist()
    assert_no_stray_files(table, tmp_path / "wh")  # the lost attempt's manifests and list are gone


@pytest.mark.clause("run.export-iceberg.commit-retry")
def test_a_schema_change_between_attempts_raises_export_commit_conflict(catalog: SqlCatalog, tmp_path: Path) -> None:
    export_table(catalog, IDENT, rows([1], "a"))

    def evolve() -> None:
        with catalog.load_table(IDENT).update_schema() as update:
            update.add_column("extra", LongType())

    rival = RivalCatalog(catalog, evolve)
    with pytest.raises(ExportCommitConflict) as caught:
        export_table(rival, IDENT, rows([2], "b"))  # type: ignore[arg-type]
    err = caught.value
    assert isinstance(err, Conflict) and err.category == "conflict" and err.exit_code == 5
    assert err.table == IDENT and err.attempts == 1 and "schema id" in err.reason
    assert IDENT in str(err) and "schema id" in str(err)
    table = catalog.load_table(IDENT)
    assert len(table.snapshots()) == 1 and len(rival.sent) == 1
    assert read(table) == [{**r, "extra": None} for r in rows([1], "a").to_pylist()]  # the evolved schema reads it
    assert_no_stray_files(table, tmp_path / "wh")


@pytest.mark.clause("run.export-iceberg.commit-retry")
def test_a_recreated_table_changes_the_uuid_and_raises_export_commit_conflict(catalog: SqlCatalog) -> None:
    export_table(catalog, IDENT, rows([1], "a"))

    def recreate() -> None:
        schema = catalog.load_table(IDENT).schema()
        catalog.drop_table(IDENT)
        catalog.create_table(IDENT, schema)

    with pytest.raises(ExportCommitConflict) as caught:
        export_table(RivalCatalog(catalog, recreate), IDENT, rows([2], "b"))  # type: ignore[arg-type]
    assert "table uuid" in caught.value.reason and caught.value.table == IDENT
    assert catalog.load_table(IDENT).current_snapshot() is None


@pytest.mark.clause("run.export-iceberg.commit-retry")
def test_three_conflicts_in_a_row_raise_export_commit_conflict(catalog: SqlCatalog, tmp_path: Path) -> None:
    export_table(catalog, IDENT, rows([1], "a"))
    rival_ids: list[int] = []
    rival = RivalCatalog(catalog, lambda: rival_ids.append(export_table(catalog, IDENT, rows([len(rival_ids) + 50],
                                                                                            "r")).snapshot_id),
                         times=MAX_ATTEMPTS)
    with pytest.raises(ExportCommitConflict) as caught:
        export_table(rival, IDENT, rows([2, 3], "ours"))  # type: ignore[arg-type]
    assert MAX_ATTEMPTS == 3
    assert caught.value.attempts == 3 and len(rival.sent) == 3 and "rival commit" in caught.value.reason
    table = catalog.load_table(IDENT)
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == rival_ids[-1]
    assert read(table) == rows([52], "r").to_pylist()
    # Nothing of ours stays behind: no manifest, list or data file outside committed snapshots.
    assert_no_stray_files(table, tmp_path / "wh")
