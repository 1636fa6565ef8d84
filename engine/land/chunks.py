"""Regrouping decoded batches into the tables a run stages as parts.

A decoder yields batches of about 128 Ki rows; a part of about a million rows reads and compresses
better, and a group stops at :data:`PART_TARGET_BYTES` too, so a wide input's group stays within a
landing child's memory bound (``engine.land.input_landing``). A batch whose schema widens the ones before it (a later block widened a type: int64
meeting float64, an integer beyond 2**53 meeting a float as text, mixed kinds as text) takes the
batches before it in its group along, conformed to its schema (``decode_child.conform``): one
input lands one column type, and records the same downgrade events, however its blocks fall
(docs/normalization.md). A group already yielded (a million rows, or 64 MiB) keeps its schema; a batch that
does not widen the group's schema starts a new group. Every staged table has one schema.

Example::

    >>> import pyarrow as pa
    >>> batches = [pa.record_batch({"n": [1, 2]}), pa.record_batch({"n": [3]})]
    >>> [t.num_rows for t in coalesce(iter(batches), rows=2)]
    [2, 1]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_module("pyarrow")


PART_TARGET_ROWS = 1_000_000
PART_TARGET_BYTES = 64 * 1024 * 1024


def coalesce(batches: Iterator[pa.RecordBatch], rows: int = PART_TARGET_ROWS,
             max_bytes: int = PART_TARGET_BYTES) -> Iterator[pa.Table]:
    """``batches`` regrouped into tables of at least ``rows`` rows or ``max_bytes`` Arrow bytes (the
    last may hold fewer)."""
    pending: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        if pending and batch.schema != pending[0].schema:  # a later block widened the schema
            widened = _widened(pending, batch.schema)
            if widened is None:
                yield pa.Table.from_batches(pending)
                pending, count, size = [], 0, 0
            else:
                pending = widened
        pending.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if count >= rows or size >= max_bytes:
            yield pa.Table.from_batches(pending)
            pending, count, size = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending)


def _widened(pending: list[pa.RecordBatch], schema: pa.Schema) -> list[pa.RecordBatch] | None:
    """``pending`` conformed to ``schema``, a widening of theirs (None: it is not one)."""
    from contextful.engine.land.decode_child import conform

    if not set(pending[0].schema.names) <= set(schema.names):
        return None
    try:
        return conform(pa.Table.from_batches(pending), schema).to_batches()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
