"""Folds: compact runs of small parts into one, resolving keys, without changing any answer.

A fold picks maximal runs of consecutive small live parts in merge order, made of whole commits
(every part of a commit, or none: :func:`commits_of`), reads each run through the same snapshot SQL
readers use (so a keyed table keeps only each key's winner of the run), writes one part, and commits
it as a ``fold`` that removes the parts it absorbed. The new part takes the merge position of the
newest part it absorbed; because the absorbed parts were consecutive, every other part keeps its
place before or after it, and the head answers exactly what it answered before. Older snapshots
still read the absorbed parts until collection passes retention. A fold that would change nothing
(no row dropped, no fewer parts) commits nothing.

Whole commits: the folded part holds every row at one commit, its newest part's. Were part of a
commit folded with older commits, their landings would become level with the rest of that commit
(or the part would move past it), and a supersede rule, which compares commits, would answer
otherwise; :func:`check_whole` refuses such a group wherever it comes from (automatic compaction
cuts its stretches by commit, too).

A key's winner over a run of parts stands for the whole run only under one merge rule, so a run
never spans an ``order_by`` declaration: the parts merged before it fold by commit order (their
rows count only through that winner from the declaration on), the parts after it by ``order_by``.
Each rule keeps the run's winner whatever comes before or after the run, and no later declaration
can prefer a row a fold dropped (docs/store.md), so every later snapshot answers what the unfolded
table would.

Under a supersede rule (``storage.supersede``) the folded part holds what the run answers (the
withheld rows dropped: "the next fold drops the superseded rows"), except the rows of *held*
units, which stay as stored, each in a part at its original position: a unit is held when a row
stored before the run, answered by the table without the run, is hidden by a row the fold would
drop (the only record of a landing that retires it, or of its primary key) and by nothing the
fold keeps (:func:`_held_units`; docs/store.md, "What a fold drops"). That decision reads the
parts outside the run, so the runs of one fold are decided one after another, each on the table the
others' folds leave (:func:`_refolded`), and the commit requires every part read still live.

A table following a root's row versions (``storage.follows``) folds through its rule at the root's
snapshot pinned with it: the folded part holds no row of a version the root no longer answers, and
such a version never wins the root's merge again (docs/store.md, "Lifetime rules").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
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
from contextful.storage.manifest import RunManifest, place_manifest, schema_to_text
from contextful.storage.parts import part_key, write_part
from contextful.storage.reconcile import conform
from contextful.storage.snapshot import Snapshot, Where, quote, snapshot_sql, stored_rows_sql
from contextful.storage.staging import StagingLease
from contextful.storage.supersede import Supersede, open_marker, settling
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


@dataclass(frozen=True)
class FoldProgress:
    """How far a fold is: reported as each batch of a folded part is written and as each group ends."""

    table: str
    parts: int
    """Parts taken by the groups folded so far."""
    parts_total: int
    """Parts the fold takes."""
    rows: int
    """Rows written so far."""
    rows_total: int
    """Rows the parts taken hold (a fold writes fewer where a key's newer row replaces an older one)."""


@dataclass
class _Tally:
    progress: Callable[[FoldProgress], None]
    table: str
    parts_total: int
    rows_total: int
    parts: int = 0
    rows: int = 0

    def report(self) -> None:
        self.progress(FoldProgress(self.table, self.parts, self.parts_total, self.rows, self.rows_total))


def commits_of(parts: list[PartRow]) -> list[list[PartRow]]:
    """``parts`` (live, in merge order) cut into commits: the runs of consecutive parts sharing a
    merge position ``ord_seq`` (a commit's parts, or what folds left at its position). A fold takes
    these whole: every fold group is a run of them (:func:`fold_groups`, :func:`check_whole`)."""
    commits: list[list[PartRow]] = []
    for part in parts:
        if commits and commits[-1][0].ord_seq == part.ord_seq:
            commits[-1].append(part)
        else:
            commits.append([part])
    return commits


def fold_groups(parts: list[PartRow], small_bytes: int, min_parts: int, boundary: int = 0) -> list[list[PartRow]]:
    """Maximal runs of consecutive commits (:func:`commits_of`, in merge order) whose every part is
    smaller than ``small_bytes``, holding ``min_parts`` parts or more, none holding commits on both
    sides of ``boundary`` (a declaration's commit_seq; 0: none). A commit with a part too large to
    fold stays out whole, so no run holds part of a commit."""
    groups: list[list[PartRow]] = []
    current: list[PartRow] = []
    for commit in commits_of(parts):
        small = all(p.bytes < small_bytes for p in commit)
        crosses = bool(current) and (current[-1].ord_seq < boundary) != (commit[0].ord_seq < boundary)
        if small and not crosses:
            current.extend(commit)
            continue
        if len(current) >= min_parts:
            groups.append(current)
        current = list(commit) if small else []
    if len(current) >= min_parts:
        groups.append(current)
    return groups


def check_whole(snap: Snapshot, group: list[PartRow]) -> None:
    """Refuse a group holding some but not all of a commit's live parts (ValueError: a caller's
    defect, never a user's). A folded part lands at its group's newest merge position, so part of a
    commit folded with older commits would bring their landings level with the rest of that commit
    (or move the part past it), and a supersede rule, which compares commits, would answer otherwise."""
    seqs = {p.ord_seq for p in group}
    paths = {p.path for p in group}
    left = [p.path for p in snap.parts if p.ord_seq in seqs and p.path not in paths]
    if left:
        raise ValueError(f"a fold of {snap.table} takes every part of a commit or none; it left {left}")


def fold_table(store: Store, name: str, *, small_bytes: int = SMALL_PART_BYTES, min_parts: int = 2,
               progress: Callable[[FoldProgress], None] | None = None) -> FoldResult | None:
    """Fold the table's small parts at its head; None when there is nothing to fold (no group, or
    no group whose fold would drop a row or leave fewer parts). ``progress`` is told as the fold
    writes (:class:`FoldProgress`)."""
    table = store.table(name)
    snap = table.snapshot()
    if snap.schema is None:
        return None
    groups = fold_groups(list(snap.parts), small_bytes, min_parts, fold_boundary(snap.order_by, snap.order_by_seq))
    return fold_snapshot(store, table, snap, groups, progress)


def fold_boundary(order_by: str | None, order_by_seq: int) -> int:
    """The commit no fold run may span: the declaration's of ``order_by`` in force (0: none)."""
    return order_by_seq if order_by is not None else 0


@dataclass
class _Folded:
    """What folding the groups wrote so far, and what the commit must require and remove."""

    added: list[PartFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)
    """Every live part a group's decision read: the commit requires each still live."""


def fold_snapshot(store: Store, table: Table, snap: Snapshot, groups: list[list[PartRow]],
                  progress: Callable[[FoldProgress], None] | None = None) -> FoldResult | None:
    """Fold each of ``groups`` (runs of whole commits of ``snap``, the table's head, as
    :func:`fold_groups` picks them) into one part, in one ``fold`` commit requiring every part it read
    still live; None when there is no group or no group's fold changes anything: one that would
    drop no row and leave as many parts as it took commits nothing."""
    name = table.name
    if not groups or snap.schema is None:
        return None
    for group in groups:
        check_whole(snap, group)
    run_id = "fold-" + new_run_id()
    folded = _Folded()
    lease = StagingLease(store, name, run_id)
    con = store.maintenance_duckdb()
    keys = (part_key(name, run_id, index) for index in count())
    current = snap  # the table as the groups folded so far leave it
    tally = None if progress is None else _Tally(progress, name, sum(len(g) for g in groups),
                                                 sum(p.rows for g in groups for p in g))
    try:
        for group in reversed(groups):  # each decided on the table the newer groups' folds leave
            lease.renew()
            kept = _fold_group(store, con, current, group, keys, folded, tally)
            if tally is not None:
                tally.parts += len(group)
                tally.report()
            if kept is not None and snap.supersede is not None:
                current = _refolded(store, current, group, kept)
    except BaseException:
        store.objects.delete([p.path for p in folded.added])
        lease.end()
        raise
    finally:
        con.close()
    if not folded.removed:
        lease.end()
        return None
    read = folded.read & {p.path for p in snap.parts}  # what the table held: the commit requires it live
    head = table.head
    manifest = RunManifest(table=name, table_uuid=head.uuid, run_id=run_id, kind="fold", parts=tuple(folded.added),
                           landed_schema=schema_to_text(snap.schema), created_us=store.clock.now_us(),
                           meta={"folded": folded.removed})
    key, doc = place_manifest(store.objects, manifest, store.durable, store.inline_manifest_bytes)
    request = CommitRequest(
        table=name, run_id=run_id, kind="fold", manifest=key, manifest_doc=doc,
        requirements=(AssertTableUUID(head.uuid), AssertSchemaId(head.schema_id),
                      AssertPartsLive(tuple(sorted(read | set(folded.removed)))), AssertStaging(run_id)),
        updates=(RemoveParts(tuple(folded.removed)), AddParts(tuple(folded.added))),
        rows=sum(p.rows for p in folded.added),
    )
    try:
        seq = store.catalog.commit(request, store.clock)
    except CommitOutcomeUnknown:
        lease.release()  # it may have landed: its parts stay until collection settles the run
        raise
    except BaseException:
        store.objects.delete([p.path for p in folded.added] + [key])
        lease.end()
        raise
    lease.release()  # the commit ended it
    table.refresh()
    return FoldResult(name, seq, len(folded.removed), len(folded.added))


def _refolded(store: Store, snap: Snapshot, group: list[PartRow], kept: list[PartFile]) -> Snapshot:
    """``snap`` with ``group`` replaced by the parts its fold wrote (``kept``, not yet committed).

    A supersede fold's decision reads the parts outside its group, so the groups of one fold are
    decided one after another, each on the table the others' folds leave: two groups decided on the
    same table could each drop a landing the other's kept a row withheld by, and together revive it.
    """
    taken = {p.path for p in group}
    written = []
    for f in kept:
        assert f.ord_seq is not None  # a folded part keeps the merge position of a part it replaces
        written.append(PartRow(path=f.path, rows=f.rows, bytes=f.bytes, added_seq=snap.commit_seq + 1,
                               removed_seq=None, ord_seq=f.ord_seq, ord_idx=f.ord_idx, collected_us=None,
                               schema_id=snap.schema_id))
    located = [(p, uri) for p, uri in zip(snap.parts, snap.uris) if p.path not in taken]
    located += [(p, store.objects.uri(p.path)) for p in written]
    located.sort(key=lambda pu: (pu[0].ord_seq, pu[0].ord_idx))
    return replace(snap, parts=tuple(p for p, _ in located), uris=tuple(uri for _, uri in located))


def _fold_group(store: Store, con: duckdb.DuckDBPyConnection, snap: Snapshot, group: list[PartRow],
                keys: Iterator[str], folded: _Folded, tally: _Tally | None = None) -> list[PartFile] | None:
    """Fold ``group`` into ``folded``: one part at the merge position of its newest part holding what
    the group answers, and, under a supersede rule, the rows of held units (:func:`_held_units`) as
    stored, each in a part at the position of the part it came from. The parts written, or None for
    a group whose parts would come back with the same rows and no fewer parts: it is left as it is."""
    sub = _sub(snap, group, snap.primary_key)
    sql = snapshot_sql(sub, con)
    assert sql is not None
    written: list[PartFile] = []
    try:
        if snap.supersede is None or not _held_units(con, snap, group, sql, folded.read):
            written.append(_write(store, con, snap, sql, next(keys), group[-1], tally))
        else:
            unit_of = _unit_struct(snap.supersede)
            held = f"(SELECT list(u) FROM {HELD})"
            try:
                written.append(_write(store, con, snap,
                                      f"SELECT * FROM ({sql}) WHERE NOT list_contains({held}, {unit_of(quote)})",
                                      next(keys), group[-1], tally))
                for part in group:
                    rows = stored_rows_sql(_sub(snap, [part], snap.primary_key), con,
                                           lambda column: f"list_contains({held}, {unit_of(column)})")
                    assert rows is not None
                    written.append(_write(store, con, snap, rows, next(keys), part, tally))
            finally:
                con.execute(f"DROP TABLE {HELD}")
    except BaseException:
        store.objects.delete([p.path for p in written])
        raise
    empty = [p for p in written if not p.rows]
    kept = [p for p in written if p.rows]
    unchanged = sum(p.rows for p in kept) == sum(p.rows for p in group) and len(kept) >= len(group)
    store.objects.delete([p.path for p in (written if unchanged else empty)])
    folded.read.update(p.path for p in group)
    if unchanged:
        return None
    folded.added.extend(kept)
    folded.removed.extend(p.path for p in group)
    return kept


HELD = "__cf_held"
"""The fold connection's temporary table of held units (:func:`_held_units`)."""
STORED, ANSWERED, CANDIDATES = "__cf_g_stored", "__cf_g_answered", "__cf_g_candidates"
"""The fold connection's temporary tables: the group's stored and answered rows of known units
(unit, primary key, derivation key, whether the row settles), and the units whose facts the fold
would lose (:func:`_held_units`)."""


def _held_units(con: duckdb.DuckDBPyConnection, snap: Snapshot, group: list[PartRow], answered: str,
                read: set[str]) -> bool:
    """Fill :data:`HELD` with the units a supersede fold must keep as stored; whether there are any.
    ``read`` gains every part the decision read beyond the group.

    The folded part holds what the group answers, every row at one commit (the group's newest); its
    rows meet later rows and landings exactly as the group's did (they are all earlier than those,
    and nothing of the group withholds or overrides an answered row of the group). So the fold is
    exact for every row outside the group after it, and for every unit with no row before it. A row
    stored *before* the group is hidden by the group when a group row shares its primary key, or
    when the group settled its unit under another key (under any key, for a marker that did not
    settle); the rule's facts are landings, and a dropped row may be the only record of one. Such a
    row's answer changes if the group hides it and the folded part does not, unless the rows outside
    the group hide it anyway (it is not answered by the table without the group): whatever lands
    later, it is then hidden in both tables or neither. A unit with such a row is held: its rows of
    the group stay as stored, where they are, and a later fold (one that takes that older row too,
    or after something else hid it) drops them. The rows before the group are read only for the
    units whose facts the group's answer loses (a settling key, or a primary key, it stores but
    does not answer).
    """
    rule = snap.supersede
    assert rule is not None
    first = snap.parts.index(group[0])
    if first == 0:
        return False
    unit = _unit_struct(rule)
    known = " AND ".join(f"{quote(u)} IS NOT NULL" for u in rule.unit)
    key_of = _key_struct(snap)
    facts = (f"SELECT {unit(quote)} AS u, {key_of} AS p, struct_pack(v := {quote(rule.key)}) AS k,"  # nulls compare
             f" coalesce({settling(quote(rule.status))}, false) AS s,"
             f" coalesce({open_marker(rule, quote)}, false) AS m")
    stored = snapshot_sql(_sub(snap, group, ()), con)
    try:
        for table, rows in ((STORED, stored), (ANSWERED, answered)):
            con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {facts} FROM ({rows}) WHERE {known}")
        con.execute(f"CREATE OR REPLACE TEMP TABLE {CANDIDATES} AS"
                    f" SELECT u FROM (SELECT u, k FROM {STORED} WHERE s EXCEPT SELECT u, k FROM {ANSWERED} WHERE s)"
                    f" UNION SELECT u FROM (SELECT u, p FROM {STORED} EXCEPT SELECT u, p FROM {ANSWERED})")
        if con.execute(f"SELECT count(*) FROM {CANDIDATES}").fetchall()[0] == (0,):
            return False
        before = list(snap.parts[:first])
        after = list(snap.parts[first + len(group):])
        candidate: Where = lambda column: f"{unit(column)} IN (SELECT u FROM {CANDIDATES})"
        outside = snapshot_sql(_sub(snap, before + after, snap.primary_key), con, candidate)
        assert outside is not None
        later = stored_rows_sql(_sub(snap, after, ()), con, candidate) if after else None
        read.update(p.path for p in before + after)
        # The rows before the group that the table without it answers: its answer, less the keys
        # whose winner is after the group (those rows are answered there, and the group hides none).
        rows_before = f"SELECT * FROM ({outside})"
        if later is not None:
            rows_before += f" WHERE NOT coalesce({key_of} IN (SELECT {key_of} FROM ({later})), false)"
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {HELD} AS"
            f" WITH x AS ({facts} FROM ({rows_before}) WHERE {known}),"
            f" {_settled_keys('sk', STORED)}, {_settled_keys('ak', ANSWERED)}"
            f" SELECT DISTINCT x.u FROM x LEFT JOIN sk ON sk.u = x.u LEFT JOIN ak ON ak.u = x.u"
            f" WHERE ({_hides('sk', STORED)}) AND NOT ({_hides('ak', ANSWERED)})")
    finally:
        con.execute(f"DROP TABLE IF EXISTS {STORED}; DROP TABLE IF EXISTS {ANSWERED};"
                    f" DROP TABLE IF EXISTS {CANDIDATES}")
    if con.execute(f"SELECT count(*) FROM {HELD}").fetchall()[0] == (0,):
        con.execute(f"DROP TABLE {HELD}")
        return False
    return True


def _settled_keys(name: str, rows: str) -> str:
    """A CTE ``name``: per unit of ``rows``, how many keys settled it and the least and greatest."""
    return f"{name} AS (SELECT u, count(DISTINCT k) AS n, min(k) AS lo, max(k) AS hi FROM {rows} WHERE s GROUP BY u)"


def _hides(keys: str, rows: str) -> str:
    """Whether ``rows`` (settling keys per unit in CTE ``keys``) hide row ``x`` stored before them:
    a row of theirs shares its primary key, or they settled its unit under another key (any key, for
    an open marker)."""
    other_key = f"{keys}.n > 1 OR {keys}.lo IS DISTINCT FROM x.k OR x.m"
    return (f"coalesce(x.p IN (SELECT p FROM {rows}), false)"
            f" OR coalesce(coalesce({keys}.n, 0) > 0 AND ({other_key}), false)")


def _key_struct(snap: Snapshot) -> str:
    """A row's primary key as one struct, NULL for a row with no key (a null or NaN in a key column:
    such a row merges with nothing, ``storage.snapshot``), so it equals no other row's."""
    assert snap.schema is not None
    keyless = []
    for column in snap.primary_key:
        keyless.append(f"{quote(column)} IS NULL")
        if pa.types.is_floating(snap.schema.field(column).type):
            keyless.append(f"isnan({quote(column)})")
    packed = "struct_pack(" + ", ".join(f"k{i} := {quote(k)}" for i, k in enumerate(snap.primary_key)) + ")"
    return f"(CASE WHEN {' OR '.join(keyless)} THEN NULL ELSE {packed} END)"


def _unit_struct(rule: Supersede) -> Callable[[Callable[[str], str]], str]:
    """A unit's value as one struct, from a map of column name to expression."""
    return lambda column: "struct_pack(" + ", ".join(f"u{i} := {column(u)}" for i, u in enumerate(rule.unit)) + ")"


def _sub(snap: Snapshot, parts: list[PartRow], primary_key: tuple[str, ...]) -> Snapshot:
    """``snap`` reading only ``parts`` (in merge order; all on one side of a declaration)."""
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
           position: PartRow, tally: _Tally | None = None) -> PartFile:
    """Write what ``sql`` answers as one part at ``key``, merging at ``position``'s place (each
    batch counted into ``tally``)."""
    assert snap.schema is not None
    reader = con.sql(sql).to_arrow_reader(READ_BATCH_ROWS)
    schema = snap.schema

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            yield from conform(pa.Table.from_batches([batch]), schema, snap.table).to_batches()
            if tally is not None:
                tally.rows += batch.num_rows
                tally.report()

    try:
        part = write_part(store.objects, key, batches(), schema, durable=store.durable)
    finally:
        reader.close()
    return PartFile(part.path, part.rows, part.bytes, ord_seq=position.ord_seq, ord_idx=position.ord_idx)
