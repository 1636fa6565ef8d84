"""Snapshot retention for exported Iceberg tables: an export table does not grow without bound.

``expire_snapshots(catalog, identifier, Retention(keep_snapshots=10, max_snapshot_age=None))``
picks the snapshots past retention — all but the newest ``keep_snapshots`` in commit order, and,
with ``max_snapshot_age``, any older than that — never the head of ``main`` nor any snapshot a
branch or tag points at. It removes them with one hand-written commit (``RemoveSnapshotsUpdate``,
requiring the table uuid and ``main`` where it was), its outcome learned as the export commit's is
(``iceberg.outcome.send_commit``). Only after that commit landed does it delete the files no
retained snapshot references: the expired snapshots' manifest lists and manifests, and the data and
delete files their manifests name that no retained manifest lists as live. A refused commit (a
rival moved the table) reloads and recomputes, at most ``MAX_ATTEMPTS`` times; then it gives up
quietly and the next export expires. An unknown outcome raises ``CommitOutcomeUnknown`` and deletes
nothing.

The cost is bounded by retention, not history: it reads the manifests of the retained snapshots
and of those it expires, never the whole history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from contextful.iceberg.commit import MAX_ATTEMPTS
from contextful.iceberg.files import delete_files, delete_old_metadata
from contextful.iceberg.outcome import Refusal, send_commit
from contextful.iceberg.retention import Retention, past_retention_ids
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    AssertTableUUID,
    RemoveSnapshotsUpdate,
    TableRequirement,
)
from pyiceberg.typedef import Identifier

__all__ = ["ExpireResult", "Retention", "expire_snapshots", "past_retention"]


@dataclass(frozen=True)
class ExpireResult:
    """What one expiry removed."""

    expired: tuple[int, ...]
    """The snapshot ids removed from the table (empty when none was past retention)."""
    deleted: tuple[str, ...]
    """The files deleted after the removal landed."""


def expire_snapshots(catalog: Catalog, identifier: str | Identifier, retention: Retention, *,
                     now: datetime | None = None) -> ExpireResult:
    """Remove the snapshots of ``identifier`` past ``retention`` and delete the files only they held."""
    now = now or datetime.now(UTC)
    for _ in range(MAX_ATTEMPTS):
        table = catalog.load_table(identifier)
        before = table.metadata
        doomed = past_retention(before, retention, now)
        if not doomed:
            return ExpireResult((), ())
        ids = [s.snapshot_id for s in doomed]
        head = before.refs.get(MAIN_BRANCH)
        requirements: tuple[TableRequirement, ...] = (
            AssertTableUUID(uuid=before.table_uuid),
            AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=head.snapshot_id if head else None),  # type: ignore[call-arg]
        )
        answer = send_commit(catalog, identifier, table, requirements,
                             (RemoveSnapshotsUpdate(snapshot_ids=ids),),  # type: ignore[call-arg]
                             _without(ids), f"removing snapshot(s) {', '.join(map(str, ids))}")
        if not isinstance(answer, Refusal):
            deleted = unreferenced(table.io, doomed, answer)
            delete_files(table.io, deleted)
            delete_old_metadata(table.io, before, answer)
            return ExpireResult(tuple(ids), tuple(deleted))
    return ExpireResult((), ())


def past_retention(metadata: TableMetadata, retention: Retention, now: datetime) -> list[Snapshot]:
    """The snapshots ``retention`` expires, oldest first; never one a branch or tag points at."""
    snapshots = metadata.snapshots  # commit order: every writer appends, removals keep the order
    doomed = set(past_retention_ids([(s.snapshot_id, s.timestamp_ms) for s in snapshots],
                                    (ref.snapshot_id for ref in metadata.refs.values()), retention, now))
    return [s for s in snapshots if s.snapshot_id in doomed]


def unreferenced(io: FileIO, expired: list[Snapshot], after: TableMetadata) -> list[str]:
    """Files the ``expired`` snapshots named that no snapshot of ``after`` references.

    A retained snapshot references its manifest list, its manifests and the live (added or
    existing) files they list; a file it lists only as deleted is not read through it.
    """
    kept: set[str] = set()
    for snapshot in after.snapshots:  # bounded by retention
        kept.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            kept.add(manifest.manifest_path)
            kept.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=True))
    named: set[str] = set()
    for snapshot in expired:
        named.add(snapshot.manifest_list)
        try:
            for manifest in snapshot.manifests(io):
                named.add(manifest.manifest_path)
                named.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=False))
        except FileNotFoundError:
            # A rival expiry removed the same snapshot first and deleted what only it held; the
            # removal does not require the snapshot present, so both land, and its files are gone.
            continue
    return sorted(named - kept)


def _without(ids: list[int]) -> Callable[[TableMetadata], bool]:
    """Whether a table's metadata no longer holds any of ``ids``: how an unheard removal is recognised."""
    return lambda metadata: all(metadata.snapshot_by_id(i) is None for i in ids)
