"""Snapshots: a table resolved at one commit, and the DuckDB relation that reads it.

A snapshot is the set of parts live at a ``commit_seq`` (the head, a given seq, or the newest
commit at or before an ``as_of`` transaction time), the schema at that commit and the table's
primary key. :func:`snapshot_sql` turns it into one DuckDB ``SELECT``: parts written under older
schemas are unified by name and cast to the snapshot's types, and a table with a primary key
answers one row per key (merge on read): the one with the largest ``order_by`` value when the
table declares that column (nulls lose), then the latest by commit order (``ord_seq``, then the
part's place in its run, then the row's place in its part).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from storage.catalog import PartRow


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
    """The column whose larger value wins a key's merge before commit order does (None: commit order)."""

    @property
    def rows_stored(self) -> int:
        return sum(p.rows for p in self.parts)


def _sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@functools.lru_cache(maxsize=256)
def _duckdb_types(schema_bytes: bytes) -> tuple[str, ...]:
    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    con = duckdb.connect()
    try:
        return tuple(str(t) for t in con.from_arrow(schema.empty_table()).types)
    finally:
        con.close()


def duckdb_types(schema: pa.Schema) -> tuple[str, ...]:
    """DuckDB's spelling of each column type of ``schema``."""
    return _duckdb_types(schema.serialize().to_pybytes())


def snapshot_sql(snapshot: Snapshot) -> str | None:
    """One DuckDB SELECT answering ``snapshot``, or None when it has no parts to read."""
    if not snapshot.parts or snapshot.schema is None:
        return None
    files = "[" + ", ".join(_sql_literal(u) for u in snapshot.uris) + "]"
    names = snapshot.schema.names
    if snapshot.mixed_schemas:
        columns = ", ".join(
            f"CAST(src.{quote(n)} AS {t}) AS {quote(n)}" for n, t in zip(names, duckdb_types(snapshot.schema))
        )
    else:
        columns = ", ".join(f"src.{quote(n)}" for n in names)
    options = ", union_by_name = true" if snapshot.mixed_schemas else ""
    if not snapshot.primary_key:
        return f"SELECT {columns} FROM read_parquet({files}{options}) AS src"
    order = ", ".join(
        f"({_sql_literal(u)}, {p.ord_seq}, {p.ord_idx})" for u, p in zip(snapshot.uris, snapshot.parts)
    )
    keys = ", ".join(f"src.{quote(k)}" for k in snapshot.primary_key)
    order_by = snapshot.order_by
    stamp = f"src.{quote(order_by)} DESC NULLS LAST, " if order_by is not None and order_by in names else ""
    return (
        f"SELECT {columns} FROM read_parquet({files}{options}, filename = true, file_row_number = true) AS src"
        f" JOIN (VALUES {order}) AS part_order(part_uri, ord_seq, ord_idx) ON src.filename = part_order.part_uri"
        f" QUALIFY row_number() OVER (PARTITION BY {keys}"
        f" ORDER BY {stamp}part_order.ord_seq DESC, part_order.ord_idx DESC, src.file_row_number DESC) = 1"
    )
