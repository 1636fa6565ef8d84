"""Arrow schema -> Iceberg schema, nested types included (decision "iceberg-overwrite-commit").

Field ids are assigned depth-first from 1; the catalog reassigns fresh ids when it creates the
table, so the table's own schema is the truth for data files written afterwards. Nullable Arrow
fields become optional Iceberg fields, non-nullable ones required.

    >>> import pyarrow as pa
    >>> s = arrow_to_iceberg(pa.schema([pa.field("id", pa.int64(), nullable=False),
    ...                                 ("tags", pa.list_(pa.string()))]))
    >>> [(f.field_id, f.name, str(f.field_type), f.required) for f in s.fields]
    [(1, 'id', 'long', True), (2, 'tags', 'list<string>', False)]
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pyarrow as pa
from contextful.storage.errors import SchemaIrreconcilable
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
)


def arrow_to_iceberg(schema: pa.Schema, table: str = "") -> Schema:
    """The Iceberg schema for ``schema``; raises ``SchemaIrreconcilable`` for an unmappable type."""
    ids = itertools.count(1)
    return Schema(*(_field(field, ids, table, field.name) for field in schema))


def _field(field: pa.Field, ids: Iterator[int], table: str, path: str) -> NestedField:
    field_id = next(ids)
    return NestedField(field_id=field_id, name=field.name, field_type=_type(field.type, ids, table, path),
                       required=not field.nullable)


def _type(t: pa.DataType, ids: Iterator[int], table: str, path: str) -> IcebergType:
    if pa.types.is_struct(t):
        return StructType(*(_field(t.field(i), ids, table, f"{path}.{t.field(i).name}") for i in range(t.num_fields)))
    if pa.types.is_map(t):
        key_id, value_id = next(ids), next(ids)
        return MapType(key_id=key_id, key_type=_type(t.key_type, ids, table, f"{path}.key"),
                       value_id=value_id, value_type=_type(t.item_type, ids, table, f"{path}.value"),
                       value_required=not t.item_field.nullable)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element_id = next(ids)
        return ListType(element_id=element_id, element_type=_type(t.value_type, ids, table, f"{path}.element"),
                        element_required=not t.value_field.nullable)
    if pa.types.is_dictionary(t):
        return _type(t.value_type, ids, table, path)
    primitive = _primitive(t)
    if primitive is None:
        raise SchemaIrreconcilable(table, path, "an Iceberg type", str(t), "no Iceberg type holds it")
    return primitive


def _primitive(t: pa.DataType) -> IcebergType | None:
    if pa.types.is_boolean(t):
        return BooleanType()
    # Unsigned 32/64-bit integers do not fit the signed type of the same width: widen or refuse.
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t) or pa.types.is_uint8(t) \
            or pa.types.is_uint16(t):
        return IntegerType()
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return LongType()
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return FloatType()
    if pa.types.is_float64(t):
        return DoubleType()
    if pa.types.is_decimal(t) and t.precision <= 38:
        return DecimalType(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return StringType()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return BinaryType()
    if pa.types.is_fixed_size_binary(t):
        return FixedType(t.byte_width)
    if pa.types.is_date(t):
        return DateType()
    if pa.types.is_time(t):
        return TimeType()
    if pa.types.is_timestamp(t):
        # Iceberg v1/v2 timestamps are microseconds; nanosecond data is cast (safely) on write.
        return TimestamptzType() if t.tz is not None else TimestampType()
    return None
