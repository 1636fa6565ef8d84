"""Schema reconciliation rules (storage.reconcile), one rule a test, plus conform's casting."""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.storage.errors import SchemaIrreconcilable
from contextful.storage.reconcile import conform, reconcile


def merged(have: pa.DataType, got: pa.DataType) -> tuple[pa.DataType, list[tuple[str, str, str]]]:
    rec = reconcile("t", pa.schema([("c", have)]), pa.schema([("c", got)]))
    return rec.schema.field("c").type, [(e.path, e.source_type, e.landed_type) for e in rec.events]


@pytest.mark.parametrize("have, got, landed", [
    (pa.int32(), pa.int64(), pa.int64()),
    (pa.int64(), pa.int8(), pa.int64()),
    (pa.uint8(), pa.int8(), pa.int16()),
    (pa.uint32(), pa.uint16(), pa.uint32()),
    (pa.int64(), pa.float32(), pa.float64()),
    (pa.float32(), pa.float64(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(5, 4), pa.decimal128(12, 4)),
    (pa.decimal128(10, 2), pa.int32(), pa.decimal128(12, 2)),
    (pa.decimal128(10, 2), pa.float64(), pa.float64()),
    (pa.timestamp("ms"), pa.timestamp("us"), pa.timestamp("us")),
    (pa.timestamp("us", "Europe/Paris"), pa.timestamp("us", "America/New_York"), pa.timestamp("us", "UTC")),
    (pa.date32(), pa.timestamp("s"), pa.timestamp("s")),
    (pa.time32("ms"), pa.time64("ns"), pa.time64("ns")),
    (pa.duration("s"), pa.duration("ms"), pa.duration("ms")),
])
def test_compatible_widenings_land_with_an_event(have: pa.DataType, got: pa.DataType, landed: pa.DataType) -> None:
    result, events = merged(have, got)
    assert result == landed
    assert events == [("c", str(got), str(landed))]


@pytest.mark.parametrize("have, got", [
    (pa.string(), pa.large_string()),
    (pa.large_binary(), pa.binary()),
    (pa.list_(pa.int64()), pa.large_list(pa.int64())),
    (pa.int64(), pa.null()),
    (pa.string(), pa.dictionary(pa.int32(), pa.string())),
])
def test_representation_only_differences_are_not_events(have: pa.DataType, got: pa.DataType) -> None:
    result, events = merged(have, got)
    assert result == have and events == []


@pytest.mark.parametrize("have, got", [
    (pa.int64(), pa.string()),
    (pa.bool_(), pa.int8()),
    (pa.struct([("a", pa.int64())]), pa.int64()),
    (pa.list_(pa.int64()), pa.string()),
    (pa.timestamp("us"), pa.timestamp("us", "UTC")),
    (pa.time64("us"), pa.timestamp("us")),
    (pa.float64(), pa.date32()),
])
def test_irreconcilable_pairs_raise_incompatible(have: pa.DataType, got: pa.DataType) -> None:
    with pytest.raises(SchemaIrreconcilable) as info:
        merged(have, got)
    assert info.value.category == "incompatible"
    assert info.value.path == "c"


def test_nested_paths_are_spelled_out() -> None:
    have = pa.struct([("m", pa.map_(pa.string(), pa.int32())), ("l", pa.list_(pa.list_(pa.int32())))])
    got = pa.struct([("m", pa.map_(pa.string(), pa.int64())), ("l", pa.list_(pa.list_(pa.float64())))])
    _, events = merged(have, got)
    assert [p for p, _, _ in events] == ["c.m{value}", "c.l[][]"]


def test_new_fields_join_nullable_at_any_depth_without_events() -> None:
    have = pa.struct([("a", pa.int64())])
    got = pa.struct([("b", pa.list_(pa.struct([("x", pa.string())]))), ("a", pa.int64())])
    result, events = merged(have, got)
    assert [f.name for f in result] == ["a", "b"] and result.field("b").nullable
    assert events == []


def test_conform_casts_nested_data_and_keeps_nulls_and_empty_lists() -> None:
    target = pa.schema([
        ("id", pa.int64()),
        ("s", pa.struct([("x", pa.int64()), ("y", pa.string())])),
        ("l", pa.list_(pa.struct([("v", pa.float64()), ("w", pa.string())]))),
        ("missing", pa.string()),
    ])
    data = pa.table({
        "l": pa.array([[{"v": 1}], [], None, [None, {"v": 2}]], pa.list_(pa.struct([("v", pa.int32())]))),
        "id": pa.array([1, 2, 3, 4], pa.int32()),
        "s": pa.array([{"x": 1}, None, {"x": None}, {"x": 4}], pa.struct([("x", pa.int8())])),
    }).slice(0, 4)
    out = conform(data, target)
    assert out.schema == target
    assert out.to_pylist() == [
        {"id": 1, "s": {"x": 1, "y": None}, "l": [{"v": 1.0, "w": None}], "missing": None},
        {"id": 2, "s": None, "l": [], "missing": None},
        {"id": 3, "s": {"x": None, "y": None}, "l": None, "missing": None},
        {"id": 4, "s": {"x": 4, "y": None}, "l": [None, {"v": 2.0, "w": None}], "missing": None},
    ]


def test_conform_handles_sliced_arrays() -> None:
    data = pa.table({"l": pa.array([[1], [2, 3], [4], None], pa.list_(pa.int32()))}).slice(1, 3)
    out = conform(data, pa.schema([("l", pa.list_(pa.int64()))]))
    assert out.column("l").to_pylist() == [[2, 3], [4], None]


def test_conform_fails_on_values_that_do_not_fit() -> None:
    with pytest.raises(SchemaIrreconcilable):
        conform(pa.table({"c": pa.array([2**63], pa.uint64())}), pa.schema([("c", pa.int64())]), "t")
