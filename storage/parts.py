"""Parquet parts: immutable zstd files, each written whole or not at all.

A part's name carries its run id and position (``<run id>-<n>.parquet``), so a crash leaves at
worst an unreferenced part that collection removes. Large batches split into parts of at most
``PART_ROWS`` rows; row groups stay at ``ROW_GROUP_ROWS`` so readers can skip and parallelize.

Dictionary encoding is asked for on string and binary columns only (:func:`dictionary_columns`):
the writer's attempt to dictionary-encode a high-cardinality number column, abandoned once the
dictionary page overflows, cost about 40% of a part's write time and made the file larger. The
relational row ids (:data:`PLAIN_COLUMNS`) are written plain too: long, sorted and mostly distinct
per row group, their dictionary overflowed its page and fell back to plain after hashing, and zstd
over plain pages of sorted ids is smaller than what the fallback wrote.

A part whose rows are in hand before it is written (a staged table, not a fold's stream) declares
every top-level column that holds no null ``REQUIRED`` (:func:`file_schema`): the same values,
read back the same by every reader, without the definition levels the writer would otherwise
compute, encode and compress for every row (a quarter of the cost of writing a string column).
The table's schema is unchanged: its columns stay nullable, and parts of one table may differ here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, TYPE_CHECKING

from contextful.storage.commits import PartFile
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import table_prefix
from contextful.storage.objects import ObjectStore

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    pa = lazy_module("pyarrow")
    pq = lazy_module("pyarrow.parquet")

PART_ROWS = 4_000_000
ROW_GROUP_ROWS = 256 * 1024
ROW_GROUP_BYTES = 64 << 20
"""A row group holds at most ``ROW_GROUP_ROWS`` rows, and gathering small batches into one stops
at about this many bytes (a wide table's row group of 256 Ki rows could be large)."""
COMPRESSION = "zstd"
PLAIN_COLUMNS = frozenset({"_cf_id", "_cf_parent_id", "_cf_root_id"})
"""The relational row ids (``engine.normalize``): written without a dictionary."""


def part_key(table: str, run_id: str, index: int) -> str:
    return f"{table_prefix(table)}/parts/{run_id}-{index:05d}.parquet"


def write_part(objects: ObjectStore, key: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
               durable: bool = True, encoded: Callable[[PartFile], None] | None = None) -> PartFile:
    """Stream ``batches`` into one Parquet part at ``key``; return its row and byte counts.

    ``encoded`` hears the part's counts as soon as its bytes are written, before they are made
    durable and put in place: a commit writes its manifest meanwhile (nothing reads a part before
    a commit references it, and the commit waits for this call to return).
    """
    if objects.is_local:
        with objects.atomic_local_path(key, durable=durable) as tmp:
            part = PartFile(key, _write(tmp, batches, schema), os.path.getsize(tmp))
            if encoded is not None:
                encoded(part)
    else:
        with objects.atomic_writer(key, durable=durable) as fh:
            part = PartFile(key, _write(fh, batches, schema), fh.tell())
        if encoded is not None:
            encoded(part)
    return part


def _write(sink: str | IO[bytes], batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> int:
    rows = 0
    if isinstance(batches, Sequence):
        schema = file_schema(schema, batches)
    dictionary = [path for path in dictionary_columns(schema) if path not in PLAIN_COLUMNS]
    with pq.ParquetWriter(sink, schema, compression=COMPRESSION, use_dictionary=dictionary) as writer:
        for group in _row_groups(batches):
            writer.write_table(pa.Table.from_arrays(group.columns, schema=schema), row_group_size=ROW_GROUP_ROWS)
            rows += group.num_rows
    return rows


def file_schema(schema: pa.Schema, batches: Sequence[pa.RecordBatch]) -> pa.Schema:
    """``schema`` as one part's file declares it: each top-level column none of ``batches`` holds a
    null in is not nullable (Parquet ``REQUIRED``); nested fields keep their nullability.

    >>> b = pa.record_batch({"id": ["a", "b"], "note": ["x", None]})
    >>> [(f.name, f.nullable) for f in file_schema(b.schema, [b])]
    [('id', False), ('note', True)]
    """
    return pa.schema([field.with_nullable(False) if field.nullable and not pa.types.is_null(field.type)
                      and not any(batch.column(i).null_count for batch in batches) else field
                      for i, field in enumerate(schema)], metadata=schema.metadata)


def _row_groups(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """``batches`` gathered into tables of about ``ROW_GROUP_ROWS`` rows (at most about
    ``ROW_GROUP_BYTES``), each written as one row group (a larger one as several).

    The writer makes at least one row group of every table or batch it is handed, and a source of
    small batches is common: a fold reads its stretch through DuckDB, which hands over a batch per
    scanned chunk, one row each when the parts folded held one row. Written as they came, a part
    folded from 33,353 one-row commits held 33,353 row groups (17.9 MB instead of about 0.3 MB), so
    every reader paid for its footer and the policy then took it for a large part and never folded
    it again. Gathering holds no more than the batches of one row group.
    """
    held: list[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(batch)
        held_rows += batch.num_rows
        held_bytes += batch.nbytes
        if held_bytes >= ROW_GROUP_BYTES:
            yield pa.Table.from_batches(held)
            held, held_rows, held_bytes = [], 0, 0
        while held_rows >= ROW_GROUP_ROWS:  # whole row groups; what is over waits for the next
            table = pa.Table.from_batches(held)
            rest = table.slice(ROW_GROUP_ROWS)
            yield table.slice(0, ROW_GROUP_ROWS)
            held, held_rows, held_bytes = rest.to_batches(), rest.num_rows, rest.nbytes
    if held:
        yield pa.Table.from_batches(held)


@functools.lru_cache(maxsize=256)
def dictionary_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet column paths of ``schema``'s string, binary and dictionary leaves.

    >>> dictionary_columns(pa.schema({"id": pa.int64(), "s": pa.string(),
    ...                               "r": pa.struct({"t": pa.list_(pa.string())})}))
    ('s', 'r.t.list.element')
    """
    found: list[str] = []

    def walk(path: str, kind: pa.DataType) -> None:
        if pa.types.is_struct(kind):
            for child in kind:
                walk(f"{path}.{child.name}", child.type)
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            walk(f"{path}.list.element", kind.value_type)
        elif pa.types.is_map(kind):
            walk(f"{path}.key_value.key", kind.key_type)
            walk(f"{path}.key_value.value", kind.item_type)
        elif (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
              or pa.types.is_large_binary(kind) or pa.types.is_dictionary(kind)
              or pa.types.is_string_view(kind) or pa.types.is_binary_view(kind)):
            found.append(path)

    for field in schema:
        walk(field.name, field.type)
    return tuple(found)


def split_table(data: pa.Table, rows_per_part: int = PART_ROWS) -> list[pa.Table]:
    """``data`` cut into consecutive slices of at most ``rows_per_part`` rows (zero-copy)."""
    if data.num_rows <= rows_per_part:
        return [data]
    return [data.slice(start, rows_per_part) for start in range(0, data.num_rows, rows_per_part)]
