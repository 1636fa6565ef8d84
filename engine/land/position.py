"""Incremental positions: a cursor value bound to the field it was measured on.

Decision "incremental-position-bound": a cursor value means nothing without its field.

- ``run.advance.field-rename``: :func:`open_position` compares the stored position's field with the
  pipeline's declared ``incremental`` field and raises :class:`CursorFieldMismatch` on a difference.
  Callers open the position before building any request, so nothing leaves the host.
- ``run.advance.unorderable-position``: :class:`ClockTracker` reads each pull's clock column
  (vectorized: ``pyarrow.compute`` min/max and null counts) and raises
  :class:`CursorPositionUnorderable` for a row with no orderable value (null, or the column
  missing) or a stream switching between text, numeric and timestamp positions mid-pass.

A position is a JSON object stored as the pipeline's catalog cursor:

``{"kind": "watermark", "field": f, "clock": c, "watermark": v}``
    a finished walk: the next walk starts after ``v``;
``{"kind": "walk", "field": f, "clock": c, "floor": v0, "token": t, "frontier": v}``
    a checkpoint inside a watermark walk: the walk started after ``v0`` (its floor), the next page
    is ``t``, and the rows committed so far reach ``v``.

``clock`` is ``numeric``, ``text`` or ``timestamp``; a timestamp is kept as integer microseconds
since the epoch (UTC), a number or a text as itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from storage.errors import CursorFieldMismatch, CursorPositionUnorderable

POSITION_KINDS = ("watermark", "walk")


@dataclass(frozen=True)
class Position:
    field: str | None
    clock: str | None = None
    watermark: Any = None
    """Rows after this value are new (None: from the beginning)."""
    token: Any = None
    """Inside a walk: the next page's token."""
    frontier: Any = None
    """Inside a walk: the greatest clock committed so far."""

    @property
    def in_walk(self) -> bool:
        return self.token is not None

    def to_json(self) -> dict[str, Any]:
        if self.token is not None:
            return {"kind": "walk", "field": self.field, "clock": self.clock, "floor": self.watermark,
                    "token": self.token, "frontier": self.frontier}
        return {"kind": "watermark", "field": self.field, "clock": self.clock, "watermark": self.watermark}


def open_position(scope: str, stored: dict[str, Any] | None, declared: str | None) -> Position:
    """The stored position of ``scope`` for a pipeline declaring ``incremental = declared``."""
    if stored is None:
        return Position(declared)
    field = stored.get("field")
    if field != declared:
        raise CursorFieldMismatch(scope, field, declared)
    if stored.get("kind") == "walk":
        return Position(field, stored.get("clock"), stored.get("floor"), stored.get("token"), stored.get("frontier"))
    return Position(field, stored.get("clock"), stored.get("watermark"))


def clock_kind(data_type: pa.DataType) -> str | None:
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return "numeric"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "text"
    if pa.types.is_timestamp(data_type) or pa.types.is_date(data_type):
        return "timestamp"
    return None


def clock_values(column: pa.ChunkedArray | pa.Array, kind: str) -> pa.ChunkedArray | pa.Array:
    """The column as comparable values: timestamps and dates as UTC microseconds."""
    if kind != "timestamp":
        return column
    if pa.types.is_date(column.type):
        column = column.cast(pa.timestamp("us"))
    return column.cast(pa.timestamp("us", column.type.tz)).cast(pa.int64())


def since_text(value: Any, clock: str | None) -> str:
    """A watermark as a request parameter: timestamps as ISO-8601 UTC with a ``Z``."""
    if clock == "timestamp":
        stamp = datetime.fromtimestamp(value / 1e6, tz=UTC)
        text = stamp.strftime("%Y-%m-%dT%H:%M:%S") + (f".{stamp.microsecond:06d}" if stamp.microsecond else "")
        return text + "Z"
    return str(value)


class ClockTracker:
    """The clock field across one pass: its kind stays fixed, every row has an orderable value."""

    def __init__(self, scope: str, field: str, clock: str | None = None) -> None:
        self.scope = scope
        self.field = field
        self.clock = clock

    def span(self, table: pa.Table, where: str) -> tuple[Any, Any] | None:
        """The least and greatest clock of ``table`` (None when it has no rows)."""
        if table.num_rows == 0:
            return None
        if self.field not in table.column_names:
            raise CursorPositionUnorderable(self.scope, self.field, f"{where}: {table.num_rows} row(s) have no "
                                                                    f"{self.field!r} field")
        column = table.column(self.field)
        kind = clock_kind(column.type)
        if kind is None:
            if pa.types.is_null(column.type):
                raise CursorPositionUnorderable(self.scope, self.field, f"{where}: every value is null")
            raise CursorPositionUnorderable(self.scope, self.field, f"{where}: values of type {column.type} "
                                                                    "have no order")
        if self.clock is not None and kind != self.clock:
            raise CursorPositionUnorderable(self.scope, self.field, f"{where}: positions switched from "
                                                                    f"{self.clock} to {kind} mid-pass")
        nulls = column.null_count
        if nulls:
            raise CursorPositionUnorderable(self.scope, self.field, f"{where}: {nulls} row(s) hold no value")
        values = clock_values(column, kind)
        if kind == "numeric" and pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py():
            raise CursorPositionUnorderable(self.scope, self.field, f"{where}: NaN has no order")
        self.clock = kind
        bounds = pc.min_max(values)
        return bounds["min"].as_py(), bounds["max"].as_py()

    def after(self, table: pa.Table, floor: Any) -> pa.Table:
        """The rows of ``table`` whose clock passes ``floor`` (all of them when there is no floor)."""
        if floor is None or table.num_rows == 0:
            return table
        assert self.clock is not None
        values = clock_values(table.column(self.field), self.clock)
        return table.filter(pc.greater(values, pa.scalar(floor, values.type)))
