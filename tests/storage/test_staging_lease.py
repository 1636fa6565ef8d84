"""A run that stalled past its staging lease publishes nothing collection may have taken.

Collection (``storage.collect``) takes a staging run whose lease lapsed for abandoned: it ends the
lease and deletes the run's objects once they are older than the grace period. A run that was only
stalled (a stopped process, a paused host) and resumes afterwards must not commit parts that are
gone: its commit requires its staging lease, in the commit transaction (``AssertStaging``), and is
refused with nothing landed. On every store kind.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.errors import CommitConflict, StagingLeaseLost
from contextful.storage.staging import STAGING_LEASE_S

from tests.conftest import StoreFactory


def test_a_run_stalled_past_its_staging_lease_commits_nothing_collection_took(
        make_store: StoreFactory, store_kind: str) -> None:
    store: Store = make_store(clock=ManualClock())
    table = store.create_table("events")
    table.append(pa.table({"id": [1]}))
    stalled = table.transaction()
    stalled.stage(pa.table({"id": [2, 3]}))
    staged = stalled.staged_uris
    assert staged
    store.clock.advance(STAGING_LEASE_S + 1)  # type: ignore[attr-defined]  # it made no progress for a lease
    taken = store.collect(grace_seconds=0)  # the lease lapsed: its objects are orphans now
    assert taken.orphans
    with pytest.raises(CommitConflict) as info:
        stalled.commit()
    assert info.value.fields["failed"] == "AssertStaging" and stalled.run_id in info.value.detail
    assert table.refresh().commit_seq == 1
    assert sorted(table.to_arrow().column("id").to_pylist()) == [1]  # every snapshot still reads whole


def test_a_run_that_stages_again_after_collection_ended_its_lease_stops_by_name(
        make_store: StoreFactory, store_kind: str) -> None:
    store: Store = make_store(clock=ManualClock())
    table = store.create_table("events")
    stalled = table.transaction()
    stalled.stage(pa.table({"id": [1]}))
    store.clock.advance(STAGING_LEASE_S + 1)  # type: ignore[attr-defined]
    store.collect(grace_seconds=0)
    with pytest.raises(StagingLeaseLost) as info:  # its renewal finds the lease gone: it stages nothing more
        stalled.stage(pa.table({"id": [2]}))
    assert (info.value.table, info.value.run_id) == ("events", stalled.run_id)
    stalled.abort()
    assert table.refresh().commit_seq == 0 and "lands nothing" in str(info.value)
