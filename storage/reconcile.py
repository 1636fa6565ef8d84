"""Schema reconciliation: how an arriving Arrow schema lands in a table's schema.

Implements the decisions "observed-batch-fixes" (``run.land.irreconcilable-schema``) and
"table-commit-owns" (``run.record.schema-diff-shape``): :func:`reconcile` merges the table's
schema with the arriving one and names every type change as a :class:`DowngradeEvent`;
:func:`conform` casts an arriving batch to the landed schema, columnar and recursive.

The widening rules (also in docs/store.md):

- a new column, or a new struct field at any depth, joins nullable; earlier rows read null;
- integers widen to the narrowest signed or unsigned integer holding both; an integer meeting a
  float lands as float64; float32 meeting float64 lands as float64;
- decimals widen to hold both integer digits and scale (precision <= 38), an integer meeting a
  decimal widens the decimal, a float meeting a decimal lands as float64;
- timestamps take the finer unit; two different time zones land in UTC; a date meeting a
  timestamp lands as a timestamp; times and durations take the finer unit;
- lists, large lists and fixed-size lists merge their element types; maps merge keys and items;
- representation-only differences (string/large_string/string_view, binary variants, list
  variants, dictionary encoding, an all-null ``null`` column) land in the table's representation
  and are not events.

Everything else — a struct meeting a scalar, text meeting a number, a naive timestamp meeting a
zoned one, a boolean meeting a number — raises :class:`SchemaIrreconcilable` (incompatible).

A primary key column takes a widening only when the landed type holds every value of both types
exactly (:func:`holds_exactly`): keys compare as exact values, so int64 meeting a float (distinct
keys above 2**53 would read equal and merge), a decimal widened past precision 38 into float64, or
uint64 meeting a signed integer raise :class:`PrimaryKeyWideningLossy` instead of an event. The
``order_by`` column of a keyed table is guarded alike (:class:`OrderByWideningLossy`): its values
decide which row wins a key, so a widening that made two of them equal would change the winner,
and a fold made before it would answer differently from the unfolded table. No rule ever lands a
non-text value as text, for any column.

Example::

    >>> import pyarrow as pa
    >>> r = reconcile("t", pa.schema([("a", pa.int32())]), pa.schema([("a", pa.float64()), ("b", pa.string())]))
    >>> r.schema
    a: double
    b: string
    >>> [(e.path, e.source_type, e.landed_type) for e in r.events]
    [('a', 'double', 'double')]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import OrderByWideningLossy, PrimaryKeyWideningLossy, SchemaIrreconcilable
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

_TIME_UNITS = ("s", "ms", "us", "ns")


@dataclass(frozen=True)
class DowngradeEvent:
    """One type change a committed run carries as evidence (``run.record.schema-diff-shape``)."""

    table: str
    path: str
    source_type: str
    landed_type: str
    reason: str
    kind: str = "downgrade"
    """``widening`` when the landed type holds every value of both types exactly (int32 to int64,
    date to timestamp, a decimal grown to hold both: :func:`holds_exactly`); ``downgrade`` when a
    value may change (int64 meeting a float lands as float64, which rounds integers beyond 2**53).
    Events recorded before the distinction read as downgrades."""
    table_type: str = ""
    """The column's type in the table before this run ("" in events recorded before it was kept)."""

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DowngradeEvent:
        return cls(**data)


@dataclass(frozen=True)
class Reconciliation:
    schema: pa.Schema
    """The table's schema once this batch lands."""
    changed: bool
    """Whether the table's schema differs from before (a new column or a widened type)."""
    events: tuple[DowngradeEvent, ...]


def canonical_type(t: pa.DataType) -> pa.DataType:
    """The representation a new column lands in: views and dictionaries decoded."""
    if pa.types.is_dictionary(t):
        return canonical_type(t.value_type)
    if t == pa.string_view():
        return pa.large_string()
    if t == pa.binary_view():
        return pa.large_binary()
    if pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(canonical_type(t.value_type))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(canonical_type(t.value_type)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(canonical_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(canonical_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(canonical_type(t.key_type), canonical_type(t.item_type))
    return t


def reconcile(table: str, current: pa.Schema | None, arriving: pa.Schema,
              primary_key: tuple[str, ...] = (), order_by: str | None = None) -> Reconciliation:
    """Merge ``arriving`` into ``current`` (None for a new table); raise if irreconcilable, or if a
    ``primary_key`` column or the ``order_by`` column would land in a type that does not hold every
    value of both exactly."""
    arriving = pa.schema([f.with_type(canonical_type(f.type)) for f in arriving])
    if current is None:
        return Reconciliation(_nullable(arriving), True, ())
    merger = _Merger(table)
    fields = []
    by_name = {f.name: f for f in arriving}
    for field in current:
        if field.name in by_name:
            got = by_name[field.name].type
            landed = merger.merge(field.name, field.type, got)
            if (field.name in primary_key or field.name == order_by) and \
                    not (holds_exactly(landed, field.type) and holds_exactly(landed, got)):
                if field.name in primary_key:
                    raise PrimaryKeyWideningLossy(
                        table, field.name, str(field.type), str(got),
                        f"primary key column would land as {landed}, which does not hold every key of both exactly")
                raise OrderByWideningLossy(
                    table, field.name, str(field.type), str(got),
                    f"order_by column would land as {landed}, which does not hold every value of both exactly")
            fields.append(field.with_type(landed))
        else:
            fields.append(field)
    known = set(current.names)
    fields.extend(f.with_nullable(True) for f in arriving if f.name not in known)
    schema = pa.schema(fields, metadata=current.metadata)
    return Reconciliation(schema, not schema.equals(current), tuple(merger.events))


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)


class _Merger:
    def __init__(self, table: str) -> None:
        self.table = table
        self.events: list[DowngradeEvent] = []

    def fail(self, path: str, have: pa.DataType, got: pa.DataType, reason: str) -> SchemaIrreconcilable:
        return SchemaIrreconcilable(self.table, path, str(have), str(got), reason)

    def event(self, path: str, have: pa.DataType, got: pa.DataType, landed: pa.DataType, reason: str) -> None:
        lossless = holds_exactly(landed, have) and holds_exactly(landed, got)
        self.events.append(DowngradeEvent(self.table, path, str(got), str(landed), reason,
                                          "widening" if lossless else "downgrade", str(have)))

    def merge(self, path: str, have: pa.DataType, got: pa.DataType) -> pa.DataType:
        """The landed type of a column the table has as ``have`` and the batch brings as ``got``."""
        if have == got or pa.types.is_null(got):
            return have
        if pa.types.is_null(have):
            return got
        if _representation(have) is not None and _representation(have) == _representation(got):
            return self.merge_nested(path, have, got)
        landed = self.merge_scalar(path, have, got)
        if landed != got:
            self.event(path, have, got, landed, f"{got} lands as {landed} (table column is {have})")
        elif landed != have:
            self.event(path, have, got, landed, f"column widened from {have} to {landed}")
        return landed

    def merge_nested(self, path: str, have: pa.DataType, got: pa.DataType) -> pa.DataType:
        kind = _representation(have)
        if kind in ("string", "binary"):
            return have
        if kind == "list":
            value = self.merge(f"{path}[]", have.value_type, got.value_type)
            return _with_value(have, value)
        if kind == "struct":
            names = {f.name: f for f in got}
            fields = [
                f.with_type(self.merge(f"{path}.{f.name}", f.type, names[f.name].type)) if f.name in names else f
                for f in have
            ]
            known = {f.name for f in have}
            fields.extend(f.with_nullable(True) for f in got if f.name not in known)
            return pa.struct(fields)
        # map
        key = self.merge(f"{path}{{key}}", have.key_type, got.key_type)
        item = self.merge(f"{path}{{value}}", have.item_type, got.item_type)
        return pa.map_(key, item)

    def merge_scalar(self, path: str, have: pa.DataType, got: pa.DataType) -> pa.DataType:
        shapes = {_representation(have), _representation(got)} - {None}
        if shapes & {"list", "struct", "map"}:
            raise self.fail(path, have, got, "nested and scalar shapes, or different nested shapes")
        if shapes:
            raise self.fail(path, have, got, "text or bytes meeting another kind of value")
        if _is_number(have) and _is_number(got):
            return self.merge_number(path, have, got)
        if _is_temporal(have) and _is_temporal(got):
            return self.merge_temporal(path, have, got)
        raise self.fail(path, have, got, "no common type that keeps both")

    def merge_number(self, path: str, have: pa.DataType, got: pa.DataType) -> pa.DataType:
        if pa.types.is_integer(have) and pa.types.is_integer(got):
            return _merge_ints(have, got)
        if pa.types.is_floating(have) or pa.types.is_floating(got):
            return pa.float64()
        # at least one decimal, the other decimal or integer
        p1, s1 = _decimal_shape(have)
        p2, s2 = _decimal_shape(got)
        scale = max(s1, s2)
        precision = max(p1 - s1, p2 - s2) + scale
        if precision > 38:
            return pa.float64()
        return pa.decimal128(precision, scale)

    def merge_temporal(self, path: str, have: pa.DataType, got: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(have) or pa.types.is_timestamp(got):
            if not (pa.types.is_timestamp(have) or pa.types.is_date(have)):
                raise self.fail(path, have, got, "a time of day and a timestamp")
            if not (pa.types.is_timestamp(got) or pa.types.is_date(got)):
                raise self.fail(path, have, got, "a time of day and a timestamp")
            tz_have = have.tz if pa.types.is_timestamp(have) else None
            tz_got = got.tz if pa.types.is_timestamp(got) else None
            if pa.types.is_timestamp(have) and pa.types.is_timestamp(got) and (tz_have is None) != (tz_got is None):
                raise self.fail(path, have, got, "a timestamp without time zone and one with")
            tz = tz_have if tz_have == tz_got else (tz_have or tz_got)
            if tz_have and tz_got and tz_have != tz_got:
                tz = "UTC"
            return pa.timestamp(_finer(_unit(have), _unit(got)), tz=tz)
        if pa.types.is_date(have) and pa.types.is_date(got):
            return pa.date32()
        if _is_time(have) and _is_time(got):
            unit = _finer(have.unit, got.unit)
            return pa.time64(unit) if unit in ("us", "ns") else pa.time32(unit)
        if pa.types.is_duration(have) and pa.types.is_duration(got):
            return pa.duration(_finer(have.unit, got.unit))
        raise self.fail(path, have, got, "no common type that keeps both")


def _representation(t: pa.DataType) -> str | None:
    """The shape family a type belongs to when its variants differ only in representation."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or t == pa.string_view():
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or t == pa.binary_view():
        return "binary"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_struct(t):
        return "struct"
    if pa.types.is_map(t):
        return "map"
    return None


def _with_value(list_type: pa.DataType, value: pa.DataType) -> pa.DataType:
    field = list_type.value_field.with_type(value)
    return pa.large_list(field) if pa.types.is_large_list(list_type) else pa.list_(field)


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _is_time(t: pa.DataType) -> bool:
    return pa.types.is_time32(t) or pa.types.is_time64(t)


def _is_temporal(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t) or _is_time(t) or pa.types.is_duration(t)


def _unit(t: pa.DataType) -> str:
    return t.unit if pa.types.is_timestamp(t) else "s"


def _finer(a: str, b: str) -> str:
    return _TIME_UNITS[max(_TIME_UNITS.index(a), _TIME_UNITS.index(b))]


def _merge_ints(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    signed = pa.types.is_signed_integer(a) or pa.types.is_signed_integer(b)
    bits = max(a.bit_width + (1 if signed and not pa.types.is_signed_integer(a) else 0),
               b.bit_width + (1 if signed and not pa.types.is_signed_integer(b) else 0))
    for width in (8, 16, 32, 64):
        if bits <= width:
            return getattr(pa, f"{'int' if signed else 'uint'}{width}")()
    return pa.int64()  # uint64 meeting a signed integer: values past 2**63 fail at conform


def _decimal_shape(t: pa.DataType) -> tuple[int, int]:
    if pa.types.is_decimal(t):
        return t.precision, t.scale
    return _int_digits(t), 0


def _int_digits(t: pa.DataType) -> int:
    """Decimal digits of the largest magnitude an integer type holds (uint64: 20)."""
    return {8: 3, 16: 5, 32: 10, 64: 19}[t.bit_width] + (1 if t == pa.uint64() else 0)


def holds_exactly(wide: pa.DataType, narrow: pa.DataType) -> bool:
    """Whether every value of ``narrow`` lands in ``wide`` as a distinct, exact value.

    >>> holds_exactly(pa.float64(), pa.int32()), holds_exactly(pa.float64(), pa.int64())
    (True, False)
    >>> holds_exactly(pa.decimal128(21, 2), pa.int64()), holds_exactly(pa.int64(), pa.uint64())
    (True, False)
    """
    wide, narrow = canonical_type(wide), canonical_type(narrow)
    if wide == narrow or pa.types.is_null(narrow):
        return True
    kind = _representation(wide)
    if kind is not None or _representation(narrow) is not None:
        if kind != _representation(narrow):
            return False
        if kind == "list":
            return holds_exactly(wide.value_type, narrow.value_type)
        if kind == "struct":
            fields = {f.name: f.type for f in wide}
            return all(f.name in fields and holds_exactly(fields[f.name], f.type) for f in narrow)
        if kind == "map":
            return holds_exactly(wide.key_type, narrow.key_type) and holds_exactly(wide.item_type, narrow.item_type)
        return True  # string or binary flavours
    if pa.types.is_integer(wide):
        if not pa.types.is_integer(narrow):
            return False
        if pa.types.is_signed_integer(wide):
            return wide.bit_width > narrow.bit_width or (
                wide.bit_width == narrow.bit_width and pa.types.is_signed_integer(narrow))
        return not pa.types.is_signed_integer(narrow) and wide.bit_width >= narrow.bit_width
    if pa.types.is_floating(wide):
        mantissa = {16: 11, 32: 24, 64: 53}[wide.bit_width]
        if pa.types.is_floating(narrow):
            return wide.bit_width >= narrow.bit_width
        return pa.types.is_integer(narrow) and narrow.bit_width - (1 if pa.types.is_signed_integer(narrow) else 0) <= mantissa
    if pa.types.is_decimal(wide):
        if not (pa.types.is_integer(narrow) or pa.types.is_decimal(narrow)):
            return False
        precision, scale = _decimal_shape(narrow)
        return wide.scale >= scale and wide.precision - wide.scale >= precision - scale
    if pa.types.is_timestamp(wide):
        return pa.types.is_date(narrow) or (
            pa.types.is_timestamp(narrow) and (wide.tz is None) == (narrow.tz is None)
            and _TIME_UNITS.index(wide.unit) >= _TIME_UNITS.index(narrow.unit))
    if pa.types.is_date(wide):
        return pa.types.is_date(narrow)
    if _is_time(wide) or pa.types.is_duration(wide):
        same_kind = _is_time(narrow) if _is_time(wide) else pa.types.is_duration(narrow)
        return same_kind and _TIME_UNITS.index(wide.unit) >= _TIME_UNITS.index(narrow.unit)
    return False


# --- conform: cast arriving data to the landed schema ------------------------------------------


def conform(data: pa.Table, schema: pa.Schema, table: str = "") -> pa.Table:
    """``data`` in ``schema``: columns ordered, missing ones null, types cast recursively."""
    if data.schema.equals(schema):
        return data
    columns = []
    for field in schema:
        if field.name in data.column_names:
            column = data.column(field.name)
            try:
                chunks = [_conform_array(chunk, field.type) for chunk in column.chunks]
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaIrreconcilable(table, field.name, str(field.type), str(column.type), str(exc)) from exc
            columns.append(pa.chunked_array(chunks, type=field.type))
        else:
            columns.append(pa.nulls(data.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _conform_array(arr: pa.Array, target: pa.DataType) -> pa.Array:
    if arr.type == target:
        return arr
    if pa.types.is_null(arr.type) or len(arr) == 0:
        return pa.nulls(len(arr), target)
    if pa.types.is_dictionary(arr.type):
        return _conform_array(arr.dictionary_decode(), target)
    if pa.types.is_struct(target):
        names = {arr.type.field(i).name: i for i in range(arr.type.num_fields)}
        children = [
            _conform_array(arr.field(names[f.name]), f.type) if f.name in names else pa.nulls(len(arr), f.type)
            for f in target
        ]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        if pa.types.is_fixed_size_list(arr.type) or _is_view(arr.type):
            arr = arr.cast(pa.large_list(arr.type.value_type))
        offsets = arr.offsets
        first, last = offsets[0].as_py(), offsets[-1].as_py()
        values = _conform_array(arr.values.slice(first, last - first), target.value_type)
        offset_type = pa.int64() if pa.types.is_large_list(target) else pa.int32()
        offsets = pc.subtract(offsets.cast(pa.int64()), first).cast(offset_type)  # rebased: no slice offset
        factory = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
        mask = arr.is_null() if arr.null_count else None
        return factory.from_arrays(offsets, values, type=target, mask=mask)
    return pc.cast(arr, target, safe=True)


def _is_view(t: pa.DataType) -> bool:
    return pa.types.is_list_view(t) or pa.types.is_large_list_view(t)
