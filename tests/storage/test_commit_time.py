"""Transaction time (``as_of``): a commit's time is taken under the catalog's lock, never earlier
than any commit before it in the catalog, so an instant once answered keeps its answer.

On SQLite and on the real PostgreSQL, with an injected clock and a real lock wait: a raw
connection holds what a commit must wait for, the commit begins and waits (the test learns it
from the catalog's own write path, not from a sleep), the clock moves on and a reader is answered
``as_of`` an instant; only then is the lock released. A reserved instant
(``Catalog.reserve_instant``) is no earlier than any commit landed before it, whatever the
reserving host's clock says, and every later commit is stamped after it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.errors import SnapshotNotFound

from tests.storage.catalog_place import CatalogPlace
from tests.storage.hooked_catalog import Hooks

T0 = 1_700_000_000_000_000
SECOND = 1_000_000


@pytest.fixture
def stores(place: CatalogPlace) -> Iterator[tuple[Store, Store, ManualClock, Hooks]]:
    """A writer (its clock and hooks) and a reader with a clock of its own, on one catalog."""
    clock, hooks = ManualClock(T0), Hooks()
    writer = place.store(clock, hooks)
    reader = place.store(ManualClock(T0))
    yield writer, reader, clock, hooks
    hooks.before_write = None
    writer.close()
    reader.close()


def ids(store: Store, as_of: int) -> list[int]:
    return sorted(store.table("t").to_arrow(as_of=as_of).column("id").to_pylist())


def test_a_commit_that_waited_for_the_lock_is_timed_after_instants_already_answered(
        place: CatalogPlace, stores: tuple[Store, Store, ManualClock, Hooks]) -> None:
    writer, reader, clock, hooks = stores
    writer.create_table("t").append(pa.table({"id": [1]}))
    clock.advance(1)
    txn = writer.table("t").transaction()
    txn.stage(pa.table({"id": [2]}))  # staging writes to the catalog too: before the lock is taken
    waiting = threading.Event()
    failure: list[BaseException] = []

    def commit() -> None:
        try:
            txn.commit()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)

    with place.write_lock("t"):
        hooks.before_write = waiting.set  # the commit's transaction begins, then waits on the lock
        committer = threading.Thread(target=commit)
        committer.start()
        assert waiting.wait(60)
        hooks.before_write = None
        clock.advance(1)
        served = clock.now_us()
        assert ids(reader, served) == [1]  # answered while the commit waits
        clock.advance(1)
    committer.join(120)
    assert not committer.is_alive() and not failure, failure
    landed = writer.table("t").commits()[-1]
    assert landed.committed_us > served
    assert ids(reader, served) == [1]  # the instant keeps its answer
    assert ids(reader, clock.now_us()) == [1, 2]


def test_commit_time_never_runs_behind_another_tables_commit(stores: tuple[Store, Store, ManualClock, Hooks]) -> None:
    writer, reader, clock, _ = stores
    writer.create_table("b")
    clock.advance(10)
    writer.append("a", pa.table({"id": [1]}))
    a_at = writer.table("a").commits()[-1].committed_us
    clock.advance(-5)  # a committer whose clock lags behind the catalog's last commit
    writer.table("b").append(pa.table({"id": [1]}))
    b_at = writer.table("b").commits()[-1].committed_us
    assert b_at >= a_at
    # so an instant between the two answers a's commit without b's, as it did before b landed
    assert reader.table("a").count(as_of=a_at) == 1
    with pytest.raises(SnapshotNotFound):
        reader.table("b").snapshot(as_of=a_at - 1)


def test_a_reserved_instant_follows_every_landed_commit_and_precedes_every_later_one(
        stores: tuple[Store, Store, ManualClock, Hooks]) -> None:
    writer, reader, clock, _ = stores
    clock.advance(2)  # the writer's clock runs 2 s ahead of the reader's
    writer.create_table("t").append(pa.table({"id": [1]}))
    landed_us = writer.table("t").commits()[-1].committed_us
    reserved = reader.catalog.reserve_instant(reader.clock)
    assert reserved >= landed_us > reader.clock.now_us()
    assert ids(reader, reserved) == [1]  # what landed before the reservation, on the reader's clock too
    reader.table("t").append(pa.table({"id": [2]}))  # a committer whose clock is behind the instant
    writer.table("t").append(pa.table({"id": [3]}))  # and one whose clock stands at it
    assert all(c.committed_us > reserved for c in writer.table("t").commits()[1:])
    assert ids(reader, reserved) == [1]  # the instant keeps its answer
    assert reader.catalog.reserve_instant(reader.clock) > reserved
