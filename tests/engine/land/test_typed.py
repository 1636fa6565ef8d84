"""Typed landing: spellings read into Arrow types; a pull's types decide the landed column types."""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.engine.land.typed import apply_types, parse_type, read_types
from contextful.storage import Store
from contextful.storage.errors import TypedLandingFailed, TypeSpellingUnreadable


@pytest.mark.parametrize("spelling, expected", [
    ("bigint", pa.int64()), ("INT", pa.int32()), ("double", pa.float64()), ("varchar", pa.string()),
    ("boolean", pa.bool_()), ("date", pa.date32()), ("timestamp", pa.timestamp("us")),
    ("timestamptz", pa.timestamp("us", "UTC")), ("timestamp with time zone", pa.timestamp("us", "UTC")),
    ("timestamp[ms, tz=Europe/Paris]", pa.timestamp("ms", "Europe/Paris")), ("timestamp[ns, UTC]", pa.timestamp("ns", "UTC")),
    ("decimal(12, 3)", pa.decimal128(12, 3)), ("numeric(5,0)", pa.decimal128(5, 0)),
    ("bigint[]", pa.list_(pa.int64())), ("list<list<string>>", pa.list_(pa.list_(pa.string()))),
    ("struct<a: int64, b: list<varchar>>", pa.struct([("a", pa.int64()), ("b", pa.list_(pa.string()))])),
    ("map<string, double>", pa.map_(pa.string(), pa.float64())), ("duration[ms]", pa.duration("ms")),
])
def test_spellings_read_as_arrow_types(spelling: str, expected: pa.DataType) -> None:
    assert parse_type(spelling) == expected


@pytest.mark.parametrize("spelling", ["bigint!", "decimal(10", "timestamp[fortnight]", "list<>", "numberish", ""])
def test_unreadable_spellings_are_incompatible(spelling: str) -> None:
    with pytest.raises(TypeSpellingUnreadable) as info:
        read_types({"c": spelling})
    assert info.value.category == "incompatible" and info.value.column == "c" and info.value.spelling == spelling


@pytest.mark.clause("run.land.typed-pull")
def test_the_run_commit_lands_declared_columns_in_their_declared_types(local_store: Store) -> None:
    pulled = pa.table({"id": ["1", "2"], "at": ["2026-01-01T00:00:00Z", "2026-01-02T12:30:00Z"],
                       "amount": ["1.50", "2.25"], "note": ["x", "y"]})
    types = read_types({"id": "bigint", "at": "timestamp[us, UTC]", "amount": "decimal(10, 2)", "absent": "int"})
    landed = local_store.append("orders", apply_types("orders", pulled, types))
    schema = local_store.table("orders").schema
    assert schema.field("id").type == pa.int64()
    assert schema.field("at").type == pa.timestamp("us", "UTC")
    assert schema.field("amount").type == pa.decimal128(10, 2)
    assert schema.field("note").type == pa.string() and "absent" not in schema.names
    manifest = local_store.table("orders").manifest(landed.run_id)
    assert [c["type"] for c in manifest.to_json()["columns"]] == ["int64", "timestamp[us, tz=UTC]", "decimal128(10, 2)", "string"]
    with pytest.raises(TypeSpellingUnreadable):
        read_types({"id": "integer-ish"})


def test_values_that_do_not_read_as_the_declared_type_fail_the_batch() -> None:
    with pytest.raises(TypedLandingFailed) as info:
        apply_types("t", pa.table({"n": ["1", "two"]}), {"n": pa.int64()})
    assert info.value.column == "n" and info.value.category == "incompatible"


@pytest.mark.parametrize(("values", "declared", "shown"), [
    (pa.array([1.0, 1e300]), pa.float32(), "1e+300"),
    (pa.array([1.0, 16777217.0]), pa.float32(), "16777217.0"),
    (pa.array([0, 5], pa.int64()), pa.bool_(), "5"),
    (pa.array([0, 1_700_000_000_123_456], pa.timestamp("us")), pa.date32(), "2023-11-14 22:13:20.123456"),
    (pa.array([1, 2**62 + 1], pa.int64()), pa.float64(), str(2**62 + 1)),
])
def test_a_value_the_declared_type_cannot_hold_exactly_fails_the_batch(values: pa.Array, declared: pa.DataType,
                                                                       shown: str) -> None:
    """A declaration converts values it can hold; it never changes one (an Arrow safe cast still
    gives inf, rounds a float, drops a time, turns 5 into true)."""
    with pytest.raises(TypedLandingFailed) as info:
        apply_types("t", pa.table({"n": values}), {"n": declared})
    assert info.value.column == "n" and shown in info.value.reason


def test_values_the_declared_type_holds_land_converted() -> None:
    typed = apply_types("t", pa.table({"f": [1.5, float("nan"), None], "b": [1, 0, None], "s": ["007", "8", None],
                                       "d": pa.array([0, 86_400_000_000], pa.timestamp("us"))[:2].to_pylist() + [None]}),
                        {"f": pa.float32(), "b": pa.bool_(), "s": pa.int64(), "d": pa.date32()})
    assert typed.column("b").to_pylist() == [True, False, None] and typed.column("s").to_pylist() == [7, 8, None]
    assert typed.column("f").type == pa.float32() and typed.column("d").type == pa.date32()
