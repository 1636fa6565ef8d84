"""Dropping a table (``Store.drop_table``) on every catalog and object store: one catalog step, guarded
by the incarnation (and, for a failed load's cleanup, the commit_seq), then the objects it listed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.errors import TableNameInvalid, TableNotFound
from contextful.storage.manifest import table_prefix


def test_drop_forgets_the_table_whole_and_deletes_its_objects(store: Store) -> None:
    store.append("t", pa.table({"x": [1, 2]}))
    store.append("t", pa.table({"x": [3]}))
    store.append("kept", pa.table({"y": [1]}))
    head = store.table("t").head
    assert not store.catalog.drop_table("t", "another-uuid")  # another incarnation: untouched
    assert not store.catalog.drop_table("t", head.uuid, at_seq=0)  # it has moved past commit_seq 0
    assert sorted(store.table_names()) == ["kept", "t"]

    result = store.drop_table("t")
    assert (result.table, result.uuid, result.commit_seq) == ("t", head.uuid, 2)
    assert store.table_names() == ["kept"]
    assert store.catalog.commits("t") == [] and store.catalog.all_parts("t") == []
    assert store.objects.list(table_prefix("t")) == []
    with pytest.raises(TableNotFound):
        store.table("t")
    assert store.table("kept").count() == 1
    again = store.append("t", pa.table({"z": ["new"]}))  # a new incarnation, from its first commit
    assert again.commit_seq == 1 and store.table("t").to_arrow().column_names == ["z"]


def test_drop_refuses_reserved_and_unknown_tables(store: Store) -> None:
    store.append("t", pa.table({"x": [1]}))
    store.runs.flush_quietly()
    with pytest.raises(TableNameInvalid):
        store.drop_table("_runs")
    with pytest.raises(TableNotFound):
        store.drop_table("missing")
    assert "_runs" in store.table_names(include_reserved=True)


def test_collect_removes_what_a_dropped_table_left(store: Store) -> None:
    store.append("t", pa.table({"x": [1]}))
    store.drop_table("t")
    late = f"{table_prefix('t')}/parts/r1-abc-00000.parquet"  # a run in flight wrote it after the drop
    store.objects.put_bytes(late, b"late")
    assert late in store.collect(grace_seconds=0).orphans
    assert not store.objects.exists(late)


def test_a_failed_first_run_drops_only_a_table_created_for_it(store: Store) -> None:
    from contextful.storage.errors import PrimaryKeyNull

    bad = pa.table({"k": [1, None]})
    with pytest.raises(PrimaryKeyNull):
        store.append("provisional", bad, primary_key=["k"])  # created for this run: it goes with it
    assert "provisional" not in store.table_names()
    on_purpose = store.create_table("kept_empty", ["k"])
    with pytest.raises(PrimaryKeyNull):
        on_purpose.append(bad)
    assert store.table("kept_empty").refresh().commit_seq == 0  # created on purpose: it stays, empty
    landed = store.create_table("landed", ["k"], provisional=True)
    landed.append(pa.table({"k": [1]}))
    with pytest.raises(PrimaryKeyNull):
        landed.append(bad)  # a later run's failure never drops a table something committed to
    assert store.table("landed").count() == 1
