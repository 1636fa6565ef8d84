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

A table with a supersede rule (``storage.supersede``) folds runs of whole commits only, since the
rule compares commits and the folded part holds every row at its newest part's. The folded part
holds what the run answers (the withheld rows dropped: "the next fold drops the superseded rows");
a unit with rows stored before the run whose run rows the run does not all answer is held — its
rows stay as stored, each in a part at its original position — because a dropped landing of it
may be what retires an older row (:func:`_held_units`; docs/store.md, "Supersede rules").

A table following a root's row versions (``storage.follows``) folds through its rule at the root's
snapshot pinned with it: the folded part holds no row of a version the root no longer answers, and
such a version never wins the root's merge again (docs/store.md, "Lifetime rules").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING

from contextful.storage.catalog import PartRow
from contextful.storage.commits import (
    AddParts,
    AssertPartsLive,
    AssertSchemaId,
    AssertStaging,
    AssertTableUUID,
    CommitRequest,
    PartFile,
    RemoveParts,
)
from contextful.storage.errors import CommitOutcomeUnknown
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import RunManifest, manifest_key, schema_to_text
from contextful.storage.parts import part_key, write_part
from contextful.storage.reconcile import conform
from contextful.storage.snapshot import Snapshot, quote, snapshot_sql, stored_rows_sql
from contextful.storage.staging import StagingLease
from contextful.storage.supersede import Supersede
from contextful.storage.transaction import new_run_id

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from contextful.storage.store import Store
    from contextful.storage.table import Table
else:
    pa = lazy_module("pyarrow")
    duckdb = lazy_module("duckdb")

SMALL_PART_BYTES = 64 * 1024 * 1024
READ_BATCH_ROWS = 256 * 1024


@dataclass(frozen=True)
class FoldResult:
    table: str
    commit_seq: int
    parts_removed: int
    parts_added: int


def fold_groups(parts: list[PartRow], small_bytes: int, min_parts: int, boundary: int = 0,
                whole_commits: bool = False) -> list[list[PartRow]]:
    """Maximal runs of consecutive parts (in merge order) smaller than ``small_bytes``, none holding
    parts on both sides of ``boundary`` (a declaration's commit_seq; 0: none). With
    ``whole_commits``, a part sharing its ``ord_seq`` with a part not smaller counts as not small, so
    no run holds part of a commit (a supersede rule compares commits)."""
    large = {p.ord_seq for p in parts if p.bytes >= small_bytes} if whole_commits else set()
    groups: list[list[PartRow]] = []
    current: list[PartRow] = []
    for part in parts:
        small = part.bytes < small_bytes and part.ord_seq not in large
        crosses = bool(current) and (current[-1].ord_seq < boundary) != (part.ord_seq < boundary)
        if small and not crosses:
            current.append(part)
            continue
        if len(current) >= min_parts:
            groups.append(current)
        current = [part] if small else []
    if len(current) >= min_parts:
        groups.append(current)
    return groups


def fold_table(store: Store, name: str, *, small_bytes: int = SMALL_PART_BYTES, min_parts: int = 2) -> FoldResult | None:
    """Fold the table's small parts at its head; None when there is nothing to fold."""
    table = store.table(name)
    snap = table.snapshot()
    if snap.schema is None:
        return None
    groups = fold_groups(list(snap.parts), small_bytes, min_parts, fold_boundary(snap), snap.supersede is not None)
    return fold_snapshot(store, table, snap, groups)


def fold_boundary(snap: Snapshot) -> int:
    """The commit no fold run may span: the ``order_by`` declaration's (0: none)."""
    return snap.order_by_seq if snap.order_by is not None else 0


def fold_snapshot(store: Store, table: Table, snap: Snapshot, groups: list[list[PartRow]]) -> FoldResult | None:
    """Fold each of ``groups`` (runs of consecutive parts of ``snap``, the table's head, as
    :func:`fold_groups` picks them) into one part, in one ``fold`` commit requiring them still live;
    None when there is no group."""
    name = table.name
    if not groups or snap.schema is None:
        return None
    run_id = "fold-" + new_run_id()
    added: list[PartFile] = []
    removed: list[str] = []
    lease = StagingLease(store, name, run_id)
    con = store.maintenance_duckdb()
    keys = (part_key(name, run_id, index) for index in count())
    try:
        for group in groups:
            lease.renew()
            added.extend(_fold_group(store, con, snap, group, keys))
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
        requirements=(AssertTableUUID(head.uuid), AssertSchemaId(head.schema_id), AssertPartsLive(tuple(removed)),
                      AssertStaging(run_id)),
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


def _fold_group(store: Store, con: duckdb.DuckDBPyConnection, snap: Snapshot, group: list[PartRow],
                keys: Iterator[str]) -> list[PartFile]:
    """The parts replacing ``group``: one at the merge position of its newest part holding what the
    group answers, and, under a supersede rule, the rows of held units (:func:`_held_units`) as
    stored, each in a part at the position of the part it came from."""
    sub = _sub(snap, group, snap.primary_key)
    sql = snapshot_sql(sub, con)
    assert sql is not None
    if snap.supersede is None or not _held_units(con, snap, group, sql):
        return [_write(store, con, snap, sql, next(keys), group[-1])]
    unit_of = _unit_struct(snap.supersede)
    held = f"(SELECT list(u) FROM {HELD})"
    try:
        written = [_write(store, con, snap, f"SELECT * FROM ({sql}) WHERE NOT list_contains({held}, {unit_of(quote)})",
                          next(keys), group[-1])]
        for part in group:
            rows = stored_rows_sql(_sub(snap, [part], snap.primary_key), con,
                                   lambda column: f"list_contains({held}, {unit_of(column)})")
            assert rows is not None
            if con.execute(f"SELECT count(*) FROM ({rows})").fetchall()[0] != (0,):
                written.append(_write(store, con, snap, rows, next(keys), part))
    finally:
        con.execute(f"DROP TABLE {HELD}")
    return written


HELD = "__cf_held"
"""The fold connection's temporary table of held units (:func:`_held_units`)."""


def _held_units(con: duckdb.DuckDBPyConnection, snap: Snapshot, group: list[PartRow], answered: str) -> bool:
    """Fill :data:`HELD` with the units a supersede fold must keep as stored; whether there are any.

    Withholding is decided by commits, and the folded part holds every row at one commit (its
    newest part's), so dropping what the group withholds is exact for a unit with no row stored
    before the group: its rows meet only the group's and later rows, which the answered rows
    meet the same way. A unit with rows before the group is held when the group stores some row
    of it that the group does not answer (a row the key merge or the rule dropped may be what
    retires, or overrides, one of its older rows): its rows stay as they are, where they are. A
    unit the group answers whole folds like any other (nothing of it is dropped, and nothing of
    it withholds anything of it).
    """
    rule = snap.supersede
    assert rule is not None
    first = snap.parts.index(group[0])
    if first == 0:
        return False
    unit_of = _unit_struct(rule)(quote)
    known = " AND ".join(f"{quote(u)} IS NOT NULL" for u in rule.unit)
    stored, before = (snapshot_sql(_sub(snap, parts, ()), con) for parts in (group, list(snap.parts[:first])))
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {HELD} AS"
        f" WITH stored AS (SELECT {unit_of} AS u, count(*) AS n FROM ({stored}) WHERE {known} GROUP BY ALL),"
        f" answered AS (SELECT {unit_of} AS u, count(*) AS n FROM ({answered}) WHERE {known} GROUP BY ALL),"
        f" earlier AS (SELECT DISTINCT {unit_of} AS u FROM ({before}) WHERE {known})"
        f" SELECT stored.u FROM stored LEFT JOIN answered ON stored.u = answered.u"
        f" WHERE coalesce(answered.n, 0) < stored.n AND stored.u IN (SELECT u FROM earlier)")
    found = con.execute(f"SELECT count(*) FROM {HELD}").fetchall()[0]
    if found == (0,):
        con.execute(f"DROP TABLE {HELD}")
        return False
    return True


def _unit_struct(rule: Supersede) -> Callable[[Callable[[str], str]], str]:
    """A unit's value as one struct, from a map of column name to expression."""
    return lambda column: "struct_pack(" + ", ".join(f"u{i} := {column(u)}" for i, u in enumerate(rule.unit)) + ")"


def _sub(snap: Snapshot, parts: list[PartRow], primary_key: tuple[str, ...]) -> Snapshot:
    """``snap`` reading only ``parts`` (consecutive in merge order, on one side of a declaration)."""
    positions = [snap.parts.index(p) for p in parts]
    before_declaration = parts[-1].ord_seq < snap.order_by_seq  # the whole run is on one side
    return Snapshot(
        table=snap.table, commit_seq=snap.commit_seq, schema=snap.schema, primary_key=primary_key,
        parts=tuple(parts), uris=tuple(snap.uris[i] for i in positions),
        mixed_schemas=any(p.schema_id != snap.schema_id for p in parts), schema_id=snap.schema_id,
        order_by=None if before_declaration else snap.order_by,
        supersede=snap.supersede if primary_key else None,
        follows=snap.follows if primary_key else None, root=snap.root if primary_key else None,
    )


def _write(store: Store, con: duckdb.DuckDBPyConnection, snap: Snapshot, sql: str, key: str,
           position: PartRow) -> PartFile:
    """Write what ``sql`` answers as one part at ``key``, merging at ``position``'s place."""
    assert snap.schema is not None
    reader = con.sql(sql).to_arrow_reader(READ_BATCH_ROWS)
    schema = snap.schema

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            yield from conform(pa.Table.from_batches([batch]), schema, snap.table).to_batches()

    try:
        part = write_part(store.objects, key, batches(), schema, durable=store.durable)
    finally:
        reader.close()
    return PartFile(part.path, part.rows, part.bytes, ord_seq=position.ord_seq, ord_idx=position.ord_idx)
