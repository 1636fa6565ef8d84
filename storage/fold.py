"""Folds: compact runs of small parts into one, resolving keys, without changing any answer.

A fold picks maximal runs of consecutive small live parts in merge order, reads each run through
the same snapshot SQL readers use (so a keyed table keeps only each key's winner of the run), writes
one part, and commits it as a ``fold`` that removes the parts it absorbed. The new part takes the
merge position of the newest part it absorbed; because the absorbed parts were consecutive, every
other part keeps its place before or after it, and the head answers exactly what it answered before.
Older snapshots still read the absorbed parts until collection passes retention.

A key's winner over a run of parts stands for the whole run only under one merge rule, so a run
never spans an ``order_by`` declaration: the parts merged before it fold by commit order (their
rows count only through that winner from the declaration on), the parts after it by ``order_by``.
Each rule keeps the run's winner whatever comes before or after the run, and no later declaration
can prefer a row a fold dropped (docs/store.md), so every later snapshot answers what the unfolded
table would.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
from contextful.storage.catalog import PartRow
from contextful.storage.commits import (
    AddParts,
    AssertPartsLive,
    AssertSchemaId,
    AssertTableUUID,
    CommitRequest,
    PartFile,
    RemoveParts,
)
from contextful.storage.errors import CommitOutcomeUnknown
from contextful.storage.manifest import RunManifest, manifest_key, schema_to_text
from contextful.storage.parts import part_key, write_part
from contextful.storage.reconcile import conform
from contextful.storage.snapshot import Snapshot, snapshot_sql
from contextful.storage.staging import StagingLease
from contextful.storage.transaction import new_run_id

if TYPE_CHECKING:
    from contextful.storage.store import Store

SMALL_PART_BYTES = 64 * 1024 * 1024
READ_BATCH_ROWS = 256 * 1024


@dataclass(frozen=True)
class FoldResult:
    table: str
    commit_seq: int
    parts_removed: int
    parts_added: int


def fold_groups(parts: list[PartRow], small_bytes: int, min_parts: int, boundary: int = 0) -> list[list[PartRow]]:
    """Maximal runs of consecutive parts (in merge order) smaller than ``small_bytes``, none holding
    parts on both sides of ``boundary`` (a declaration's commit_seq; 0: none)."""
    groups: list[list[PartRow]] = []
    current: list[PartRow] = []
    for part in parts:
        crosses = bool(current) and (current[-1].ord_seq < boundary) != (part.ord_seq < boundary)
        if part.bytes < small_bytes and not crosses:
            current.append(part)
            continue
        if len(current) >= min_parts:
            groups.append(current)
        current = [part] if part.bytes < small_bytes else []
    if len(current) >= min_parts:
        groups.append(current)
    return groups


def fold_table(store: Store, name: str, *, small_bytes: int = SMALL_PART_BYTES, min_parts: int = 2) -> FoldResult | None:
    """Fold the table's small parts at its head; None when there is nothing to fold."""
    table = store.table(name)
    snap = table.snapshot()
    if snap.schema is None:
        return None
    boundary = snap.order_by_seq if snap.order_by is not None else 0
    groups = fold_groups(list(snap.parts), small_bytes, min_parts, boundary)
    if not groups:
        return None
    run_id = "fold-" + new_run_id()
    added: list[PartFile] = []
    removed: list[str] = []
    lease = StagingLease(store, name, run_id)
    con = store.duckdb()
    try:
        for index, group in enumerate(groups):
            lease.renew()
            part = _fold_group(store, con, snap, group, part_key(name, run_id, index))
            added.append(PartFile(part.path, part.rows, part.bytes,
                                  ord_seq=group[-1].ord_seq, ord_idx=group[-1].ord_idx))
            removed.extend(p.path for p in group)
    finally:
        con.close()
    head = table.head
    manifest = RunManifest(table=name, table_uuid=head.uuid, run_id=run_id, kind="fold", parts=tuple(added),
                           landed_schema=schema_to_text(snap.schema), created_us=store.clock.now_us(),
                           meta={"folded": removed})
    key = manifest_key(name, run_id)
    store.objects.put_bytes(key, manifest.dumps(), durable=store.durable)
    request = CommitRequest(
        table=name, run_id=run_id, kind="fold", manifest=key,
        requirements=(AssertTableUUID(head.uuid), AssertSchemaId(head.schema_id), AssertPartsLive(tuple(removed))),
        updates=(RemoveParts(tuple(removed)), AddParts(tuple(added))),
        rows=sum(p.rows for p in added),
    )
    try:
        seq = store.catalog.commit(request, store.clock)
    except CommitOutcomeUnknown:
        raise  # it may have landed: its parts stay, and the lease keeps collection away
    except BaseException:
        store.objects.delete([p.path for p in added] + [key])
        lease.end()
        raise
    table.refresh()
    return FoldResult(name, seq, len(removed), len(added))


def _fold_group(store: Store, con: duckdb.DuckDBPyConnection, snap: Snapshot, group: list[PartRow], key: str) -> PartFile:
    positions = [snap.parts.index(p) for p in group]
    before_declaration = group[-1].ord_seq < snap.order_by_seq  # the whole group is on one side
    sub = Snapshot(
        table=snap.table, commit_seq=snap.commit_seq, schema=snap.schema, primary_key=snap.primary_key,
        parts=tuple(group), uris=tuple(snap.uris[i] for i in positions),
        mixed_schemas=any(p.schema_id != snap.schema_id for p in group), schema_id=snap.schema_id,
        order_by=None if before_declaration else snap.order_by,
    )
    sql = snapshot_sql(sub, con)
    assert sql is not None and snap.schema is not None
    reader = con.sql(sql).to_arrow_reader(READ_BATCH_ROWS)
    schema = snap.schema

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            yield from conform(pa.Table.from_batches([batch]), schema, snap.table).to_batches()

    return write_part(store.objects, key, batches(), schema, durable=store.durable)
