"""Keys never merge distinct rows (issue 12): a keyed table refuses null and NaN keys and a batch
without a key column, and a key column never widens to a type that cannot hold every key exactly.
Run against the SQLite and the PostgreSQL catalog; a property test lands random keyed batches and
checks that no accepted distinct key is ever lost."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from typing import Any

import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.errors import (
    PrimaryKeyColumnMissing,
    PrimaryKeyNull,
    PrimaryKeyWideningLossy,
    TableNameInvalid,
    TableUnreadable,
)
from contextful.storage.reconcile import holds_exactly, reconcile
from contextful.storage.snapshot import snapshot_sql
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BIG = 2**53


@pytest.fixture(params=["local", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def test_null_keys_are_refused_by_name_and_land_nothing(store: Store) -> None:
    table = store.create_table("t", ["k", "j"])
    table.append(pa.table({"k": [1], "j": ["a"], "v": [0]}))
    with pytest.raises(PrimaryKeyNull) as caught:
        table.append(pa.table({"k": [2, 3, 4], "j": ["b", None, None], "v": [1, 2, 3]}))
    assert (caught.value.table, caught.value.column, caught.value.row) == ("t", "j", 2)  # 1-based: the batch's 2nd row
    assert "row 2" in str(caught.value) and "'j'" in str(caught.value)
    assert table.refresh().commit_seq == 1 and table.to_arrow().to_pylist() == [{"k": 1, "j": "a", "v": 0}]
    store.fold("t", min_parts=1)
    assert table.count() == 1


def test_nan_keys_are_refused_as_they_equal_nothing(store: Store) -> None:
    table = store.create_table("t", ["k"])
    with pytest.raises(PrimaryKeyNull) as caught:
        table.append(pa.table({"k": [1.5, float("nan"), float("nan")], "v": [1, 2, 3]}))
    assert (caught.value.column, caught.value.row, caught.value.value) == ("k", 2, "NaN")  # 1-based
    assert table.refresh().commit_seq == 0


def test_a_key_naming_a_column_the_data_lacks_lands_nothing_and_the_store_stays_readable(store: Store) -> None:
    import contextful.engine.read

    store.append("other", pa.table({"x": [1]}))
    table = store.create_table("t", ["nope"])
    with pytest.raises(PrimaryKeyColumnMissing) as caught:
        table.append(pa.table({"id": [1, 2]}))
    assert (caught.value.table, caught.value.column, caught.value.columns) == ("t", "nope", ("id",))
    assert table.refresh().commit_seq == 0 and table.schema is None
    con = contextful.engine.read.connect(store)
    assert con.execute("SELECT count(*) FROM other").fetchone() == (1,)


def test_a_later_batch_without_the_key_column_is_refused(store: Store) -> None:
    table = store.create_table("t", ["k"])
    table.append(pa.table({"k": [1, 2]}))
    with pytest.raises(PrimaryKeyColumnMissing):
        table.append(pa.table({"v": [1, 2]}))
    assert table.count() == 2


def test_an_int64_key_meeting_a_float_is_refused_and_distinct_big_keys_stay_distinct(store: Store) -> None:
    table = store.create_table("t", ["k"])
    table.append(pa.table({"k": pa.array([BIG, BIG + 1], pa.int64()), "v": [1, 2]}))
    with pytest.raises(PrimaryKeyWideningLossy) as caught:
        table.append(pa.table({"k": [0.5], "v": [3]}))
    assert (caught.value.path, caught.value.table_type, caught.value.arriving_type) == ("k", "int64", "double")
    assert table.count() == 2 and sorted(table.to_arrow().column("k").to_pylist()) == [BIG, BIG + 1]
    # a value column still widens, as a downgrade event
    result = table.append(pa.table({"k": pa.array([7], pa.int64()), "v": [0.5]}))
    assert [(e.path, e.landed_type) for e in result.downgrade_events] == [("v", "double")]


def test_a_run_staged_with_int64_keys_is_refused_when_a_float_keyed_run_committed_first(store: Store) -> None:
    table = store.create_table("t", ["k"])
    txn = table.transaction()
    txn.stage(pa.table({"k": pa.array([BIG, BIG + 1], pa.int64())}))
    store.table("t").append(pa.table({"k": [0.5]}))
    with pytest.raises(PrimaryKeyWideningLossy):
        txn.commit()
    txn.abort()
    assert table.count() == 1


@pytest.mark.parametrize(("have", "got", "ok"), [
    (pa.int32(), pa.float64(), True),
    (pa.int64(), pa.float64(), False),
    (pa.float64(), pa.int64(), False),
    (pa.uint64(), pa.int8(), False),
    (pa.int8(), pa.uint32(), True),
    (pa.decimal128(38, 25), pa.int64(), False),
    (pa.decimal128(10, 2), pa.int64(), True),
    (pa.decimal128(10, 2), pa.uint64(), True),
    (pa.decimal128(10, 2), pa.float32(), False),
    (pa.timestamp("s"), pa.timestamp("ns"), True),
    (pa.timestamp("s", "Europe/Paris"), pa.timestamp("ms", "UTC"), True),
    (pa.date32(), pa.timestamp("us"), True),
    (pa.string(), pa.large_string(), True),
    (pa.struct([("a", pa.int64())]), pa.struct([("a", pa.float64())]), False),
    (pa.list_(pa.int16()), pa.list_(pa.int32()), True),
])
def test_key_widening_rules(have: pa.DataType, got: pa.DataType, ok: bool) -> None:
    def merge() -> pa.DataType:
        return reconcile("t", pa.schema([("k", have)]), pa.schema([("k", got)]), ("k",)).schema.field("k").type

    if ok:
        landed = merge()
        assert holds_exactly(landed, have) and holds_exactly(landed, got)
    else:
        with pytest.raises(PrimaryKeyWideningLossy):
            merge()
        reconcile("t", pa.schema([("k", have)]), pa.schema([("k", got)]))  # a value column still widens


def test_uint64_meeting_a_decimal_keeps_twenty_integer_digits() -> None:
    landed = reconcile("t", pa.schema([("v", pa.decimal128(10, 2))]), pa.schema([("v", pa.uint64())])).schema
    assert landed.field("v").type == pa.decimal128(22, 2)


def test_a_snapshot_never_merges_rows_without_a_key_and_names_a_key_column_it_lacks(store: Store) -> None:
    """Stores written before keys were checked may hold null-key rows, or a key naming no column:
    reads (and so folds) keep every keyless row, and a missing key column is a named error."""
    store.append("raw", pa.table({"k": [1.0, 1.0, None, None, float("nan"), float("nan")], "v": [1, 2, 3, 4, 5, 6]}))
    snap = store.table("raw").snapshot()
    con = store.duckdb()
    try:
        sql = snapshot_sql(dataclasses.replace(snap, primary_key=("k",)), con)
        assert sql is not None
        assert sorted(r[0] for r in con.sql(f"SELECT v FROM ({sql})").fetchall()) == [2, 3, 4, 5, 6]
        with pytest.raises(TableUnreadable) as caught:
            snapshot_sql(dataclasses.replace(snap, primary_key=("nope",)), con)
        assert caught.value.table == "raw" and "'nope'" in caught.value.reason
    finally:
        con.close()


def test_two_tables_differing_only_in_case_are_refused_as_their_views_would_be_one(store: Store) -> None:
    store.append("events", pa.table({"x": [1]}))
    with pytest.raises(TableNameInvalid) as caught:
        store.append("Events", pa.table({"x": [2]}))
    assert caught.value.table == "Events" and "'events'" in caught.value.reason
    assert store.table_names() == ["events"]


key_values = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.integers(BIG - 2, BIG + 2),
    st.sampled_from([0.5, 1.0, float("nan")]),
)
batches = st.lists(st.tuples(st.sampled_from(["int64", "int32", "double"]),
                             st.lists(key_values, min_size=1, max_size=4)), min_size=1, max_size=4)


def _arrow(kind: str, keys: list[Any]) -> pa.Array | None:
    try:
        if kind == "double":
            return pa.array([None if k is None else float(k) for k in keys], pa.float64())
        return pa.array(keys, getattr(pa, kind)())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches)
def test_random_keyed_batches_never_lose_a_distinct_key(history: list[tuple[str, list[Any]]]) -> None:
    """Every accepted row is its own key unless an equal key (as an exact value) landed too: a row with
    a null or NaN key equals no other, so it would have to read back on its own."""
    with tempfile.TemporaryDirectory() as root, Store.open(root, clock=ManualClock()) as store:
        table = store.create_table("t", ["k"])
        accepted: list[Any] = []
        for kind, keys in history:
            column = _arrow(kind, keys)
            if column is None:
                continue
            try:
                table.append(pa.table({"k": column}))
            except (PrimaryKeyNull, PrimaryKeyWideningLossy):
                continue
            accepted.extend(column.to_pylist())
        landed = table.to_arrow()
        read = landed.column("k").to_pylist() if "k" in landed.column_names else []
        valued = {v for v in accepted if _valued(v)}
        assert len(read) == len(valued) + sum(1 for v in accepted if not _valued(v))
        assert {v for v in read if _valued(v)} == valued


def _valued(v: Any) -> bool:
    """Whether a key is a value equal to itself (not null, not NaN)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))
