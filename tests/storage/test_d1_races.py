"""The D1 adapters' compare-and-swap under a race landing between their read and their batch.

D1 holds no lock between a read and the write it decides (its transaction is one batch), so each
adapter checks in Python and then sends a batch conditional on what it read. These tests make the
race happen deterministically: a subclass lands a rival write right after the adapter's read and
checks, before its batch. The batch must then change nothing, and the adapter decide again on
what is there now: a commit whose staging lease collection took lands nothing and names
AssertStaging; a commit whose head moved lands on the new head; a claim whose scope another holder
took is refused naming that holder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from contextful.storage.clock import ManualClock
from contextful.storage.commits import AddParts, AssertStaging, CommitRequest, PartFile
from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.journal import D1JournalStore
from contextful.storage.errors import CommitConflict, ExecutionHeld
from contextful.storage.journal import OwnerRow

pytestmark = pytest.mark.d1

UUID = "4b1d6f0e-0000-4000-8000-000000000001"
T0 = 1_700_000_000_000_000
LEASE = 30_000_000
PLAN = "a" * 64


class RacedCatalog(D1Catalog):
    """Runs ``rival`` once, after the commit's checks passed and before its batch is sent."""

    rival: Callable[[], None] | None = None

    def _check(self, cur: Any, request: CommitRequest, uuid: str, head_seq: int, schema_id: int) -> None:
        super()._check(cur, request, uuid, head_seq, schema_id)
        rival, self.rival = self.rival, None
        if rival is not None:
            rival()


def _request(run_id: str, *requirements: Any) -> CommitRequest:
    return CommitRequest(table="t", run_id=run_id, kind="append", manifest=f"tables/t/runs/{run_id}.json",
                         requirements=tuple(requirements), updates=(AddParts((PartFile(f"{run_id}.parquet", 1, 10),)),),
                         rows=1)


def test_a_staging_lease_taken_between_check_and_batch_lands_nothing(d1_binding: D1Binding) -> None:
    catalog, collector = RacedCatalog(d1_binding.client()), D1Catalog(d1_binding.client())
    catalog.create_table("t", UUID, (), T0)
    catalog.begin_staging("t", "r1", "h1", T0, LEASE)
    catalog.rival = lambda: collector.end_staging("t", "r1", lapsed_at_us=T0 + LEASE)  # collection took it
    with pytest.raises(CommitConflict) as info:
        catalog.commit(_request("r1", AssertStaging("r1")), ManualClock(T0 + 1))
    assert info.value.failed == "AssertStaging"
    head = collector.load_head("t")
    assert head is not None and head.commit_seq == 0
    assert collector.commits("t") == [] and collector.all_parts("t") == []


def test_a_head_moved_between_check_and_batch_lands_the_commit_on_the_new_head(d1_binding: D1Binding) -> None:
    catalog, rival = RacedCatalog(d1_binding.client()), D1Catalog(d1_binding.client())
    catalog.create_table("t", UUID, (), T0)
    catalog.rival = lambda: rival.commit(_request("rival"), ManualClock(T0 + 1)) and None
    assert catalog.commit(_request("mine"), ManualClock(T0 + 2)) == 2
    assert [(c.commit_seq, c.run_id) for c in rival.commits("t")] == [(1, "rival"), (2, "mine")]
    assert sorted(p.path for p in rival.live_parts("t", 2)) == ["mine.parquet", "rival.parquet"]


class RacedJournal(D1JournalStore):
    """Runs ``rival`` once, after an owner verb read its row and before it writes."""

    rival: Callable[[], None] | None = None

    def owner(self, scope: str) -> OwnerRow | None:
        row = super().owner(scope)
        rival, self.rival = self.rival, None
        if rival is not None:
            rival()
        return row


def test_a_scope_claimed_between_read_and_swap_refuses_the_claim(d1_binding: D1Binding) -> None:
    journal, rival = RacedJournal(d1_binding.client()), D1JournalStore(d1_binding.client())
    journal.rival = lambda: rival.claim("orders", PLAN, "h2", T0, LEASE) and None
    with pytest.raises(ExecutionHeld) as info:  # it read no owner, then found h2's on its insert
        journal.claim("orders", PLAN, "h1", T0 + 1, LEASE)
    assert info.value.holder == "h2"
    owner = rival.owner("orders")
    assert owner is not None and (owner.holder, owner.attempts) == ("h2", 1)
