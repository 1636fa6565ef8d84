"""Snapshots: a table resolved at one commit, and the DuckDB relation that reads it.

A snapshot is the set of parts live at a ``commit_seq`` (the head, a given seq, or the newest
commit at or before an ``as_of`` transaction time), the schema at that commit, the table's primary
key and the merge rule in force at that commit. :func:`snapshot_sql` turns it into one DuckDB
``SELECT``: parts written under older schemas are unified by name and cast to the snapshot's types,
and a table with a primary key answers one row per key (merge on read, docs/store.md):

- by commit order (the part's merge position ``(ord_seq, ord_idx)``, then the row's place in its
  part) while no ``order_by`` is in force;
- once one is (its declaration's commit at or below the snapshot), rows committed before the
  declaration count only through their commit-order winner, which competes with the rows
  committed after it: the largest ``order_by`` value wins (nulls lose), then commit order.

A table following a root table's row versions (``storage.follows``: the child tables of a keyed
relational root) reads, before the merge, only the rows whose root row version the root's own
snapshot (``Snapshot.root``, resolved at the same point) answers.

A table with a supersede rule (``storage.supersede``: derive output tables) withholds, after the
merge, the rows a unit's later settling landing retired; the rule's facts are read from every
scanned row, each row's commit being its part's ``ord_seq``.

A row with a null or NaN in a key column has no key: it merges with nothing and is always
answered (landing refuses such rows, ``storage.keys``; a store written before that may hold some,
and neither a read nor a fold may collapse them).

The query adds no name to the user's namespace: the scan reads with ``hive_partitioning = false``
(a directory above the store named ``x=1`` would otherwise add, or overwrite, a column ``x``), the
part and row positions come from DuckDB's virtual columns ``file_index`` and ``file_row_number``
(never from options that add columns), and the rows pass through an inner relation whose every
column has an internal name (:data:`INTERNAL_NAMES`). When a user column would shadow a virtual
column, the scan renames every column by position first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.storage.catalog import PartRow
from contextful.storage.duck_types import duckdb_types
from contextful.storage.errors import TableUnreadable
from contextful.storage.follows import LIVE, Follows, followed, live_sql
from contextful.storage.follows import NAMES as FOLLOWS_NAMES
from contextful.storage.lazy import lazy_module
from contextful.storage.supersede import NAMES as RULE_NAMES
from contextful.storage.supersede import SEQ, Supersede, ruled_sql

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
else:
    pa = lazy_module("pyarrow")
    duckdb = lazy_module("duckdb")


@dataclass(frozen=True)
class Snapshot:
    table: str
    commit_seq: int
    schema: pa.Schema | None
    """None while the table has never landed a row."""
    primary_key: tuple[str, ...]
    parts: tuple[PartRow, ...]
    uris: tuple[str, ...]
    """Where a reader finds each part, in ``parts`` order."""
    mixed_schemas: bool
    """Whether some live part was written under a schema other than the snapshot's."""
    order_by: str | None = None
    """The column whose larger value wins a key's merge before commit order does, when a
    declaration is in force at this snapshot (None: commit order)."""
    order_by_seq: int = 0
    """The commit that declared ``order_by``: rows of parts merged before it (``ord_seq`` below it)
    count only through their commit-order winner (0: declared with the table)."""
    schema_id: int = 0
    """The id of ``schema``: a part of that id holds every column (0: unknown, none is taken to)."""
    supersede: Supersede | None = None
    """The table's supersede rule (``storage.supersede``), applied after the key merge (None: none)."""
    follows: Follows | None = None
    """The root whose row versions the table's rows follow, when in force at this snapshot
    (``storage.follows``), applied before the key merge (None: none)."""
    root: Snapshot | None = None
    """With ``follows``: the root table's snapshot at the same point (None: the root answers no row)."""

    @property
    def rows_stored(self) -> int:
        return sum(p.rows for p in self.parts)


SCAN = "__cf_scan"
ROWS = "__cf_rows"
PART = "__cf_part"
ROW = "__cf_row"
VIRTUAL_COLUMNS = ("file_index", "file_row_number")
"""DuckDB's virtual columns of a Parquet scan the merge reads; a user column of the same name
(DuckDB compares names case-insensitively) shadows them unless the scan renames it."""
INTERNAL_NAMES = (SCAN, ROWS, PART, ROW, *RULE_NAMES, *FOLLOWS_NAMES, "__cf_c0", "__cf_c1", "__cf_c2", "__cf_s0", "__cf_s1", "__cf_s2")
"""The names a snapshot query gives its relations and columns (the numbered ones stand for every
``__cf_c<i>``/``__cf_s<i>``); none reaches the user's namespace."""


def sql_literal(text: str) -> str:
    """``text`` as a DuckDB string literal."""
    return "'" + text.replace("'", "''") + "'"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


Where = Callable[[Callable[[str], str]], str]
"""A row condition built from a map of column name to its expression (in the snapshot's type)."""


def snapshot_sql(snapshot: Snapshot, con: duckdb.DuckDBPyConnection, where: Where | None = None) -> str | None:
    """One DuckDB SELECT answering ``snapshot``, or None when it has no parts to read.

    ``con`` is the connection that will run it (able to read the parts); :func:`_sources` says when
    it is asked for the scan's columns. ``where`` keeps only the stored rows it holds for, before
    the key merge and the supersede rule: it must name whole keys and whole units (a condition on
    key or unit columns), so the answer is the snapshot's answer restricted to them.
    """
    if not snapshot.parts or snapshot.schema is None:
        return None
    if not snapshot.primary_key:
        scan, source, _alias, typed = _scan(snapshot, con)
        condition = f" WHERE {where(lambda n: typed(n, source[n]))}" if where is not None else ""
        return f"SELECT {_projected(snapshot, typed, source)} FROM {scan} AS {SCAN}{condition}"
    for key in snapshot.primary_key:
        if key not in snapshot.schema.names:  # a store written before keys were checked at landing
            raise TableUnreadable(snapshot.table, f"primary key column {key!r} is not a column of the table")
    inner, inner_names, projected = _inner(snapshot, con, where)
    follows = None
    if snapshot.follows is not None and snapshot.supersede is None:
        follows = _Followed(snapshot, snapshot.follows, inner_names, con)
        scanned, inner = inner, follows.unversioned(inner)
    names = snapshot.schema.names
    merge_order = _merge_order(snapshot)
    keys = ", ".join(f"{ROWS}.{quote(inner_names[k])}" for k in snapshot.primary_key)
    keyless = _keyless(snapshot, inner_names)
    latest = f"{ROWS}.{PART} DESC, {ROWS}.{ROW} DESC"
    order_by = snapshot.order_by if snapshot.order_by in inner_names else None
    if order_by is not None:
        before = sum(1 for p in snapshot.parts if p.ord_seq < snapshot.order_by_seq)
        if before:  # rows committed before the declaration: only each key's commit-order winner
            inner = (f"SELECT * FROM ({inner}) AS {ROWS} QUALIFY {ROWS}.{PART} >= {before} OR {keyless}"
                     f" OR row_number() OVER (PARTITION BY {keys}, {ROWS}.{PART} < {before} ORDER BY {latest}) = 1")
        latest = f"{_order_terms(snapshot, order_by, f'{ROWS}.{quote(inner_names[order_by])}')}, {latest}"
    columns = projected({n: f"{ROWS}.{quote(inner_names[n])}" for n in names})
    winner = f"{keyless} OR row_number() OVER (PARTITION BY {keys} ORDER BY {latest}) = 1"
    rule = snapshot.supersede
    if rule is None:
        merged = f"SELECT {columns} FROM ({inner}) AS {ROWS} QUALIFY {winner}"
        return merged if follows is None else follows.sql(scanned, columns, merged)
    for column in rule.columns:
        if column not in inner_names:
            raise TableUnreadable(snapshot.table, f"supersede column {column!r} is not a column of the table")

    # A part's commit is its ord_seq: the scan lists the parts in merge order, so file_index i is
    # the i-th of them. The rule's facts come from every scanned row (before the key merge).
    seqs = "CAST([" + ", ".join(str(snapshot.parts[i].ord_seq) for i in merge_order) + "] AS BIGINT[])"
    scanned = f"SELECT {ROWS}.*, {seqs}[CAST({ROWS}.{PART} AS BIGINT) + 1] AS {SEQ} FROM ({inner}) AS {ROWS}"
    return ruled_sql(rule, scanned, ROWS, lambda name: quote(inner_names[name]), winner, columns)


class _Followed:
    """The lifetime rule's parts of a snapshot query (``storage.follows``): the root's answered
    (id, version) pairs, materialized once, and the semi joins of the child rows onto them."""

    def __init__(self, snapshot: Snapshot, rule: Follows, inner_names: dict[str, str],
                 con: duckdb.DuckDBPyConnection) -> None:
        root = snapshot.root
        root_names = root.schema.names if root is not None and root.schema is not None else []

        def column(name: str, names: list[str] | dict[str, str], quoted: Callable[[str], str]) -> str | None:
            return quoted(name) if name in names else None

        self.live = live_sql(snapshot_sql(root, con) if root is not None else None,
                             column(rule.id, root_names, quote), column(rule.version, root_names, quote))
        self.version = column(rule.version, inner_names, lambda n: quote(inner_names[n]))
        self.match = followed(ROWS, column(rule.root_id, inner_names, lambda n: quote(inner_names[n])), self.version)

    def unversioned(self, inner: str) -> str:
        """The rows of ``inner`` without a version whose root row has none either: those go through
        the key merge (rows landed before versions existed)."""
        none = f" AND {ROWS}.{self.version} IS NULL" if self.version is not None else ""
        return f"SELECT {ROWS}.* FROM ({inner}) AS {ROWS} SEMI JOIN {LIVE} ON {self.match}{none}"

    def sql(self, inner: str, columns: str, merged: str) -> str:
        """The whole query: the rows of the root row versions the root answers (a version's rows
        carry distinct ids: no key merge), and ``merged``, the key merge of the unversioned ones."""
        if self.version is None:
            return f"WITH {LIVE} AS MATERIALIZED ({self.live}) {merged}"
        versioned = (f"SELECT {columns} FROM ({inner}) AS {ROWS} SEMI JOIN {LIVE} ON {self.match}"
                     f" AND {ROWS}.{self.version} IS NOT NULL")
        return f"WITH {LIVE} AS MATERIALIZED ({self.live}) {versioned} UNION ALL {merged}"


def stored_rows_sql(snapshot: Snapshot, con: duckdb.DuckDBPyConnection, where: Where) -> str | None:
    """Every row the snapshot's parts store (no key merge, no rule) for which ``where`` holds, in
    merge order."""
    if not snapshot.parts or snapshot.schema is None:
        return None
    inner, inner_names, projected = _inner(snapshot, con, where)
    columns = projected({n: f"{ROWS}.{quote(inner_names[n])}" for n in snapshot.schema.names})
    return f"SELECT {columns} FROM ({inner}) AS {ROWS} ORDER BY {ROWS}.{PART}, {ROWS}.{ROW}"


def _merge_order(snapshot: Snapshot) -> list[int]:
    """The positions of the snapshot's parts in merge order: the order its scan lists them."""
    return sorted(range(len(snapshot.parts)), key=lambda i: (snapshot.parts[i].ord_seq, snapshot.parts[i].ord_idx))


def _scan(snapshot: Snapshot, con: duckdb.DuckDBPyConnection
          ) -> tuple[str, dict[str, str], str, Callable[[str, str], str]]:
    """The parts' scan in merge order, what reads each column from it and its alias list
    (:func:`_sources`), and ``typed(name, expression)``: the expression in the snapshot's type of
    column ``name`` (cast when parts differ)."""
    assert snapshot.schema is not None
    files = "[" + ", ".join(sql_literal(snapshot.uris[i]) for i in _merge_order(snapshot)) + "]"
    scan = f"read_parquet({files}, hive_partitioning = false{', union_by_name = true' if snapshot.mixed_schemas else ''})"
    types = dict(zip(snapshot.schema.names, duckdb_types(snapshot.schema))) if snapshot.mixed_schemas else None

    def typed(name: str, expression: str) -> str:
        return expression if types is None else f"CAST({expression} AS {types[name]})"

    source, alias = _sources(snapshot, con, scan)
    return scan, source, alias, typed


def _projected(snapshot: Snapshot, typed: Callable[[str, str], str], read: dict[str, str]) -> str:
    """The snapshot's columns, each from ``read[name]``, in the snapshot's type."""
    assert snapshot.schema is not None
    return ", ".join(f"{typed(n, read[n])} AS {quote(n)}" for n in snapshot.schema.names)


def _inner(snapshot: Snapshot, con: duckdb.DuckDBPyConnection, where: Where | None = None
           ) -> tuple[str, dict[str, str], Callable[[dict[str, str]], str]]:
    """The scanned rows (those ``where`` holds for) under internal names (``__cf_c<i>``, the part's
    and the row's positions), those names by column, and the projection back to the snapshot's
    columns."""
    assert snapshot.schema is not None
    scan, source, alias, typed = _scan(snapshot, con)
    names = snapshot.schema.names
    inner_names = {n: f"__cf_c{i}" for i, n in enumerate(names)}
    condition = f" WHERE {where(lambda n: typed(n, source[n]))}" if where is not None else ""
    inner = (
        "SELECT " + ", ".join(f"{source[n]} AS {quote(inner_names[n])}" for n in names)
        + f", {SCAN}.file_index AS {PART}, {SCAN}.file_row_number AS {ROW} FROM {scan} AS {SCAN}{alias}{condition}"
    )
    return inner, inner_names, lambda read: _projected(snapshot, typed, read)


ZONED_STAMP = r"[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?\s*([Zz]|[+-]\d{2}(:?\d{2})?)$"
"""A text stamp that names its zone (``Z``, ``+02:00``, ``-0530``): it reads as that instant."""


def _order_terms(snapshot: Snapshot, order_by: str, column: str) -> str:
    """The ORDER BY terms putting a key's winner first: the largest ``order_by`` value.

    A text column compares as instants where its values are ISO-8601 stamps (a JSON timestamp lands
    as the text that arrived, docs/manifest.md): as text ``…05Z`` sorts above ``…05.5Z`` and
    ``01:00+02:00`` above ``00:30Z``, the later instant losing. A stamp naming its zone is that
    instant; one without a zone reads as UTC (the machine's zone never enters: ``epoch_us`` of a
    ``TIMESTAMP`` counts from its wall clock). Values that are not stamps rank below every stamp
    and among themselves as text.
    """
    assert snapshot.schema is not None
    if not pa.types.is_string(snapshot.schema.field(order_by).type) and not pa.types.is_large_string(
            snapshot.schema.field(order_by).type):
        return f"{column} DESC NULLS LAST"
    instant = (f"CASE WHEN regexp_matches({column}, {sql_literal(ZONED_STAMP)})"
               f" THEN epoch_us(TRY_CAST({column} AS TIMESTAMPTZ)) ELSE epoch_us(TRY_CAST({column} AS TIMESTAMP)) END")
    return f"{instant} DESC NULLS LAST, {column} DESC NULLS LAST"


def _keyless(snapshot: Snapshot, inner_names: dict[str, str]) -> str:
    """True for a row with no key to merge by: a null (or NaN) in a key column equals nothing, so
    such a row is never merged (landing refuses them; a store written before that may hold some)."""
    assert snapshot.schema is not None
    tests = []
    for key in snapshot.primary_key:
        column = f"{ROWS}.{quote(inner_names[key])}"
        tests.append(f"{column} IS NULL")
        if pa.types.is_floating(snapshot.schema.field(key).type):
            tests.append(f"isnan({column})")
    return "(" + " OR ".join(tests) + ")"


def _sources(snapshot: Snapshot, con: duckdb.DuckDBPyConnection, scan: str) -> tuple[dict[str, str], str]:
    """Per snapshot column, what reads it from the scan (``NULL`` when no live part holds it), and
    the scan's column alias list (empty when the scan keeps the files' names).

    The scan's own columns are asked of DuckDB (a footer read) only when they are not known from the
    catalog: parts of differing schemas none of which has the snapshot's (a group a fold rewrites, or
    columns landed without rows), or, for a keyed snapshot, a user column shadowing a virtual one
    in parts of differing schemas.
    """
    assert snapshot.schema is not None
    names = snapshot.schema.names
    virtual = set(VIRTUAL_COLUMNS)
    shadows = bool(snapshot.primary_key) and any(n.lower() in virtual for n in names)
    complete = not snapshot.mixed_schemas or any(p.schema_id == snapshot.schema_id for p in snapshot.parts)
    if complete and not shadows:
        return {n: f"{SCAN}.{quote(n)}" for n in names}, ""
    if snapshot.mixed_schemas:
        scanned = [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()]
    else:
        scanned = list(names)  # every part was written in exactly this schema
    position = {name.lower(): index for index, name in reversed(list(enumerate(scanned)))}
    labels = [f"__cf_s{i}" for i in range(len(scanned))] if shadows else scanned
    alias = "(" + ", ".join(quote(label) for label in labels) + ")" if shadows else ""
    return {n: f"{SCAN}.{quote(labels[position[n.lower()]])}" if n.lower() in position else "NULL"
            for n in names}, alias
