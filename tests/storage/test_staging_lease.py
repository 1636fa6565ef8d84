"""A run that stalled past its staging lease publishes nothing collection may have taken.

Collection (``storage.collect``) takes a staging run whose lease lapsed for abandoned: it ends the
lease and deletes the run's objects once they are older than the grace period. A run that was only
stalled (a stopped process, a paused host) and resumes afterwards must not commit parts that are
gone: its commit requires its staging lease, in the commit transaction (``AssertStaging``), and is
refused with nothing landed. On every store kind.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.errors import CommitConflict, StagingLeaseLost
from contextful.storage.staging import STAGING_LEASE_S, StagingLease, staging_keeper

from tests.conftest import StoreFactory
from tests.storage.catalog_place import CatalogPlace
from tests.storage.hooked_catalog import Hooks


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


def test_a_run_quiet_for_hours_between_stages_keeps_its_parts_and_commits(
        make_store: StoreFactory, store_kind: str) -> None:
    """A slow source buffering its flush stages nothing for hours; its process lives, so the keeper
    renews its lease each half lease and collection keeps its parts (on a wall clock the keeper's
    thread ticks; on the test's clock the test ticks it)."""
    store: Store = make_store(clock=ManualClock())
    table = store.create_table("events")
    quiet = table.transaction()
    quiet.stage(pa.table({"id": [1, 2]}))
    for _ in range(6):  # three hours without a stage call
        store.clock.advance(STAGING_LEASE_S / 2)  # type: ignore[attr-defined]
        staging_keeper().tick()
    taken = store.collect(grace_seconds=0)
    assert not [uri for uri in quiet.staged_uris if any(uri.endswith(o) for o in taken.orphans)]
    quiet.stage(pa.table({"id": [3]}))
    quiet.commit()
    assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2, 3]  # every part is there
    assert store.catalog.staging_runs("events") == []  # the commit ended the lease
    assert quiet._lease not in staging_keeper().held()  # and the keeper let it go


def test_the_keeper_thread_renews_a_held_lease_on_wall_time(make_store: StoreFactory) -> None:
    store: Store = make_store()  # the system clock: the keeper's own thread renews
    lease = StagingLease(store, "events", "run-quiet", lease_s=0.2)
    first = store.catalog.staging_runs("events")[0].expires_us
    deadline = time.monotonic() + 60
    while store.catalog.staging_runs("events")[0].expires_us == first:  # the renewal is the event
        assert time.monotonic() < deadline, "the keeper never renewed the lease"
        time.sleep(0.01)
    lease.end()
    assert store.catalog.staging_runs("events") == [] and lease not in staging_keeper().held()


def test_a_renewal_by_the_keeper_that_finds_the_lease_gone_stops_the_run_by_name(
        make_store: StoreFactory) -> None:
    store: Store = make_store(clock=ManualClock())
    table = store.create_table("events")
    stalled = table.transaction()
    stalled.stage(pa.table({"id": [1]}))
    store.clock.advance(STAGING_LEASE_S + 1)  # type: ignore[attr-defined]  # the process was stopped
    store.collect(grace_seconds=0)  # collection ended the lapsed lease
    assert staging_keeper().tick() == 0  # the process resumes: the keeper's renewal finds it gone
    assert stalled._lease not in staging_keeper().held()
    with pytest.raises(StagingLeaseLost):
        stalled.stage(pa.table({"id": [2]}))
    stalled.abort()
    assert table.refresh().commit_seq == 0


def test_a_lease_dropped_without_commit_or_abort_is_no_longer_renewed(make_store: StoreFactory) -> None:
    store: Store = make_store(clock=ManualClock())
    lease = weakref.ref(StagingLease(store, "events", "run-dropped"))
    gc.collect()
    assert lease() is None  # the keeper holds leases weakly: the lease lapses as after a crash
    (before,) = store.catalog.staging_runs("events")
    store.clock.advance(STAGING_LEASE_S / 2)  # type: ignore[attr-defined]
    staging_keeper().tick()
    assert store.catalog.staging_runs("events") == [before]


def test_a_renewal_landing_after_collection_read_the_lapsed_lease_keeps_the_run(place: CatalogPlace) -> None:
    """Collection reads a lease as lapsed, then the run's keeper renews it before collection ends
    it: the renewal wins (collection's delete is conditional on the lease still lapsed), so a live
    run is neither stopped nor robbed of its parts."""
    clock = ManualClock()
    hooks = Hooks()
    collector = place.store(clock, hooks)
    runner = place.store(clock)
    try:
        table = runner.create_table("events")
        live = table.transaction()
        live.stage(pa.table({"id": [1, 2]}))
        clock.advance(STAGING_LEASE_S + 1)  # the keeper was held up past the lease (a frozen host)
        fired: list[str] = []

        def renew_after_collection_read_it(statement: str, params: Sequence[Any]) -> None:
            if not fired and "cf_staging" in statement:
                fired.append(statement)
                assert staging_keeper().tick() >= 1  # the keeper's renewal lands now

        hooks.after_read = renew_after_collection_read_it
        taken = collector.collect(grace_seconds=0)
        hooks.after_read = None
        assert fired, "the interleaving was never injected"
        assert not [o for o in taken.orphans if live.run_id in o]
        assert [r.run_id for r in runner.catalog.staging_runs("events")] == [live.run_id]
        live.commit()
        assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2]
    finally:
        collector.close()
        runner.close()


def test_a_lease_keeps_its_runs_parts_on_every_table(make_store: StoreFactory, store_kind: str) -> None:
    """An input landed by its decoder child (``engine.land.input_landing``) stages parts for the
    root and its child tables under one lease on the root, and the landing process adopts them into
    each table's run: collection keeps every object named by a live lease's run id, on any table,
    and takes them once the lease ends and nothing references them."""
    from contextful.storage.parts import part_key, write_part

    store: Store = make_store()
    store.create_table("events")
    lease = StagingLease(store, "events", "r20261205T000000-input000001")
    keys = [part_key(name, lease.run_id, 0) for name in ("events", "events__tags", "events__tags__more")]
    for key in keys:
        write_part(store.objects, key, pa.table({"id": [1]}).to_batches(), pa.schema([("id", pa.int64())]))
    assert store.collect(grace_seconds=0).orphans == []
    assert all(store.objects.exists(key) for key in keys)
    lease.end()
    assert sorted(store.collect(grace_seconds=0).orphans) == sorted(keys)
    assert not any(store.objects.exists(key) for key in keys)
