"""Arrow -> Iceberg schema mapping and data files, read back by pyiceberg's own scan."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.iceberg.commit import export_table
from contextful.iceberg.schema import arrow_to_iceberg
from contextful.storage.errors import SchemaIrreconcilable
from pyiceberg.catalog.sql import SqlCatalog


def test_nested_and_primitive_types_map_with_fresh_ids() -> None:
    schema = pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        ("small", pa.int16()),
        ("amount", pa.decimal128(12, 2)),
        ("at", pa.timestamp("us", tz="UTC")),
        ("day", pa.date32()),
        ("blob", pa.binary()),
        ("point", pa.struct([("x", pa.float64()), ("y", pa.float32())])),
        ("attrs", pa.map_(pa.string(), pa.list_(pa.int32()))),
    ])
    got = arrow_to_iceberg(schema)
    assert [(f.name, str(f.field_type), f.required) for f in got.fields] == [
        ("id", "long", True), ("small", "int", False), ("amount", "decimal(12, 2)", False),
        ("at", "timestamptz", False), ("day", "date", False), ("blob", "binary", False),
        ("point", "struct<8: x: optional double, 9: y: optional float>", False),
        ("attrs", "map<string, list<int>>", False),
    ]
    ids = [f.field_id for f in got.fields]
    # ids run depth-first; a map's key and value and a list's element each hold one of their own
    assert ids == [1, 2, 3, 4, 5, 6, 7, 10] and got.highest_field_id == 13


def test_an_unmappable_type_raises_schema_irreconcilable() -> None:
    with pytest.raises(SchemaIrreconcilable) as caught:
        arrow_to_iceberg(pa.schema([("u", pa.uint64())]), "exports.t")
    assert caught.value.path == "u" and caught.value.table == "exports.t"


def test_nested_values_round_trip_and_an_incompatible_schema_is_refused(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    catalog.create_namespace("exports")
    data = pa.table({
        "id": pa.array([1, 2], pa.int32()),
        "amount": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(12, 2)),
        "at": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), None], pa.timestamp("us", tz="UTC")),
        "attrs": pa.array([[("a", [1, 2])], []], pa.map_(pa.string(), pa.list_(pa.int32()))),
        "point": pa.array([{"x": 1.0, "y": None}, None], pa.struct([("x", pa.float64()), ("y", pa.float64())])),
    })
    export_table(catalog, "exports.t", data)
    table = catalog.load_table("exports.t")
    assert table.scan().to_arrow().to_pylist() == data.to_pylist()
    (data_file,) = [t.file for t in table.scan().plan_files()]
    assert data_file.record_count == 2 and data_file.file_size_in_bytes > 0
    id_field = table.schema().find_field("id").field_id
    assert data_file.null_value_counts[id_field] == 0 and data_file.value_counts[id_field] == 2
    assert id_field in data_file.lower_bounds and id_field in data_file.upper_bounds

    before = set((tmp_path / "wh").rglob("*.parquet"))
    with pytest.raises(SchemaIrreconcilable):
        export_table(catalog, "exports.t", pa.table({"id": ["not a number"]}))
    assert set((tmp_path / "wh").rglob("*.parquet")) == before
    assert len(catalog.load_table("exports.t").snapshots()) == 1


def test_a_compatible_source_change_evolves_the_iceberg_schema(tmp_path: Path) -> None:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}", warehouse=f"file://{tmp_path / 'wh'}")
    catalog.create_namespace("exports")
    export_table(catalog, "exports.t", pa.table({"id": pa.array([1], pa.int32()), "gone": ["x"],
                                                 "p": [{"a": 1.5}]}))
    later = pa.table({"id": pa.array([2, 3], pa.int64()), "new": ["n", None], "p": [{"a": 2.5, "b": "q"}, None]})
    export_table(catalog, "exports.t", later)
    table = catalog.load_table("exports.t")
    fields = {f.name: str(f.field_type) for f in table.schema().fields}
    assert fields["id"] == "long" and "new" in fields and "gone" in fields  # widened, added, kept
    assert table.scan().to_arrow().sort_by("id").to_pylist() == [
        {"id": 2, "gone": None, "p": {"a": 2.5, "b": "q"}, "new": "n"},
        {"id": 3, "gone": None, "p": None, "new": None}]
