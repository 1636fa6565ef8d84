"""Clock columns read as comparable values: instants as instants, never as their text.

Implements the ``run.advance.unorderable-position`` half of decision "incremental-position-bound"
and the rule "compare like with like: clocks as instants" (CONVENTIONS.md).

A pull's clock column (the pipeline's ``incremental`` field) becomes one of three kinds:

- ``numeric``: integers, floats, decimals, compared as numbers;
- ``timestamp``: timestamp and date columns, and text columns whose every value is an ISO-8601
  stamp (``2026-03-01T10:00:05Z``, ``2026-03-01 10:00:05.5``, ``2026-03-01T11:00:05+01:00``,
  ``2026-03-01``), compared as integer microseconds since the epoch (UTC). A stamp without a zone
  reads as UTC, as a zoneless timestamp column does; finer fractions than a microsecond are cut
  (a clock compares at microsecond resolution; the last instant is re-read, so nothing is lost);
- ``text``: text columns of which no value is an ISO-8601 stamp, compared by code point.

A text column mixing stamps and other text has no order and fails the pull
(:class:`CursorPositionUnorderable` naming the first value that is not a stamp). So one fractional
second, which makes a page's column text, still compares as an instant: as text ``…05Z`` sorts
above ``…05.5Z``.

A ``types`` declaration for the clock field decides its kind: :meth:`ClockReader.typed` casts the
clock column to the declared type before it is read, reading ISO-8601 text as instants as above
(an Arrow cast would refuse a zoneless stamp for a zoned type).

Example::

    >>> import pyarrow as pa
    >>> instants_us(pa.array(["2026-03-01T10:00:05Z", "2026-03-01T10:00:05.5Z"])).to_pylist()
    [1772359205000000, 1772359205500000]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextful.engine.land.typed import apply_types
from contextful.storage.errors import CursorPositionUnorderable, TypedLandingFailed, first_line
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

CLOCK_KINDS = ("numeric", "timestamp", "text")
_STAMP = r"^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?$"
_HAS_TIME = r"^\d{4}-\d{2}-\d{2}[T ]"
_ZONED = r"(?:Z|[+-]\d{2}(?::?\d{2})?)$"


def clock_kind(data_type: pa.DataType) -> str | None:
    """The clock kind of a column type before its values are seen (text may turn out instants)."""
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type) or pa.types.is_decimal(data_type):
        return "numeric"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "text"
    if pa.types.is_timestamp(data_type) or pa.types.is_date(data_type):
        return "timestamp"
    return None


def stamp_shaped(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Per value: whether it is shaped as an ISO-8601 stamp."""
    return pc.match_substring_regex(column, _STAMP)


def instants_us(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """ISO-8601 text as int64 microseconds since the epoch (UTC); ValueError naming a bad value."""
    shaped = stamp_shaped(column)
    first = pc.index(shaped, False).as_py()
    if first >= 0:
        raise ValueError(f"{column[first].as_py()!r} is not an ISO-8601 stamp")
    has_time = pc.match_substring_regex(column, _HAS_TIME)
    text = pc.replace_substring_regex(column, r"(\.\d{6})\d+", r"\1")  # microseconds: cut finer digits
    text = pc.if_else(has_time, text, pc.binary_join_element_wise(text, "T00:00:00", ""))
    zoned = pc.and_(has_time, pc.match_substring_regex(column, _ZONED))
    text = pc.if_else(zoned, text, pc.binary_join_element_wise(text, "Z", ""))  # no zone: UTC
    try:
        return pc.cast(text, pa.timestamp("us", "UTC")).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(first_line(exc)) from exc


def instant_us(text: str) -> int | None:
    """One ISO-8601 stamp as microseconds since the epoch, None when it is not one."""
    try:
        return int(instants_us(pa.array([text], pa.string()))[0].as_py())
    except ValueError:
        return None


def clock_values(column: pa.Array | pa.ChunkedArray, kind: str) -> pa.Array | pa.ChunkedArray:
    """The column as comparable values: timestamps, dates and text stamps as UTC microseconds."""
    if kind != "timestamp":
        return column
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return instants_us(column)
    if pa.types.is_date(column.type):
        column = column.cast(pa.timestamp("us"))
    # finer units are cut to microseconds: monotone, so the order holds
    return pc.cast(column, pa.timestamp("us", column.type.tz), safe=False).cast(pa.int64())


class ClockReader:
    """The clock field across one pass: its kind stays fixed, every row has an orderable value."""

    def __init__(self, scope: str, table: str, field: str, clock: str | None = None,
                 declared: pa.DataType | None = None) -> None:
        self.scope = scope
        self.table = table
        self.field = field
        self.clock = clock
        self.declared = declared
        """The clock field's type under the pipeline's ``types``, if it declares one."""

    def typed(self, rows: pa.Table) -> pa.Table:
        """``rows`` with the clock column in its declared type (ISO-8601 text read as instants)."""
        index = rows.schema.get_field_index(self.field)
        if self.declared is None or index < 0 or rows.schema.field(index).type == self.declared:
            return rows
        column = rows.column(index)
        if pa.types.is_timestamp(self.declared) and clock_kind(column.type) == "text":
            try:
                instants = instants_us(column).cast(pa.timestamp("us", "UTC"))
            except ValueError as exc:
                raise TypedLandingFailed(self.table, self.field, str(self.declared), str(exc)) from exc
            if self.declared.tz is None:
                instants = instants.cast(pa.timestamp("us"))  # a zoneless column holds UTC wall time
            cast = pc.cast(instants, self.declared, safe=False)
            return rows.set_column(index, pa.field(self.field, self.declared), cast)
        return apply_types(self.table, rows, {self.field: self.declared})

    def values(self, table: pa.Table, where: str) -> pa.Array | pa.ChunkedArray | None:
        """The clock of every row of ``table`` as comparable values (None when it has no rows)."""
        if table.num_rows == 0:
            return None
        if self.field not in table.column_names:
            raise self._unorderable(f"{where}: {table.num_rows} row(s) have no {self.field!r} field")
        column = table.column(self.field)
        kind = clock_kind(column.type)
        if kind is None:
            if pa.types.is_null(column.type):
                raise self._unorderable(f"{where}: every value is null")
            raise self._unorderable(f"{where}: values of type {column.type} have no order")
        if column.null_count:
            raise self._unorderable(f"{where}: {column.null_count} row(s) hold no value")
        if kind == "text":
            shaped = stamp_shaped(column)
            if pc.all(shaped).as_py():
                kind = "timestamp"
            elif pc.any(shaped).as_py():
                odd = column[pc.index(shaped, False).as_py()].as_py()
                raise self._unorderable(f"{where}: text clocks mix ISO-8601 stamps and {odd!r}")
        if self.clock is not None and kind != self.clock:
            raise self._unorderable(f"{where}: positions switched from {self.clock} to {kind} mid-pass")
        try:
            values = clock_values(column, kind)
        except ValueError as exc:
            raise self._unorderable(f"{where}: {exc}") from exc
        if kind == "numeric" and pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py():
            raise self._unorderable(f"{where}: NaN has no order")
        self.clock = kind
        return values

    def _unorderable(self, detail: str) -> CursorPositionUnorderable:
        return CursorPositionUnorderable(self.scope, self.field, detail)


def span(values: pa.Array | pa.ChunkedArray | None) -> tuple[Any, Any] | None:
    """The least and greatest of ``values`` (None for none)."""
    if values is None or len(values) == 0:
        return None
    bounds = pc.min_max(values)
    return bounds["min"].as_py(), bounds["max"].as_py()
