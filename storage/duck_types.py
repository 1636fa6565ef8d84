"""DuckDB's spelling of Arrow types, worked out without handing DuckDB a Python object.

Handing DuckDB any Python object to scan (an Arrow table, a reader, a capsule) makes it import
pandas first (its replacement-scan checks), about 0.5 s on a cold process; the read path
(``contextful sql``, ``engine.read.connect``) must not pay that to spell a column type. This maps
the Arrow types a store holds to DuckDB's type text directly; a type it does not know is answered
by DuckDB itself, through an Arrow scan, so the answer is always DuckDB's.

    >>> import pyarrow as pa
    >>> duckdb_type(pa.list_(pa.struct([("a", pa.int64()), ("b", pa.timestamp("us", tz="UTC"))])))
    'STRUCT("a" BIGINT, "b" TIMESTAMP WITH TIME ZONE)[]'
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

_SIMPLE = {
    "bool": "BOOLEAN", "int8": "TINYINT", "int16": "SMALLINT", "int32": "INTEGER", "int64": "BIGINT",
    "uint8": "UTINYINT", "uint16": "USMALLINT", "uint32": "UINTEGER", "uint64": "UBIGINT",
    "float": "FLOAT", "double": "DOUBLE", "string": "VARCHAR", "large_string": "VARCHAR",
    "string_view": "VARCHAR", "binary": "BLOB", "large_binary": "BLOB", "binary_view": "BLOB",
    "date32[day]": "DATE", "date64[ms]": "DATE", "null": '"NULL"',
}
_STAMPS = {"s": "TIMESTAMP_S", "ms": "TIMESTAMP_MS", "us": "TIMESTAMP", "ns": "TIMESTAMP_NS"}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _known(t: pa.DataType) -> str | None:
    """DuckDB's text for ``t`` when this module knows it (None: ask DuckDB)."""
    import pyarrow as pa

    if str(t) in _SIMPLE:
        return _SIMPLE[str(t)]
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            return "TIMESTAMPTZ_NS" if t.unit == "ns" else "TIMESTAMP WITH TIME ZONE"
        return _STAMPS[t.unit]
    if pa.types.is_time(t):
        return "TIME_NS" if t.unit == "ns" else "TIME"
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_dictionary(t):
        return _known(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        inner = _known(t.value_type)
        return None if inner is None else f"{inner}[]"
    if pa.types.is_fixed_size_list(t):
        inner = _known(t.value_type)
        return None if inner is None else f"{inner}[{t.list_size}]"
    if pa.types.is_struct(t):
        fields = [(_quote(t.field(i).name), _known(t.field(i).type)) for i in range(t.num_fields)]
        if not fields or any(text is None for _name, text in fields):
            return None
        return "STRUCT(" + ", ".join(f"{name} {text}" for name, text in fields) + ")"
    if pa.types.is_map(t):
        key, item = _known(t.key_type), _known(t.item_type)
        return None if key is None or item is None else f"MAP({key}, {item})"
    return None


@functools.lru_cache(maxsize=256)
def _asked(schema_bytes: bytes) -> tuple[str, ...]:
    import duckdb
    import pyarrow as pa

    schema = pa.ipc.read_schema(pa.py_buffer(schema_bytes))
    con = duckdb.connect()
    try:
        return tuple(str(t) for t in con.from_arrow(schema.empty_table()).types)
    finally:
        con.close()


def duckdb_type(t: pa.DataType) -> str:
    """DuckDB's spelling of the Arrow type ``t`` (the type DuckDB reads such a column as)."""
    import pyarrow as pa

    known = _known(t)
    return known if known is not None else _asked(pa.schema([("c", t)]).serialize().to_pybytes())[0]


def duckdb_types(schema: pa.Schema) -> tuple[str, ...]:
    """DuckDB's spelling of each column type of ``schema``."""
    return tuple(duckdb_type(field.type) for field in schema)


def empty_select(schema: pa.Schema) -> str:
    """A SELECT answering no rows with ``schema``'s columns and types (no Python object scanned)."""
    if not len(schema):
        return "SELECT * FROM (SELECT 1) WHERE false"
    return f"{null_row(schema)} WHERE false"


def null_row(schema: pa.Schema) -> str:
    """A SELECT of one row of nulls in ``schema``'s columns and types (at least one column)."""
    return "SELECT " + ", ".join(f"CAST(NULL AS {text}) AS {_quote(field.name)}"
                                 for field, text in zip(schema, duckdb_types(schema)))
