"""Every column of a snapshot's schema reads, whether or not a live part holds it: a column that
arrived in a run without rows, and a fold of parts all written before a column arrived."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from contextful.storage import Store


@pytest.mark.parametrize("key", [(), ("k",)], ids=["unkeyed", "keyed"])
def test_a_column_landed_without_rows_reads_as_null(store: Store, key: tuple[str, ...]) -> None:
    t = store.create_table("t", key)
    t.append(pa.table({"k": [1, 2], "v": ["a", "b"]}))
    t.append(pa.table({"k": pa.array([], pa.int64()), "extra": pa.array([], pa.string())}))
    table = store.table("t")
    assert table.schema is not None and table.schema.names == ["k", "v", "extra"]
    assert sorted(table.to_arrow().to_pylist(), key=lambda r: r["k"]) == [
        {"k": 1, "v": "a", "extra": None}, {"k": 2, "v": "b", "extra": None}]
    assert table.count() == 2


@pytest.mark.parametrize("key", [(), ("k",)], ids=["unkeyed", "keyed"])
def test_a_fold_of_parts_written_before_a_column_arrived(store: Store, key: tuple[str, ...]) -> None:
    t = store.create_table("t", key)
    t.append(pa.table({"k": [1], "v": ["a"]}))
    t.append(pa.table({"k": [1, 2], "v": ["a2", "b"]}))
    t.append(pa.table({"k": [3], "v": ["c"], "extra": [os.urandom(60_000).hex()]}))  # a large part: not folded
    before = sorted(store.table("t").to_arrow().to_pylist(), key=lambda r: (r["k"], r["v"]))
    folded = store.fold("t", small_bytes=50_000)  # folds the first two parts only: neither has `extra`
    assert folded is not None and folded.parts_removed == 2
    assert sorted(store.table("t").to_arrow().to_pylist(), key=lambda r: (r["k"], r["v"])) == before
