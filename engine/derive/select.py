"""The derive work set: an anti-join of parent rows against the output table under current keys.

Implements ``run.select.anti-join``, ``run.select.parent-scan``, ``run.select.no-store-root``,
``run.select.unit-parents``, ``run.select.dry-run`` and, with the store's supersede rule,
``run.select.key-change`` (decisions "derive-work-set", "derivation-key-decides",
"selection-stays-bounded").

Each run recomputes the outstanding set from the pipeline's own output table (a host task's: its
marker table), the single record of done, failed and settled: a unit is *settled* under a key when
the table answers a passage under it, a marker whose status is ok or empty, or a marker that no
longer retries (a failure past ``max_attempts``, an unavailable unit). Every parent row whose
current key (``engine.derive.keys``) is not settled is outstanding; a failed unit still retrying
carries its attempts forward. What the table answers already follows the supersede rule
(``storage.supersede``): rows under a key landed before the unit's latest ok or empty landing under
another key count for nothing, so a key changed and changed back derives the unit again. A parent
that is itself a derive output (it has ``derivation_key`` and ``kind``) gives its passages as units,
never its markers, and its ``derivation_key`` enters each unit's key.

A derived unit follows its parent's lifetime (decision "derived-unit-follows"): a unit the output
answers whose parent id is no longer a live parent unit (the row was deleted or re-landed without
it, or a parent passage is gone after its unit re-derived to fewer passages) is *retiring*
(:meth:`Selection.retiring`, a set-shaped anti-join of the output's live units against the parent
ids); a run lands a retirement for each (``engine.derive.retire``) before it derives anything.

Every table the selection reads is pinned at one catalog point (``Store.pin``), so the parents,
the output and a host task's joined tables are one consistent state. A host task's joined tables
are copied once, before the anti-join, into the selection's DuckDB (rows landed after that read are
absent from every unit of the run).

Memory: a parent table of at most :data:`IN_MEMORY_ROWS` rows is selected in memory in one piece;
a larger one streams from DuckDB in batches of :data:`BATCH_ROWS` rows, one batch held at a time.
DuckDB's join state (the output's stored rows folded per primary key, the join to the parents' keys,
the per-unit aggregate) grows with the units joined at once, so past :data:`PASS_UNITS` units (parent
rows or stored output rows) the units are joined in passes, each over one range of unit ids: the
ranges split at quantiles of a sample of the ids (the parent's and the output's, :meth:`Selection._range_bounds`),
so each holds about as many units, and a pass's scans skip every row group whose ids (Parquet's
min/max statistics) lie outside its range: ids landed in order, as sequential ids land, are read
about once over all the passes, not once a pass. Ids of a type other than text or an integer split
by hash instead (``hash(unit_ref) % passes``). Every row of a unit, parent or output, falls in the
same pass, so the passes' results add up to the one join's, and the state of one pass holds about
:data:`PASS_UNITS` units whatever the archive's size. :data:`MEMORY_LIMIT` bounds it besides (DuckDB
spills past it to a temporary directory). Bench: bench/bench_derive_select.py, bench/README.md
"Derive selection".
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import pyarrow as pa
from contextful.engine.derive.keys import MediaDigests, join_digest_sql, key_sql
from contextful.engine.derive.retire import RETIRE_KEY
from contextful.storage.errors import DeriveNoStoreRoot, TableNotFound
from contextful.storage.snapshot import Snapshot, quote, sql_literal
from contextful.storage.supersede import RETIRED, SETTLING

if TYPE_CHECKING:
    from contextful.engine.derive.config import DeriveConfig
    from contextful.engine.derive.tasks import HostTask
    from contextful.storage import Store

IN_MEMORY_ROWS = 1_000_000
BATCH_ROWS = 1_000_000
MEMORY_LIMIT = "1250MB"
PASS_UNITS = 1_000_000
"""Units (parent rows or stored output rows, the larger) one pass of the selection joins at most
(about: the passes split at sampled quantiles of the unit ids): 1,000,000 units join in ~350 MiB."""
SAMPLE_PER_PASS = 1_000
"""Unit ids sampled per pass to place the passes' range bounds (a pass's share is then within a few
percent of the others')."""


@dataclass(frozen=True)
class SelectionCounts:
    eligible: int
    """Parent rows with an id: every unit."""
    derived: int
    """Units settled under their current key."""
    outstanding: int
    """Units a run derives (eligible - derived)."""
    retiring: int = 0
    """Units the output answers whose parent left: a run retires them (their rows leave)."""

    def to_json(self) -> dict[str, int]:
        return {"eligible": self.eligible, "derived": self.derived, "outstanding": self.outstanding,
                "retiring": self.retiring}


class Selection:
    """One pinned selection of a derive pipeline (close it, or use it as a context manager).

    ``static`` is the build's part of every key (``engine.derive.keys.static_digest``); ``task`` is
    the host task for a host-task pipeline (None: a built-in task over ``config.media_column``).
    """

    def __init__(self, store: Store | None, pipeline: str | None, output_table: str, config: DeriveConfig,
                 static: str, root: Path, *, task: HostTask | None = None, in_memory_rows: int = IN_MEMORY_ROWS,
                 batch_rows: int = BATCH_ROWS, memory_limit: str = MEMORY_LIMIT, version: str | None = None,
                 pass_units: int = PASS_UNITS) -> None:
        absent = [name for name, value in (("store root", store), ("pipeline id", pipeline)) if not value]
        if absent:
            raise DeriveNoStoreRoot(" and ".join(absent))
        assert store is not None and pipeline is not None
        self.store = store
        self.pipeline = pipeline
        self.output_table = output_table
        self.config = config
        self.static = static
        self.root = root
        self.task = task
        self.batch_rows = batch_rows
        self.version = version
        """The build's task version (what ``retain_versions`` keeps rows apart by)."""
        self._keyed_columns: list[str] | None = None
        self._units: str | None = None  # the temporary table of the outstanding units, once a run joined them
        self._joined: SelectionCounts | None = None  # the counts of that join (units())
        self.digests: MediaDigests | None = None
        self._spill = tempfile.TemporaryDirectory(prefix="contextful-select-")
        self.con = store.duckdb()
        self.con.execute(f"SET memory_limit = '{memory_limit}'")
        self.con.execute(f"SET temp_directory = '{self._spill.name}'")
        self.con.execute("SET preserve_insertion_order = false")
        existing = set(store.table_names())
        if config.source_table not in existing:
            self.close()
            raise TableNotFound(config.source_table)
        self.joins = [j for j in task.joins if j.table in existing] if task is not None else []
        """The joins whose table exists (a table nothing landed yet joins no row to any unit)."""
        names = [config.source_table, *[j.table for j in self.joins]]
        landed = [t for t in (*(task.content_tables if task is not None else ()), output_table) if t in existing]
        pinned = store.pin(names + landed)
        from contextful.engine.read import attach_snapshot

        parent_rows = 0
        parent_schema: pa.Schema | None = None
        attached: set[str] = set()
        self.landed: dict[str, Snapshot] = {}
        """The tables the pipeline lands (a host task's content tables, then its output) holding rows,
        read through :func:`settled_sql` and :func:`live_units_sql`, never a view."""
        for name, (table, seq) in pinned.items():
            snap = table.snapshot_at(seq)
            if snap.schema is None or not snap.parts:  # created, nothing landed yet: no rows to read
                continue
            attached.add(name)
            if name in landed:
                self.landed[name] = snap
                continue
            attach_snapshot(self.con, snap, f"__derive_{name}")
            if name == config.source_table:
                parent_rows, parent_schema = snap.rows_stored, snap.schema
        self._output = self.landed.get(output_table)
        self.pinned = {name: seq for name, (_table, seq) in pinned.items()}
        self.joins = [j for j in self.joins if j.table in attached]
        self.empty = config.source_table not in attached
        """The parent has no commit yet (a derive parent that derived nothing so far): no units."""
        self.streams = parent_rows > in_memory_rows
        """Whether the parent scan streams in batches (more than ``in_memory_rows`` rows)."""
        self.passes = _passes(parent_rows, parent_schema, config.parent_id_column, self._output, pass_units)
        """How many passes join the units (one per range of unit ids, :meth:`_part`; 1: one join)."""
        self._bounds: list[str] | None = None  # the passes' range bounds as SQL literals (None: hash passes)
        if self.empty:
            return
        self._parent_columns = [row[0] for row in self.con.execute(
            f"DESCRIBE SELECT * FROM {quote('__derive_' + config.source_table)}").fetchall()]
        if self.passes > 1 and parent_schema is not None:
            self._bounds = self._range_bounds(parent_schema.field(config.parent_id_column).type)
        self._copy_joins()
        if task is None:
            self._register_media_digests()

    # --- setup ------------------------------------------------------------------------------------

    def _copy_joins(self) -> None:
        """``run.select.unit-parents``: each joined table read once, before the anti-join."""
        for join in self.joins:
            self.con.execute(f"CREATE TABLE {quote('__joined_' + join.table)} AS "
                             f"SELECT * FROM {quote('__derive_' + join.table)}")

    def _register_media_digests(self) -> None:
        """SHA-256 of every local media file the parents name (``run.emit.local-content-key``)."""
        media = quote(self.config.media_column or "")
        parent = quote("__derive_" + self.config.source_table)
        if self.config.media_column not in self._parent_columns:
            raise TableNotFound(f"{self.config.source_table}.{self.config.media_column}")
        self.digests = MediaDigests(self.root)
        values: list[str] = []
        digests: list[str | None] = []
        reader = self.con.sql(
            f"SELECT DISTINCT CAST({media} AS VARCHAR) AS media FROM {parent} WHERE {media} IS NOT NULL "
            f"AND NOT regexp_matches(CAST({media} AS VARCHAR), '^https?://')").to_arrow_reader(self.batch_rows)
        for batch in reader:
            more_values, more_digests = self.digests.table(batch.column(0).to_pylist())
            values += more_values
            digests += more_digests
        reader.close()
        self._media_digests = pa.table({"media": pa.array(values, pa.string()),
                                        "digest": pa.array(digests, pa.string())})
        self.con.register("__derive_media_digests", self._media_digests)

    # --- the query --------------------------------------------------------------------------------

    def _keyed_sql(self, part: int | None = None) -> str:
        """Every unit: its id, its value (media, or declared parent columns), prior state, and key;
        ``part``: only the units of that pass (:meth:`_part`)."""
        cfg = self.config
        parent = quote("__derive_" + cfg.source_table)
        pid = f"p.{quote(cfg.parent_id_column)}"
        if cfg.parent_id_column not in self._parent_columns:
            raise TableNotFound(f"{cfg.source_table}.{cfg.parent_id_column}")
        parent_key = "p.derivation_key" if "derivation_key" in self._parent_columns else None
        joins = ""
        join_parts: list[str] = []
        if self.task is None:
            value = f"CAST(p.{quote(cfg.media_column or '')} AS VARCHAR)"
            select = f"{pid} AS unit_ref, {value} AS media"
            content = "d.digest"
            joins += " LEFT JOIN __derive_media_digests AS d ON d.media = " + value
        else:
            columns = [c for c in self.task.columns] or [c for c in self._parent_columns]
            value = "{" + ", ".join(f"'{c}': p.{quote(c)}" for c in columns) + "}"
            select = f"{pid} AS unit_ref, " + ", ".join(f"p.{quote(c)} AS {quote('p_' + c)}" for c in columns)
            content = None
            for n, joined in enumerate(self.joins):
                alias = f"j{n}"
                digest = join_digest_sql(quote("__joined_" + joined.table), joined.column, joined.read)
                joins += f" LEFT JOIN ({digest}) AS {alias} ON {alias}.join_value = {pid}"
                join_parts.append(f"coalesce({alias}.join_digest, '')")
        join_key = " || chr(31) || ".join(join_parts) if join_parts else None
        key = key_sql(self.static, pid, value, parent_key, content, join_key)
        of_part = self._part(pid, part)
        return (f"SELECT {select}, {key} AS derivation_key FROM {parent} AS p{joins} WHERE {self._unit_filter()}"
                + (f" AND {of_part}" if of_part else ""))

    def _range_bounds(self, id_type: pa.DataType) -> list[str] | None:
        """The ``passes - 1`` ids splitting the units into the passes' ranges, as SQL literals: quantiles
        of a sample of the parent's unit ids and the output's stored ``unit_ref`` (so orphans weigh
        too). None (hash passes) for ids neither text nor an integer, whose literal would stand for a
        value of another type, or when the sample yields no bound."""
        text = pa.types.is_string(id_type) or pa.types.is_large_string(id_type) or pa.types.is_string_view(id_type)
        if not (text or pa.types.is_integer(id_type)):
            return None
        ids = (f"SELECT p.{quote(self.config.parent_id_column)} AS u FROM "
               f"{quote('__derive_' + self.config.source_table)} AS p WHERE {self._unit_filter()}")
        if self._output is not None:
            ids += f" UNION ALL SELECT unit_ref FROM ({stored_rows_sql(self._output, 'unit_ref', 'unit_ref IS NOT NULL')})"
        fractions = ", ".join(repr(i / self.passes) for i in range(1, self.passes))
        [(bounds,)] = self.con.execute(
            f"SELECT quantile_disc(u, [{fractions}]) FROM (SELECT u FROM ({ids}) "
            f"USING SAMPLE reservoir({SAMPLE_PER_PASS * self.passes} ROWS) REPEATABLE (0))").fetchall()
        if bounds is None or any(b is None or (text and "\x00" in b) for b in bounds):  # no SQL literal holds a NUL
            return None
        return [sql_literal(b) if text else str(int(b)) for b in bounds]

    def _part(self, unit: str, part: int | None) -> str | None:
        """The predicate keeping pass ``part``'s units of the SQL expression ``unit`` (a unit id of the
        parent's or the output's, the same type: :func:`_passes`): its range of ids, from the bound
        below it (inclusive) to the one above (exclusive), the first and last open-ended; or, with no
        range bounds, the units whose id hashes to it. None: every unit."""
        if part is None or self.passes <= 1:
            return None
        if self._bounds is None:
            return f"hash({unit}) % {self.passes} = {part}"
        below = [f"{unit} >= {self._bounds[part - 1]}"] if part > 0 else []
        above = [f"{unit} < {self._bounds[part]}"] if part < self.passes - 1 else []
        return " AND ".join(below + above)

    def _unit_filter(self) -> str:
        """Which parent rows (``p``) are units: those with an id, and of a derive parent its passages."""
        derive_parent = {"derivation_key", "kind"} <= set(self._parent_columns)
        return (f"p.{quote(self.config.parent_id_column)} IS NOT NULL"
                + (" AND p.kind = 'passage'" if derive_parent else ""))

    @property
    def unit_columns(self) -> tuple[str, ...]:
        """The columns naming a unit under the output table's supersede rule."""
        return ("unit_ref", "task_version") if self.config.retain_versions else ("unit_ref",)

    def _joined_sql(self, carry: bool = True, part: int | None = None) -> str:
        """Every unit with ``settled`` and ``attempts``: the parents' keys joined to the output's stored
        rows of their units and aggregated per unit in one pass. A unit is settled under its current
        key K when its newest settling row under K is no older than the newest ``ok``/``empty``
        landing under another key (of its task version, when versions are retained): exactly what a
        reader under the supersede rule finds (:func:`settled_sql` says why). ``carry``: the units' other
        columns ride along (counting needs none of them, so its join state holds only ids and keys).
        ``part``: only the units of that pass."""
        keyed = self._keyed_sql(part)
        if self._output is None:
            return f"SELECT k.*, false AS settled, 0 AS attempts FROM ({keyed}) AS k"
        if self._keyed_columns is None:
            self._keyed_columns = [r[0] for r in self.con.execute(f"DESCRIBE {keyed}").fetchall()]
        rest = [c for c in self._keyed_columns if c not in ("unit_ref", "derivation_key")] if carry else []
        version = self.version if self.config.retain_versions else None
        return settled_sql(keyed, rest, self._output, self.unit_columns, version, part=self._part("unit_ref", part))

    def counts(self) -> SelectionCounts:
        """Eligible, already-derived, outstanding and retiring units (``run.select.dry-run``): an
        aggregate of the join with no unit columns carried, and a count of the output's units whose
        parent left (:meth:`retiring_sql`). Before a run joins its units (a dry run), one query
        answers all four (:func:`counts_sql`: the join made full, its unmatched output units the
        retiring ones), summed over the passes."""
        if self._units is None and not self.empty and self._output is not None:
            version = self.version if self.config.retain_versions else None
            totals = [0, 0, 0]
            for part in range(self.passes):
                sql = counts_sql(self._keyed_sql(part), self._output, self.unit_columns, version,
                                 part=self._part("unit_ref", part))
                [row] = self.con.execute(sql).fetchall()
                totals = [total + int(n) for total, n in zip(totals, row)]
            eligible, derived, leaving = totals
            return SelectionCounts(eligible, derived, eligible - derived, leaving)
        retiring = self.retiring_sql(self.output_table)
        [(count,)] = self.con.execute(f"SELECT count(*) FROM ({retiring})").fetchall() if retiring else [(0,)]
        return replace(self._unit_counts(), retiring=int(count))

    def _unit_counts(self) -> SelectionCounts:
        """Eligible, already-derived and outstanding units, from one query over each pass's join (or
        as the run's join counted them, :meth:`units`), summed over the passes."""
        if self.empty:
            return SelectionCounts(0, 0, 0)
        if self._joined is not None:
            return self._joined
        eligible = derived = 0
        for part in range(self.passes):
            [(more_eligible, more_derived)] = self.con.execute(
                f"SELECT count(*), count(*) FILTER (WHERE settled) FROM ({self._joined_sql(False, part)})").fetchall()
            eligible, derived = eligible + int(more_eligible), derived + int(more_derived)
        return SelectionCounts(eligible, derived, eligible - derived)

    def units(self) -> SelectionCounts:
        """Join every unit once and count them, keeping the outstanding ones in a temporary table of
        the selection's connection (DuckDB spills it past the memory limit): a run's :meth:`counts`
        and :meth:`outstanding` then read those instead of joining the parents to the output's stored
        rows twice. Each pass's units are joined into a table of their own, counted, and their
        outstanding ones added, so what is held is one pass's units and the outstanding units so far,
        never every settled unit of the archive."""
        if self._units is None and not self.empty:
            eligible = derived = 0
            for part in range(self.passes):
                self.con.execute(f"CREATE OR REPLACE TEMP TABLE __derive_pass AS {self._joined_sql(part=part)}")
                [(more_eligible, more_derived)] = self.con.execute(
                    "SELECT count(*), count(*) FILTER (WHERE settled) FROM __derive_pass").fetchall()
                eligible, derived = eligible + int(more_eligible), derived + int(more_derived)
                head = "CREATE TEMP TABLE __derive_units AS" if part == 0 else "INSERT INTO __derive_units"
                self.con.execute(f"{head} SELECT * FROM __derive_pass WHERE NOT settled")
            self.con.execute("DROP TABLE __derive_pass")
            self._units = "__derive_units"
            self._joined = SelectionCounts(eligible, derived, eligible - derived)
        return self._unit_counts()

    def outstanding(self) -> Iterator[pa.RecordBatch]:
        """The outstanding units (unit_ref, media or p_<column>..., derivation_key, attempts): in one
        piece (a pass's) from a parent of at most ``in_memory_rows`` rows, else streamed ``batch_rows`` at
        a time, pass after pass."""
        if self.empty:
            return
        sources = [self._units] if self._units else [f"({self._joined_sql(part=part)})" for part in range(self.passes)]
        for source in sources:
            sql = f"SELECT * EXCLUDE (settled) FROM {source} WHERE NOT settled"
            if self.streams:
                yield from self.con.sql(sql).to_arrow_reader(self.batch_rows)
            else:
                yield from self.con.sql(sql).to_arrow_table().to_batches()

    def retiring_sql(self, table: str) -> str | None:
        """A SELECT of the units (:attr:`unit_columns`) that ``table`` (one the pipeline lands) answers
        and whose parent id is not a live parent unit: the parent row was deleted, re-landed without
        it or without that id, or, for a derive parent, the passage is gone (the parent is read as its
        readers read it). None: the table holds no rows. One scan of the table's stored rows,
        hash anti-joined to the parent ids, then grouped per unit (:func:`live_units_sql`); nothing
        else of either is carried."""
        snap = self.landed.get(table)
        if snap is None:
            return None
        if self.empty:  # a parent with no commit yet (a derive parent that derived nothing): no unit is live
            return live_units_sql(snap, self.unit_columns)
        parent = quote("__derive_" + self.config.source_table)
        ids = f"SELECT p.{quote(self.config.parent_id_column)} FROM {parent} AS p WHERE {self._unit_filter()}"
        return live_units_sql(snap, self.unit_columns, orphans=ids)

    def retiring(self, table: str) -> Iterator[pa.RecordBatch]:
        """The units of :meth:`retiring_sql`, streamed ``batch_rows`` at a time."""
        sql = self.retiring_sql(table)
        if sql is None:
            return
        yield from self.con.sql(sql).to_arrow_reader(self.batch_rows)

    def joined_rows(self, join_table: str, column: str, values: list[Any]) -> dict[Any, list[dict[str, Any]]]:
        """Rows of the copied joined table whose ``column`` is one of ``values``, grouped by it (on a
        cursor of its own: the outstanding units may still be streaming on the selection's)."""
        if join_table not in {j.table for j in self.joins}:
            return {}
        cursor = self.con.cursor()
        try:
            cursor.register("__derive_join_keys", pa.table({"v": values}))
            rows = cursor.sql(f"SELECT j.* FROM {quote('__joined_' + join_table)} AS j "
                                  f"SEMI JOIN __derive_join_keys AS k ON k.v = j.{quote(column)}").to_arrow_table()
        finally:
            cursor.close()
        grouped: dict[Any, list[dict[str, Any]]] = {}
        for row in rows.to_pylist():
            grouped.setdefault(row[column], []).append(row)
        return grouped

    def settled_now(self, pairs: pa.Table) -> set[tuple[Any, str]]:
        """Which (unit_ref, derivation_key) of ``pairs`` the output table's HEAD settles now
        (``run.emit.settled-revived``: another run settled them while this one derived them); only
        those units' stored rows are read."""
        if self.output_table not in self.store.table_names():
            return set()
        snap = self.store.table(self.output_table).snapshot()
        if snap.schema is None or not snap.parts:
            return set()
        version = self.version if self.config.retain_versions else None
        con = self.store.duckdb()
        try:
            con.register("__derive_pairs", pairs)
            state = settled_sql("SELECT unit_ref, derivation_key FROM __derive_pairs", [], snap, self.unit_columns,
                                version, restrict="SELECT unit_ref FROM __derive_pairs")
            rows = con.sql(f"SELECT unit_ref, derivation_key FROM ({state}) WHERE settled").fetchall()
        finally:
            con.close()
        return {(r[0], r[1]) for r in rows}

    def close(self) -> None:
        if self.digests is not None:
            self.digests.close()
            self.digests = None
        self.con.close()
        self._spill.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


DONE = "(kind = 'passage' OR unit_status IN ('ok', 'empty') OR NOT coalesce(retry, true))"
"""A row that settles its unit under its key for selection: a passage, an ok or empty marker, or a
marker that no longer retries."""


SETTLES = f"unit_status IN ({', '.join(sql_literal(status) for status in SETTLING)})"
"""A row of a settling landing (a retirement too): it supersedes the unit's rows under other keys
(storage.supersede)."""


def stored_rows_sql(output: Snapshot, columns: str, where: str) -> str:
    """The output's stored rows (``columns``, ``seq``: the part's ``ord_seq``, ``pos``: the row's
    commit-order position) in one ``read_parquet`` scan, no reader's view."""
    order = sorted(range(len(output.parts)), key=lambda i: (output.parts[i].ord_seq, output.parts[i].ord_idx))
    files = "[" + ", ".join(sql_literal(output.uris[i]) for i in order) + "]"
    seqs = "[" + ", ".join(str(output.parts[i].ord_seq) for i in order) + "]"
    return (f"SELECT {columns}, {seqs}[CAST(file_index AS BIGINT) + 1] AS seq, "
            f"CAST(file_index AS BIGINT) * 4294967296 + file_row_number AS pos "
            f"FROM read_parquet({files}, hive_partitioning = false, union_by_name = true) WHERE {where}")


def live_units_sql(output: Snapshot, unit: tuple[str, ...], orphans: str | None = None) -> str:
    """The units (``unit`` columns) ``output`` answers some row of, from one scan of its stored rows: a
    unit answers nothing exactly when its latest landing is a retirement (``storage.supersede`` rule
    (c): a retirement withholds every row landed before it, and itself) or it has no row.
    ``orphans``: a SELECT of the live parent ids; only units none of them names (the rows are
    anti-joined before they are grouped, so the grouping holds the few orphans, not every unit)."""
    units = ", ".join(unit)
    where = "unit_ref IS NOT NULL" + (f" AND unit_ref NOT IN ({orphans})" if orphans else "")
    rows = stored_rows_sql(output, f"{units}, unit_status", where)
    return (f"SELECT {units} FROM ({rows}) GROUP BY {units} "
            f"HAVING max(seq) > coalesce(max(seq) FILTER (WHERE unit_status = {sql_literal(RETIRED)}), -1)")


def stored_keys(output: Snapshot, unit: tuple[str, ...], restrict: str | None = None, part: str | None = None) -> str:
    """The output's stored rows folded to one per primary key (unit, derivation_key, cue_seq), read in
    one scan, no reader's view: whether the key's latest row (the key merge's winner) settles its
    unit for selection (``done``) and its commit (``seq``: the part's ``ord_seq``), the newest commit
    that landed a settling row under the key (``settle_seq``: a landing, whatever overrode its row)
    and the latest attempts. ``restrict``: a SELECT of the unit_refs to read; ``part``: a predicate
    over ``unit_ref`` keeping one pass's units."""
    where = ("unit_ref IS NOT NULL" + (f" AND unit_ref IN ({restrict})" if restrict else "")
             + (f" AND {part}" if part else ""))
    keys = f"{', '.join(unit)}, derivation_key, cue_seq"
    rows = stored_rows_sql(output, f"{keys}, kind, unit_status, retry, attempts", where)
    return (f"SELECT {keys}, arg_max({DONE}, pos) AS done, max(seq) AS seq, "
            f"max(seq) FILTER (WHERE {SETTLES}) AS settle_seq, arg_max(attempts, pos) AS attempts "
            f"FROM ({rows}) GROUP BY {keys}")


def counts_sql(keyed: str, output: Snapshot, unit: tuple[str, ...], version: str | None,
               part: str | None = None) -> str:
    """Eligible, settled and retiring unit counts in one query: :func:`settled_sql`'s join of the
    parents' units (``keyed``) to the output's stored keys, made FULL, so the output units no parent
    names come out of the same join — grouped by their unit columns, retiring when their latest
    landing is not a retirement (as :func:`live_units_sql` decides from the stored rows). ``part``: a
    predicate over ``unit_ref`` keeping one pass's output units (``keyed`` holds that pass's)."""
    same = "o.derivation_key = k.derivation_key"
    of_version = f" AND o.task_version = {sql_literal(version)}" if version is not None else ""
    done = f"max(o.seq) FILTER (WHERE {same} AND o.done)"
    other = f"max(o.settle_seq) FILTER (WHERE o.derivation_key <> k.derivation_key{of_version})"
    retired = f"max(o.seq) FILTER (WHERE o.derivation_key = {sql_literal(RETIRE_KEY)})"
    orphan = ", ".join(f"CASE WHEN k.unit_ref IS NULL THEN o.{quote(c)} END" for c in unit)
    per_unit = (f"SELECT k.unit_ref IS NOT NULL AS present, coalesce({done} >= coalesce({other}, -1), false) AS settled,"
                f" max(o.seq) > coalesce({retired}, -1) AS live"
                f" FROM ({keyed}) AS k FULL JOIN ({stored_keys(output, unit, part=part)}) AS o ON o.unit_ref = k.unit_ref"
                f" GROUP BY k.unit_ref, k.derivation_key, {orphan}")
    return (f"SELECT count(*) FILTER (WHERE present), count(*) FILTER (WHERE present AND settled),"
            f" count(*) FILTER (WHERE NOT present AND live) FROM ({per_unit})")


def settled_sql(keyed: str, rest: list[str], output: Snapshot, unit: tuple[str, ...], version: str | None,
                restrict: str | None = None, part: str | None = None) -> str:
    """``keyed`` (a SELECT of unit_ref, derivation_key and the ``rest`` columns) with ``settled`` and
    ``attempts`` per unit: its output rows (:func:`stored_keys`) joined and aggregated in one pass,
    exactly as a reader under the table's supersede rule (``storage.supersede``) would find them.

    The rule's full rewrite of every row is not needed for that, only each primary key's latest row:
    a row under key K that settles its unit is answered unless a LATER commit settled the unit (ok or
    empty) under another key. So the unit is settled under K exactly when its newest settling
    key-merge winner under K is no older than the newest ``ok``/``empty`` landing under another key
    (of task version ``version``, when versions are kept); a marker that stopped retrying is withheld
    by a later settling landing under K too, but then K's own landing answers. Each row's commit is
    its part's ``ord_seq``. ``restrict``: a SELECT of the unit_refs whose stored rows are read (the
    units of ``keyed``, when it is small); ``part``: a predicate over ``unit_ref`` keeping one pass's
    units (``keyed`` holds that pass's)."""
    carried = "".join(f", any_value(k.{quote(c)}) AS {quote(c)}" for c in rest)
    same = "o.derivation_key = k.derivation_key"
    of_version = f" AND o.task_version = {sql_literal(version)}" if version is not None else ""
    done = f"max(o.seq) FILTER (WHERE {same} AND o.done)"
    other = f"max(o.settle_seq) FILTER (WHERE o.derivation_key <> k.derivation_key{of_version})"
    return (f"SELECT k.unit_ref, k.derivation_key{carried}, coalesce({done} >= coalesce({other}, -1), false) "
            f"AS settled, coalesce(max(o.attempts) FILTER (WHERE {same}), 0) AS attempts "
            f"FROM ({keyed}) AS k LEFT JOIN ({stored_keys(output, unit, restrict, part)}) AS o "
            f"ON o.unit_ref = k.unit_ref GROUP BY k.unit_ref, k.derivation_key")


def _passes(parent_rows: int, parent: pa.Schema | None, id_column: str, output: Snapshot | None, pass_units: int) -> int:
    """How many passes join the units: one per ``pass_units`` units (the parent's rows or the output's
    stored rows, the larger). One when the output's ``unit_ref`` is not of the parent id's type: a
    hash splits equal values alike only within one type (the join compares across types by casting)."""
    if output is None or output.schema is None or parent is None:
        return 1
    names = output.schema.names
    if "unit_ref" not in names or id_column not in parent.names:
        return 1
    if output.schema.field("unit_ref").type != parent.field(id_column).type:
        return 1
    return max(1, -(-max(parent_rows, output.rows_stored) // pass_units))
