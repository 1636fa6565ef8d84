"""How the decoder merges the types of an input's blocks: the narrowest schema two schemas cast to.

Part of decision "values land as they arrived" (``engine.land.decode_child``): int and float widen
to float64 (to text where an integer beyond 2**53 arrived), integers and decimal(38, 0) to
decimal(38, 0), mixed kinds to text; temporal guesses are text (:func:`_temporal_as_text`).
"""

from __future__ import annotations

import pyarrow as pa
from contextful.engine.land.json_numbers import wide_integer


def merged_schema(a: pa.Schema, b: pa.Schema, wide: set[str] | frozenset[str] = frozenset()) -> pa.Schema:
    """The narrowest schema both ``a`` and ``b`` cast to; ``a``'s columns first. ``wide``: the paths
    where an integer beyond ±2**53 arrived, which a float64 would round (they meet a float as text)."""
    if a.equals(b):
        return a
    merged = _merged_type(pa.struct(list(a)), pa.struct(list(b)), wide, "")
    return pa.schema([merged.field(i) for i in range(merged.num_fields)])


def _merged_type(a: pa.DataType, b: pa.DataType, wide: set[str] | frozenset[str], path: str) -> pa.DataType:
    if a.equals(b) or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = {a.field(i).name: a.field(i).type for i in range(a.num_fields)}
        for f in (b.field(i) for i in range(b.num_fields)):
            within = f"{path}.{f.name}" if path else f.name
            fields[f.name] = _merged_type(fields[f.name], f.type, wide, within) if f.name in fields else f.type
        return pa.struct(list(fields.items()))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(_merged_type(a.value_type, b.value_type, wide, f"{path}[]"))
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return pa.int64()
    exact = (pa.types.is_integer, pa.types.is_decimal)  # the JSON decoder's integers (json_numbers)
    if any(f(a) for f in exact) and any(f(b) for f in exact):
        return wide_integer()
    numeric = (pa.types.is_integer, pa.types.is_floating)
    if any(f(a) for f in numeric) and any(f(b) for f in numeric) and path not in wide:
        return pa.float64()
    return pa.string()  # mixed kinds, or an integer float64 would round meeting a float: each as text


def _temporal_as_text(t: pa.DataType) -> pa.DataType | None:
    """``t`` reduced to its temporal parts, each as a string (None: ``t`` holds none)."""
    if pa.types.is_temporal(t):
        return pa.string()
    if pa.types.is_struct(t):
        fields = [pa.field(f.name, u) for f in t if (u := _temporal_as_text(f.type)) is not None]
        return pa.struct(fields) if fields else None
    if pa.types.is_list(t):
        value = _temporal_as_text(t.value_type)
        return None if value is None else pa.list_(value)
    return None
