"""A one-row commit's catalog round trips, and the guarantees fewer trips must keep (bench/README.md,
"Commit latency"; docs/store.md, "A run's round trips").

On SQLite and on the real PostgreSQL, through hooked catalogs that see every read statement and
every write transaction the catalog's own paths make (``tests.storage.hooked_catalog``):

- a run's opening reads its table's head in the write transaction that takes its staging lease (no
  read of its own), then writes its plan row, before anything is staged; opening on a table that
  does not exist takes no lease and writes no plan row;
- a one-row append to a table that already has commits makes three write transactions (the
  opening, the plan row, the commit) and reads nothing the commit does not need: no head read before
  the commit when nothing moved, no snapshot for a compaction check that finds nothing due.

With the head read once, at the opening, a run commits at that head; what moved since is caught by
the commit's requirements, on every store (local, PostgreSQL catalog, S3 root): a schema another
writer changed meanwhile is read on the retry and the run lands reconciled with it (its rows read
back as a plain Python oracle says), and a table dropped and created again meanwhile refuses the
commit (CommitConflict) and keeps only its own rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from contextful.storage import ManualClock
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.errors import CommitConflict, TableNotFound

from tests.conftest import StoreFactory
from tests.storage.catalog_place import CatalogPlace
from tests.storage.hooked_catalog import Hooks


@dataclass
class Trips:
    """What the catalog was asked, in order: ``("read", statement)`` and ``("write", "")``."""

    seen: list[tuple[str, str]] = field(default_factory=list)

    def hooks(self) -> Hooks:
        def read(statement: str, _params: Sequence[Any]) -> None:
            self.seen.append(("read", statement))

        return Hooks(after_read=read, before_write=lambda: self.seen.append(("write", "")))

    def take(self) -> list[tuple[str, str]]:
        taken, self.seen = self.seen, []
        return taken


def writes(trips: list[tuple[str, str]]) -> int:
    return sum(1 for kind, _ in trips if kind == "write")


def reads(trips: list[tuple[str, str]]) -> list[str]:
    return [statement for kind, statement in trips if kind == "read"]


@pytest.mark.clause("run.record.reserved-table")
def test_a_run_reads_its_head_in_the_write_that_takes_its_lease_then_writes_its_plan_row(
        place: CatalogPlace) -> None:
    trips = Trips()
    store = place.store(ManualClock(), trips.hooks())
    try:
        table = store.create_table("t")
        trips.take()
        txn = table.transaction()
        assert trips.take() == [("write", ""), ("write", "")]  # the head with the lease; the plan row
        assert [row.run_id for row in store.catalog.staging_runs("t")] == [txn.run_id]
        planned = store.runs.select("SELECT run_id, phase, status FROM __cf_history").to_pylist()
        assert planned == [{"run_id": txn.run_id, "phase": "plan", "status": "planned"}]
        txn.stage(pa.table({"id": [1]}))
        txn.commit()
        assert table.to_arrow().column("id").to_pylist() == [1]
        assert store.catalog.staging_runs("t") == []

        store.drop_table("t")
        with pytest.raises(TableNotFound):
            table.transaction(run_id="r-gone")
        assert store.catalog.staging_runs("t") == []  # nothing of the refused run was written
        assert store.runs.select("SELECT * FROM __cf_history WHERE run_id = 'r-gone'").num_rows == 0
    finally:
        store.close()


def test_a_one_row_append_to_a_warm_table_makes_three_catalog_writes_and_no_needless_read(
        place: CatalogPlace) -> None:
    trips = Trips()
    store = place.store(ManualClock(), trips.hooks())
    try:
        set_policy(store, CompactionPolicy(fanout=4))
        for i in range(6):  # four one-row commits fold into one part; two more stay as they are
            store.append("t", pa.table({"id": [i]}))
        trips.take()
        store.append("t", pa.table({"id": [6]}))
        seen = trips.take()
        live = store.catalog.live_parts("t", store.table("t").head.commit_seq)
        assert len(live) == 4 and store.table("t").commits()[-1].kind == "append"  # a check, no fold due
        assert writes(seen) == 3, seen  # the run's opening, its plan row and its commit
        # the head before the append (is the table there), after its commit (the handle's), the run
        # records awaiting a flush, the compaction policy and the live parts it decides on
        assert len(reads(seen)) == 5, reads(seen)
        assert sorted(store.table("t").to_arrow().column("id").to_pylist()) == list(range(7))
    finally:
        store.close()


def test_a_schema_changed_between_a_runs_opening_and_its_commit_is_read_and_reconciled(
        make_store: StoreFactory, store_kind: str) -> None:
    mine, other = make_store(clock=ManualClock()), make_store(clock=ManualClock())
    mine.create_table("t", primary_key=("id",)).append(pa.table({"id": [1], "a": [10]}))
    txn = mine.table("t").transaction()
    txn.stage(pa.table({"id": [2], "a": [20], "b": ["two"]}))
    other.table("t").append(pa.table({"id": [3], "a": [30], "c": [3.5]}))  # the schema moves meanwhile
    result = txn.commit()
    assert result.commit_seq == 3
    got = mine.table("t").to_arrow()
    oracle = [{"id": 1, "a": 10, "c": None, "b": None}, {"id": 2, "a": 20, "c": None, "b": "two"},
              {"id": 3, "a": 30, "c": 3.5, "b": None}]
    assert got.schema.names == ["id", "a", "c", "b"]
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == oracle
    assert other.table("t").to_arrow().num_rows == 3


def test_a_table_dropped_and_created_again_after_a_runs_opening_refuses_its_commit(
        make_store: StoreFactory, store_kind: str) -> None:
    mine, other = make_store(clock=ManualClock()), make_store(clock=ManualClock())
    mine.create_table("t").append(pa.table({"id": [1]}))
    txn = mine.table("t").transaction()
    txn.stage(pa.table({"id": [2]}))
    other.drop_table("t")
    other.create_table("t").append(pa.table({"id": [3]}))
    with pytest.raises(CommitConflict) as refused:
        txn.commit()
    assert refused.value.table == "t"
    txn.abort()
    assert other.table("t").to_arrow().column("id").to_pylist() == [3]  # the new table keeps only its own
    assert [c.kind for c in other.table("t").commits()] == ["append"]
