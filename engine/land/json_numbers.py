"""JSON numbers typed from the text they were written as: every integer lands exactly.

pyarrow's JSON reader types a column holding an integer beyond int64 as float64, and a column
mixing integers and fractions as float64, so an integer beyond 2**53 lands rounded
(``9007199254740993`` reads ``9007199254740992.0``). A float64 holds every integer up to 2**53
exactly, so a block whose float columns hold no value of magnitude 2**53 or more lost nothing and
keeps the reader's types (a ``min_max`` per float column, columnar). A block where one does is read
again (:func:`exact_numbers`): its number literals are rewritten as marked JSON strings (outside
strings, so positions differ but no value changes), the reader types those columns as text, and
each is typed from its literals by :func:`literal_type`, the rule of docs/normalization.md:

- integers only: int64 when every one fits, else decimal(38, 0) when every one has at most 38
  digits, else text (each number as written);
- integers and fractions: float64 when every integer is within ±2**53 (float64 holds it exactly),
  else text (each number as written);
- numbers meeting strings or booleans: text, as any column mixing kinds.

The same rule joins blocks (``decode_schema._merged_type``): an integer column meeting a float
column is float64 unless one of its integers is beyond ±2**53 (:func:`wide_integer_paths`), then
text; decimal(38, 0) meeting an integer is decimal(38, 0), meeting a float text. So one input lands
one column type however its blocks fall. Only blocks with a float of magnitude 2**53 or more pay
the second reading, a regular-expression rewrite of the block (about 15 MB/s).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import TYPE_CHECKING

from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

EXACT = 2**53
"""float64 holds every integer of at most this magnitude exactly, and not 2**53 + 1."""
MARK = "\x00#"
"""What a rewritten number's text starts with (a JSON string never holds a raw NUL: it is escaped)."""

# a run of JSON strings and structure (kept as it is), or a number literal (rewritten): digits and
# minus signs outside strings belong to numbers
_TOKENS = re.compile(rb'((?:"(?:[^"\\]|\\.)*"|[^"\d-])+)|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?')
_INTEGER = r"^-?\d+$"
_DIGITS_38 = r"^-?\d{1,38}$"


def wide_integer() -> pa.DataType:
    """The type integers beyond int64 land in: decimal(38, 0)."""
    return pa.decimal128(38, 0)


def _leaves(array: pa.Array, path: str) -> Iterator[tuple[str, pa.Array]]:
    """The scalar arrays under ``array`` with their paths (``a.b`` for a field, ``a[]`` for elements)."""
    if pa.types.is_struct(array.type):
        for i, f in enumerate(array.type):
            yield from _leaves(array.field(i), f"{path}.{f.name}")
    elif pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        yield from _leaves(array.flatten(), f"{path}[]")
    else:
        yield path, array


def _table_leaves(table: pa.Table) -> Iterator[tuple[str, pa.Array]]:
    for name, column in zip(table.column_names, table.columns, strict=True):
        for chunk in column.chunks:
            yield from _leaves(chunk, name)


def _beyond(array: pa.Array, bound: int) -> bool:
    """Whether a number of ``array`` has a magnitude above ``bound`` (NaN: no; infinity: yes)."""
    if array.null_count == len(array):
        return False
    low, high = pc.min_max(array).values()
    return bool(high.as_py() > bound or low.as_py() < -bound)


def lost_columns(table: pa.Table) -> list[str]:
    """The float columns of a flat ``table`` (CSV) holding a magnitude of 2**53 or more."""
    return [name for name, column in zip(table.column_names, table.columns, strict=True)
            if pa.types.is_floating(column.type) and any(_beyond(chunk, EXACT - 1) for chunk in column.chunks)]


def lost_integers(table: pa.Table) -> bool:
    """Whether a float column of ``table`` holds a magnitude of 2**53 or more: where an integer
    literal may have been rounded (every integer below it is a float64 exactly)."""
    return any(pa.types.is_floating(leaf.type) and _beyond(leaf, EXACT - 1) for _path, leaf in _table_leaves(table))


def wide_integer_paths(table: pa.Table) -> set[str]:
    """The paths of ``table``'s integer columns holding an integer beyond ±2**53 (float64 would round it)."""
    return {path for path, leaf in _table_leaves(table)
            if (pa.types.is_integer(leaf.type) and leaf.type.bit_width == 64 and _beyond(leaf, EXACT))
            or pa.types.is_decimal(leaf.type)}


def _marked(match: re.Match[bytes]) -> bytes:
    return match.group() if match.lastindex else b'"\\u0000#' + match.group() + b'"'


def exact_numbers(block: memoryview, table: pa.Table, read: Callable[[bytes], pa.Table]) -> pa.Table:
    """``table`` (``block`` as the reader typed it) with every number column typed from its literals;
    ``table`` itself when no integer can have been rounded. ``read`` reads a block as the decoder
    reads JSON (kinds that change within a column read as text)."""
    if not lost_integers(table):
        return table
    literal = read(_TOKENS.sub(_marked, bytes(block)))
    columns = [pa.chunked_array([_typed(chunk) for chunk in column.chunks]) if column.num_chunks
               else column for column in literal.columns]
    return pa.Table.from_arrays(columns, names=literal.column_names)


def _typed(array: pa.Array) -> pa.Array:
    """``array`` with its marked numbers typed from their literals, at any depth."""
    if pa.types.is_struct(array.type):
        children = [_typed(child) for child in array.flatten()]  # flatten: the struct's offset applied
        fields = [f.with_type(c.type) for f, c in zip(array.type, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=array.is_null() if array.null_count else None)
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        first, last = array.offsets[0].as_py(), array.offsets[-1].as_py()
        values = _typed(array.values.slice(first, last - first))
        offsets = pc.subtract(array.offsets, array.offsets[0])
        factory = pa.LargeListArray if pa.types.is_large_list(array.type) else pa.ListArray
        return factory.from_arrays(offsets, values, mask=array.is_null() if array.null_count else None)
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)) or not len(array):
        return array
    marked = pc.starts_with(array, MARK)
    if not pc.any(marked).as_py():
        return array
    literals = pc.utf8_slice_codeunits(array, len(MARK))
    if pc.all(marked).as_py():  # numbers only (and nulls)
        return literal_type(literals)
    return pc.if_else(marked, literals, array)  # numbers meeting text: text, each number as written


def literal_type(literals: pa.Array) -> pa.Array:
    """JSON number literals (text) in the exact type the rule gives them (module docstring).

    >>> literal_type(pa.array(["1", "99999999999999999999"])).type
    Decimal128Type(decimal128(38, 0))
    >>> literal_type(pa.array(["9007199254740993", "0.5"])).to_pylist()
    ['9007199254740993', '0.5']
    """
    integers = pc.match_substring_regex(literals, _INTEGER)
    if pc.all(integers).as_py():
        try:
            return pc.cast(literals, pa.int64(), safe=True)
        except pa.ArrowInvalid:
            pass
        if pc.all(pc.match_substring_regex(literals, _DIGITS_38)).as_py():  # the cast does not check precision
            return pc.cast(literals, wide_integer(), safe=True)
        return literals
    long = pc.and_(integers, pc.greater(pc.utf8_length(literals), 15))  # shorter ones are below 2**53
    if pc.any(long).as_py():
        long_literals = pc.filter(literals, long)
        if not pc.all(pc.match_substring_regex(long_literals, _DIGITS_38)).as_py():
            return literals
        wide = pc.cast(long_literals, wide_integer(), safe=True)
        bound = pa.scalar(Decimal(EXACT), wide_integer())
        if pc.any(pc.greater(pc.abs(wide), bound)).as_py():
            return literals
    return pc.cast(literals, pa.float64())
