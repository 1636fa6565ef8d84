"""A type change a run records says whether it is lossless (``kind``), on every adapter: ``widening``
when the landed type holds every value of the table's and the arriving type exactly, ``downgrade``
when a value may change; read back from the committed run's manifest."""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.storage import Store


@pytest.mark.clause("run.record.schema-diff-shape")
def test_a_lossless_widening_is_kept_as_a_widening_and_a_lossy_one_as_a_downgrade(store: Store) -> None:
    store.append("t", pa.table({"n": pa.array([1], pa.int32()), "f": pa.array([1], pa.int64()),
                                "d": pa.array([1], pa.int64())}))
    result = store.append("t", pa.table({"n": pa.array([2**40], pa.int64()), "f": pa.array([0.5]),
                                         "d": pa.array([1], pa.decimal128(38, 0))}))
    stored = store.table("t").manifest(result.run_id).downgrade_events
    assert stored == result.downgrade_events
    assert {e.path: (e.kind, e.table_type, e.source_type, e.landed_type) for e in stored} == {
        "n": ("widening", "int32", "int64", "int64"),
        "f": ("downgrade", "int64", "double", "double"),  # int64 beyond 2**53 would round in a double
        "d": ("widening", "int64", "decimal128(38, 0)", "decimal128(38, 0)"),
    }
    assert store.table("t").to_arrow().sort_by("n").column("n").to_pylist() == [1, 2**40]
