"""A store over the D1 profile's adapter set: catalog, journal, awakeables, outbox and blobs in D1 and R2.

The parts stay under a local root (the D1 profile's corpus in R2 is not built yet); everything the
catalog holds — heads, the commit log, the part index, cursors, run records — goes through the
Worker under miniflare, and so do the execution's owner rows, steps and awakeables. A commit made
for an execution carries its writer fence inside the commit's D1 batch: once another holder took
the execution over, the superseded attempt's commit lands nothing.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.storage import ManualClock, Store
from contextful.storage.d1.awakeables import D1AwakeableStore
from contextful.storage.d1.blobs import D1BlobStore
from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.journal import D1JournalStore
from contextful.storage.d1.outbox import D1OutboxStore
from contextful.storage.errors import ExecutionWriterFenced
from contextful.storage.fence import WriterFence, writing_as

pytestmark = pytest.mark.d1

T0 = 1_700_000_000_000_000
PLAN = plan_reference({"pipeline": "orders", "v": 1})


def _store(binding: D1Binding, root: Path, clock: ManualClock) -> Store:
    return Store.open(root, catalog=D1Catalog(binding.client()), clock=clock)


def test_a_store_commits_and_reads_through_the_d1_catalog(d1_binding: D1Binding, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = _store(d1_binding, tmp_path / "root", clock)
    try:
        first = store.append("orders", pa.table({"id": [1, 2], "amount": [10, 20]}), primary_key=["id"])
        clock.advance(1)
        second = store.append("orders", pa.table({"id": [2, 3], "amount": [21, 30]}), primary_key=["id"])
        assert (first.commit_seq, second.commit_seq) == (1, 2)
        assert (type(store.journal), type(store.awakeables), type(store.blobs), type(store.outbox)) == (
            D1JournalStore, D1AwakeableStore, D1BlobStore, D1OutboxStore)
    finally:
        store.close()

    reopened = _store(d1_binding, tmp_path / "root", clock)  # another catalog handle: what D1 holds
    try:
        table = reopened.table("orders")
        assert table.to_arrow().sort_by("id").to_pydict() == {"id": [1, 2, 3], "amount": [10, 21, 30]}
        assert table.to_arrow(commit_seq=1).sort_by("id").to_pydict() == {"id": [1, 2], "amount": [10, 20]}
        assert [c.commit_seq for c in reopened.catalog.commits("orders")] == [1, 2]
    finally:
        reopened.close()


def test_a_superseded_attempt_commits_nothing(d1_binding: D1Binding, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    store = _store(d1_binding, tmp_path / "root", clock)
    try:
        journal = store.journal
        first = open_execution(journal, "table:orders", PLAN, holder="h1", lease_s=30, clock=clock)
        fence = WriterFence(first.execution_id, "h1", first.attempt, journal.location)
        assert fence.journal == store.catalog.journal_location  # checked inside the commit's batch
        with writing_as(fence):
            assert store.append("orders", pa.table({"id": [1]})).commit_seq == 1

        clock.advance(31)  # h1's lease lapsed: h2 takes the execution over
        second = open_execution(journal, "table:orders", PLAN, holder="h2", lease_s=30, clock=clock)
        assert (second.execution_id, second.attempt) == (first.execution_id, first.attempt + 1)
        with writing_as(fence), pytest.raises(ExecutionWriterFenced) as info:
            store.append("orders", pa.table({"id": [2]}))
        assert info.value.execution == first.execution_id
        assert "attempt 2 of h2" in str(info.value)
        assert store.table("orders").to_arrow().to_pydict() == {"id": [1]}
        assert [c.commit_seq for c in store.catalog.commits("orders")] == [1]
    finally:
        store.close()
