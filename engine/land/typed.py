"""Typed landing: the ``types`` object of a pull, read and applied.

Implements ``run.land.typed-pull`` (decision "observed-batch-fixes"): a pull's ``types`` maps a
column to a type spelling; the run commit lands that column in that type, and a spelling this
module cannot read fails the pull as incompatible (``TypeSpellingUnreadable``). Values that do not
read as the declared type fail the batch as ``TypedLandingFailed``.

Spellings, case-insensitive, Arrow's or SQL's (docs/manifest.md)::

    bool boolean | int8 int16 int32 int64 uint8 … uint64 | tinyint smallint int integer bigint
    float32 real float4 | float64 double float8 | string utf8 large_string varchar text
    binary blob bytea | date date32 | time64[us] time | timestamp[us] timestamp
    timestamp[us, UTC] timestamp[ms, tz=Europe/Paris] timestamptz | duration[s]
    decimal(10, 2) decimal128(10, 2) numeric(10, 2)
    list<int64> bigint[] | struct<a: int64, b: string> | map<string, int64>

Example::

    >>> parse_type("decimal(10, 2)")
    Decimal128Type(decimal128(10, 2))
    >>> str(parse_type("struct<id: bigint, tags: list<varchar>>"))
    'struct<id: int64, tags: list<item: string>>'
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import (
    ContextfulError,
    ManifestValueInvalid,
    TypedLandingFailed,
    TypeSpellingUnreadable,
    first_line,
)
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")


@functools.cache
def _simple_types() -> dict[str, pa.DataType]:
    """The type names a spelling may use alone (built on first use: no pyarrow at import)."""
    return {
        "bool": pa.bool_(), "boolean": pa.bool_(),
        "int8": pa.int8(), "tinyint": pa.int8(), "int16": pa.int16(), "smallint": pa.int16(),
        "int32": pa.int32(), "int": pa.int32(), "integer": pa.int32(), "int64": pa.int64(), "bigint": pa.int64(),
        "uint8": pa.uint8(), "utinyint": pa.uint8(), "uint16": pa.uint16(), "usmallint": pa.uint16(),
        "uint32": pa.uint32(), "uinteger": pa.uint32(), "uint64": pa.uint64(), "ubigint": pa.uint64(),
        "float16": pa.float16(), "halffloat": pa.float16(),
        "float32": pa.float32(), "float": pa.float32(), "real": pa.float32(), "float4": pa.float32(),
        "float64": pa.float64(), "double": pa.float64(), "float8": pa.float64(),
        "string": pa.string(), "utf8": pa.string(), "varchar": pa.string(), "text": pa.string(),
        "large_string": pa.large_string(), "large_utf8": pa.large_string(),
        "binary": pa.binary(), "blob": pa.binary(), "bytea": pa.binary(), "large_binary": pa.large_binary(),
        "date": pa.date32(), "date32": pa.date32(), "date64": pa.date64(),
        "time": pa.time64("us"), "timestamp": pa.timestamp("us"), "datetime": pa.timestamp("us"),
        "timestamptz": pa.timestamp("us", tz="UTC"), "timestamp with time zone": pa.timestamp("us", tz="UTC"),
        "null": pa.null(),
    }


_TOKEN = re.compile(r"\s*(<|>|\[\]|\[|\]|\(|\)|,|:|=|[A-Za-z_][A-Za-z0-9_/+\-]*|\d+)")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise ValueError(f"unexpected {text[pos:]!r}")
            self.tokens.append(match.group(1))
            pos = match.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.lower() != expected):
            raise ValueError(f"expected {expected or 'a type'} at {' '.join(self.tokens[self.i:]) or 'the end'!r}")
        self.i += 1
        return token

    def parse(self) -> pa.DataType:
        result = self.type_()
        if self.peek() is not None:
            raise ValueError(f"unexpected {' '.join(self.tokens[self.i:])!r} after the type")
        return result

    def type_(self) -> pa.DataType:
        result = self.base()
        while self.peek() == "[]":
            self.take()
            result = pa.list_(result)
        return result

    def base(self) -> pa.DataType:
        name = self.take().lower()
        if name == "timestamp" and self.peek() is not None and self.peek().lower() == "with":  # type: ignore[union-attr]
            for word in ("with", "time", "zone"):
                self.take(word)
            return pa.timestamp("us", tz="UTC")
        if name in ("timestamp", "time32", "time64", "duration") and self.peek() == "[":
            self.take("[")
            unit = self.take().lower()
            tz = None
            if name == "timestamp" and self.peek() == ",":
                self.take(",")
                if self.i + 1 < len(self.tokens) and self.tokens[self.i + 1] == "=":
                    self.take("tz")
                    self.take("=")
                tz = self.take()
            self.take("]")
            if unit not in ("s", "ms", "us", "ns"):
                raise ValueError(f"unknown time unit {unit!r}")
            if name == "timestamp":
                return pa.timestamp(unit, tz=_known_zone(tz))
            if name == "duration":
                return pa.duration(unit)
            return pa.time32(unit) if name == "time32" else pa.time64(unit)
        if name in ("decimal", "decimal128", "numeric"):
            self.take("(")
            precision = int(self.take())
            self.take(",")
            scale = int(self.take())
            self.take(")")
            return pa.decimal128(precision, scale)
        if name in ("list", "large_list"):
            self.take("<")
            value = self.type_()
            self.take(">")
            return pa.list_(value) if name == "list" else pa.large_list(value)
        if name == "map":
            self.take("<")
            key = self.type_()
            self.take(",")
            item = self.type_()
            self.take(">")
            return pa.map_(key, item)
        if name == "struct":
            self.take("<")
            fields = []
            while True:
                field_name = self.take()
                self.take(":")
                fields.append(pa.field(field_name, self.type_()))
                if self.peek() == ",":
                    self.take(",")
                    continue
                break
            self.take(">")
            return pa.struct(fields)
        simple = _simple_types()
        if name in simple:
            return simple[name]
        raise ValueError(f"unknown type {name!r}")


def _known_zone(tz: str | None) -> str | None:
    """``tz`` when Arrow's time zone database knows it (pyarrow builds a type with any zone name and
    fails only when a value is converted: at landing, or in a reader)."""
    if tz is not None:
        try:
            pa.array([0], pa.timestamp("s", tz=tz)).cast(pa.string())
        except pa.ArrowInvalid:
            raise ValueError(f"unknown time zone {tz!r}: give a time zone database name such as UTC or "
                             f"Europe/Paris") from None
    return tz


def parse_type(spelling: str, column: str = "", pipeline: str | None = None) -> pa.DataType:
    """The Arrow type ``spelling`` names; TypeSpellingUnreadable (naming ``pipeline`` when given)
    when it names none."""
    try:
        return _Parser(spelling.strip()).parse()
    except (ValueError, pa.ArrowInvalid) as exc:
        raise TypeSpellingUnreadable(column, spelling, str(exc), pipeline) from exc


def types_problems(where: str, types: Any, pipeline: str | None = None) -> list[ContextfulError]:
    """Every problem of a ``types`` object as a manifest or ``table load --types`` gives it: not a map
    of column names to spellings (``ManifestValueInvalid`` naming ``where``), or a spelling that names
    no type (``TypeSpellingUnreadable``, naming ``pipeline`` when given)."""
    if not isinstance(types, dict) or not all(isinstance(v, str) for v in types.values()):
        return [ManifestValueInvalid(where, "types", "must map column names to type spellings (strings)")]
    problems: list[ContextfulError] = []
    for column, spelling in types.items():
        try:
            parse_type(spelling, column, pipeline)
        except ContextfulError as exc:
            problems.append(exc)
    return problems


def read_types(types: dict[str, str]) -> dict[str, pa.DataType]:
    """Every spelling of a ``types`` object read (the first unreadable one raises)."""
    return {column: parse_type(spelling, column) for column, spelling in types.items()}


def declared_type(arrived: pa.DataType, declared: pa.DataType) -> pa.DataType:
    """The type a declaration gives a column that arrived as ``arrived``: it types what it names.

    A struct declaration types the fields it names and keeps the others as they arrived (in their
    order, the declared fields it adds last); a list declaration does the same for its elements.
    Any other declaration is the type.

    >>> str(declared_type(pa.struct([("a", pa.string()), ("b", pa.string())]), pa.struct([("a", pa.int64())])))
    'struct<a: int64, b: string>'
    """
    if pa.types.is_struct(declared) and pa.types.is_struct(arrived):
        named = {f.name: f for f in declared}
        fields = [f.with_type(declared_type(f.type, named[f.name].type)) if f.name in named else f for f in arrived]
        kept = {f.name for f in arrived}
        return pa.struct(fields + [f for f in declared if f.name not in kept])
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(t(declared) for t in lists) and any(t(arrived) for t in lists):
        value = declared.value_field.with_type(declared_type(arrived.value_type, declared.value_type))
        return pa.large_list(value) if pa.types.is_large_list(declared) else pa.list_(value)
    return declared


class RowRefused(ValueError):
    """A cast refused one value: ``row`` is its 0-based row in the array cast, ``reason`` says why
    (:func:`apply_types` names the row in its input)."""

    def __init__(self, row: int, reason: str) -> None:
        super().__init__(reason)
        self.row = row
        self.reason = reason


def apply_types(table_name: str, data: pa.Table, types: dict[str, pa.DataType], first_row: int = 0) -> pa.Table:
    """``data`` with each declared column cast to its declared type (absent columns stay absent);
    a struct's undeclared fields stay as they arrived (:func:`declared_type`). A value the type does
    not hold fails as TypedLandingFailed naming its 1-based row, ``first_row`` being the position of
    ``data``'s first row in its input."""
    for column, declared in types.items():
        index = data.schema.get_field_index(column)
        if index < 0:
            continue
        target = declared_type(data.schema.field(index).type, declared)
        if data.schema.field(index).type == target:
            continue
        chunks, before = [], first_row
        try:
            for chunk in data.column(index).chunks:
                chunks.append(_cast(chunk, target))
                before += len(chunk)
        except RowRefused as exc:
            raise TypedLandingFailed(table_name, column, str(declared), exc.reason, before + exc.row + 1) from exc
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise TypedLandingFailed(table_name, column, str(declared), first_line(exc)) from exc
        data = data.set_column(index, pa.field(column, target), pa.chunked_array(chunks, type=target))
    return data


def _cast(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target``, struct by struct: a field under a null struct is not read (Arrow's
    cast reads it, and fails on the empty text a null struct holds)."""
    if pa.types.is_struct(target) and pa.types.is_struct(array.type):
        children = dict(zip((f.name for f in array.type), array.flatten(), strict=True))
        fields = [_cast(children[f.name], f.type) if f.name in children else pa.nulls(len(array), f.type)
                  for f in target]
        return pa.StructArray.from_arrays(fields, fields=list(target), mask=array.is_null() if array.null_count else None)
    if (pa.types.is_list(target) or pa.types.is_large_list(target)) and \
            (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        first, last = array.offsets[0].as_py(), array.offsets[-1].as_py()
        try:
            values = _cast(array.values.slice(first, last - first), target.value_type)  # flatten() skips null lists
        except RowRefused as exc:  # a value of a list: name the row holding the list
            import numpy as np

            holder = int(np.searchsorted(array.offsets.to_numpy(), first + exc.row, side="right")) - 1
            raise RowRefused(holder, exc.reason) from None
        offsets = pc.subtract(array.offsets.cast(pa.int64()), first)
        offsets = offsets.cast(pa.int64() if pa.types.is_large_list(target) else pa.int32())
        factory = pa.LargeListArray if pa.types.is_large_list(target) else pa.ListArray
        return factory.from_arrays(offsets, values, type=target, mask=array.is_null() if array.null_count else None)
    if pa.types.is_timestamp(target) and (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return text_to_timestamp(array, target)
    if pa.types.is_decimal(target) and pa.types.is_floating(array.type):
        return text_to_decimal(pc.cast(array, pa.string()), target, array.type)
    if pa.types.is_decimal(target) and (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        return text_to_decimal(array, target, array.type)
    cast = pc.cast(array, target, safe=True)
    _check_exact(array, cast)
    return cast


def text_to_decimal(text: pa.Array, target: pa.DataType, arrived: pa.DataType) -> pa.Array:
    """Numbers written as ``text`` as the decimal ``target``, read from the text: ``4.81`` is 4.81.

    Floats come here as their shortest round-trip text (Arrow's float-to-string cast, what Python's
    ``repr`` prints, and what a JSON or CSV source wrote for any number a double holds), so 4.81 is
    never the binary double's 4.8100000000000005. A value whose text the decimal does not hold
    (``4.815`` at scale 2, ``1e+300``, ``nan``) is refused, naming it (as ``arrived``) and its row;
    nothing is rounded.

    >>> text_to_decimal(pa.array(["4.81", None]), pa.decimal128(10, 2), pa.float64()).to_pylist()
    [Decimal('4.81'), None]
    """
    try:
        return pc.cast(text, target, safe=True)
    except pa.ArrowInvalid:
        pass
    for row, value in enumerate(text.to_pylist()):  # a failing batch only: name its first value
        try:
            pc.cast(pa.array([value], pa.string()), target, safe=True)
        except pa.ArrowInvalid as exc:
            raise RowRefused(row, f"{value} ({arrived}) is not held exactly by {target}: {first_line(exc)}") from None
    raise AssertionError("a cast failing as a whole fails for one of its values")


def _scalar_kind(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)
            or pa.types.is_boolean(kind) or pa.types.is_temporal(kind))


def _check_exact(array: pa.Array, cast: pa.Array) -> None:
    """Refuse a value the declared type does not hold exactly: Arrow's safe cast still turns 1e300
    into a float's ``inf``, 16777217.0 into 16777216, a timestamp into a date without its time and 5
    into ``true``. Each value must come back from the declared type as it arrived (text is read,
    not cast back: ``"007"`` declared a number is 7 by the declaration's intent)."""
    if not (_scalar_kind(array.type) and _scalar_kind(cast.type)):
        return
    back = pc.cast(cast, array.type, safe=False)
    same = pc.equal(back, array)
    if pa.types.is_floating(array.type):  # NaN equals nothing, yet it came back as it arrived
        same = pc.or_kleene(same, pc.and_(pc.is_nan(back), pc.is_nan(array)))
    lost = pc.and_(pc.invert(pc.fill_null(same, False)), array.is_valid())
    if pc.any(lost).as_py():
        first = pc.index(lost, True).as_py()
        raise RowRefused(first, f"{array[first]} ({array.type}) is not held exactly by {cast.type}: "
                                f"it reads back as {back[first]}")


_ZONED = r":\d\d(\.\d*)?\s*(Z|z|[+-]\d\d(:?\d\d)?)$"  # a time of day, then its zone


def text_to_timestamp(array: pa.Array, target: pa.TimestampType) -> pa.Array:
    """Timestamps read from text as ``target``: a text with a zone is that instant; a text without
    one is a wall time, read as UTC where ``target`` has a zone. A ``target`` without a zone holds
    zoned instants as UTC wall times.

    >>> text_to_timestamp(pa.array(["2024-01-01T02:00:05+02:00", "2024-01-01 00:00:05"]), pa.timestamp("s", "UTC"))[0]
    <pyarrow.TimestampScalar: '2024-01-01T00:00:05+0000'>
    """
    zoned = pc.fill_null(pc.match_substring_regex(array, _ZONED), False)
    # Each cast sees the others' places filled with a text it reads (a cast reads under nulls too).
    instants = pc.cast(pc.if_else(zoned, array, "1970-01-01T00:00:00Z"), pa.timestamp(target.unit, "UTC"))
    walls = pc.cast(pc.if_else(zoned, "1970-01-01T00:00:00", array), pa.timestamp(target.unit))
    if target.tz is None:
        return pc.if_else(zoned, instants.cast(pa.timestamp(target.unit)), walls)
    return pc.if_else(zoned, instants, walls.cast(pa.timestamp(target.unit, "UTC"))).cast(target)
