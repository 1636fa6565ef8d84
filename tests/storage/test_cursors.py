"""Cursors resolve through their commit; only lease-taking kinds live under ``cursors/``."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.cursors import LEASED_KINDS, POSITION_KINDS, resolve_cursor
from contextful.storage.errors import CommitConflict, LeaseCursorKindMismatch, SyncCursorConflict


@pytest.mark.clause("store.merge.cursor-recency")
def test_a_cursor_resolves_through_its_commit_never_by_write_time(tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        table = store.create_table("t")
        table.append(pa.table({"n": [1]}), cursor=("pipeline:p", {"kind": "watermark", "watermark": 1}))
        first = table.head.commit_seq
        # a writer staging a later position whose commit loses (the table was dropped and re-made
        # under it would be the real case; a uuid change is the same requirement failing)
        late = table.transaction("append")
        late.stage(pa.table({"n": [9]}))
        table.append(pa.table({"n": [2]}), cursor=("pipeline:p", {"kind": "watermark", "watermark": 2}))
        late.set_cursor("pipeline:p", {"kind": "watermark", "watermark": 99})
        late._uuid = "another-table"  # its requirement no longer holds at the head
        with pytest.raises(CommitConflict):
            late.commit()
        late.abort()
        value, seq = resolve_cursor(table, "pipeline:p")
        assert value["watermark"] == 2 and seq == table.head.commit_seq  # the written-later 99 never landed
        assert resolve_cursor(table, "pipeline:p", commit_seq=first)[0]["watermark"] == 1
        assert resolve_cursor(table, "pipeline:q") is None
        with pytest.raises(SyncCursorConflict) as caught:
            resolve_cursor(table, "pipeline:p", by="last-write")
        assert caught.value.scope == "pipeline:p" and "through its commit" in str(caught.value)


@pytest.mark.clause("store.lease.cursor-kind")
@pytest.mark.parametrize("kind", POSITION_KINDS)
def test_a_cursor_kind_that_takes_no_lease_cannot_reach_cursors(tmp_path: Path, kind: str) -> None:
    with Store.open(tmp_path / "store") as store:
        table = store.create_table("t")
        with pytest.raises(LeaseCursorKindMismatch) as caught:
            table.append(pa.table({"n": [1]}), cursor=(f"cursors/{kind}-reader", {"kind": kind}))
        assert caught.value.kind == kind and table.commits() == []
        table.append(pa.table({"n": [1]}), cursor=("cursors/queue-reader", {"kind": LEASED_KINDS[0], "offset": 4,
                                                                              "holder": "h1"}))
        assert table.cursor("cursors/queue-reader")[0]["offset"] == 4
        table.append(pa.table({"n": [2]}), cursor=(f"pipeline:{kind}", {"kind": kind}))  # outside cursors/: fine
