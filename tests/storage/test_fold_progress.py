"""A fold says how far it is (``Store.fold(progress=...)``): rows written as each batch of the
folded part is written and parts as each group ends, on every adapter. The oracle is the parts and
rows the table held before the fold (``Table.count()``)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.fold import FoldProgress


def test_a_fold_reports_rows_written_then_parts_folded(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("contextful.storage.fold.READ_BATCH_ROWS", 500)
    for n in range(4):
        store.append("t", pa.table({"id": pa.array(range(n * 1_000, (n + 1) * 1_000), pa.int64())}))
    held = store.table("t").count()
    seen: list[FoldProgress] = []
    result = store.fold("t", progress=seen.append)
    assert result is not None and result.parts_removed == 4
    assert {(p.table, p.parts_total, p.rows_total) for p in seen} == {("t", 4, held)}
    rows = [p.rows for p in seen]
    assert rows == sorted(rows) and len(set(rows)) >= 4  # a report per batch of 500 rows
    assert (seen[-1].parts, seen[-1].rows) == (4, held)  # the group's end: every part, every row
    assert all(p.parts == 0 for p in seen[:-1])
    assert store.table("t").count() == held
