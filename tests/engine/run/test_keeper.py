"""The engine keeper (``run.cancel.engine-keeper``) over every journal adapter.

One keeper per engine renews every registered execution's owner lease and feeds its cancellation
token, sleeping until the earliest deadline; opening an execution registers it, closing or
dropping the handle deregisters it (and a drop records no status). A :class:`ManualClock` and
:meth:`Keeper.tick` make the deadlines exact; the engine's own keeper thread is shown feeding a
token from a mark another handle wrote.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest
from contextful.engine.run.cancel import request_cancel
from contextful.engine.run.dispatch import holds_at
from contextful.engine.run.execution import Execution, open_execution, plan_reference
from contextful.engine.run.keeper import Keeper, engine_keeper
from contextful.storage.clock import ManualClock
from contextful.storage.journal import PENDING, JournalStore

from tests.storage.test_journal_conformance import JournalSite

Opener = Callable[..., Execution]
"""How a scenario opens its executions: ``open_execution`` here; the orchestrator's conformance suite
(``tests/engine/run/test_orchestrate.py``) passes one that opens each as the unit of a provider step."""

T0 = 1_700_000_000_000_000
S = 1_000_000
PLAN = plan_reference({"pipeline": "orders", "v": 1})


def _lease(journal: JournalStore, scope: str) -> int:
    owner = journal.owner(scope)
    assert owner is not None
    return owner.lease_expires_us


@pytest.mark.clause("run.cancel.engine-keeper")
def test_the_keeper_renews_each_lease_at_its_own_deadline_and_sleeps_until_the_earliest(
        journal: JournalStore, open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    keeper = Keeper(clock, poll_s=1000, start=False)  # renewals only: polls are far off
    long = open_execution(journal, "s:long", PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
    short = open_execution(journal, "s:short", PLAN, holder="h", lease_s=10, clock=clock, keeper=keeper)
    assert keeper.registered() == [long.execution_id, short.execution_id]
    assert keeper.next_due_us() == T0 + 5 * S  # half the shorter lease

    clock.advance(4.999)
    assert keeper.tick() == T0 + 5 * S  # nothing due yet: nothing written
    assert (_lease(journal, "s:long"), _lease(journal, "s:short")) == (T0 + 30 * S, T0 + 10 * S)

    clock.advance(0.001)
    assert keeper.tick() == T0 + 10 * S  # the short one renewed; its next renewal is again the earliest
    assert (_lease(journal, "s:long"), _lease(journal, "s:short")) == (T0 + 30 * S, T0 + 15 * S)

    clock.advance(10)
    assert keeper.tick() == T0 + 20 * S  # at 15 s both were due: both renewed
    assert (_lease(journal, "s:long"), _lease(journal, "s:short")) == (T0 + 45 * S, T0 + 25 * S)
    assert (long.lease_expires_us, short.lease_expires_us) == (T0 + 45 * S, T0 + 25 * S)


@pytest.mark.clause("run.cancel.engine-keeper", "run.journal.durable-dispatch")
def test_an_admitted_execution_is_renewed_after_its_callback_and_the_others_meanwhile(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    """A renewal waits behind an admitted callback's hold on the owner row (PostgreSQL, SQLite), so
    the keeper defers that one execution's renewal instead of stalling every other's."""
    clock = ManualClock(T0)
    keeper = Keeper(clock, poll_s=1, start=False)
    busy = open_execution(journal, "s:busy", PLAN, holder="h", lease_s=10, clock=clock, keeper=keeper)
    idle = open_execution(journal, "s:idle", PLAN, holder="h", lease_s=10, clock=clock, keeper=keeper)
    clock.advance(5)
    with busy.admit():
        keeper.tick()  # on the keeper's own thread this would block behind the hold if it renewed busy
        assert busy.admissions == 1
        # PostgreSQL holds only busy's row, so idle renews; SQLite's hold is the database write
        # lock, which every owner write waits behind, so idle's renewal is deferred too.
        idle_lease = T0 + 10 * S if journal.hold_blocks_every_owner_write else T0 + 15 * S
        assert (_lease(journal, "s:busy"), _lease(journal, "s:idle")) == (T0 + 10 * S, idle_lease)
    assert busy.admissions == 0 and holds_at(journal.location) == 0
    clock.advance(1)
    keeper.tick()  # the callback returned: the deferred renewals go through at the next pass
    assert _lease(journal, "s:busy") == T0 + 16 * S
    assert _lease(journal, "s:idle") == (T0 + 16 * S if journal.hold_blocks_every_owner_write else T0 + 15 * S)
    assert idle.lease_expires_us == _lease(journal, "s:idle")  # held here: the keeper keeps only live handles


@pytest.mark.clause("run.cancel.engine-keeper")
def test_the_keeper_feeds_the_token_of_the_marked_execution_only(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    keeper = Keeper(clock, poll_s=1, start=False)
    marked = open_execution(journal, "s:marked", PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
    other = open_execution(journal, "s:other", PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
    request_cancel(journal, marked.execution_id, clock=clock)
    assert not marked.cancel_token.is_set()  # a mark is read at the next poll, not pushed
    clock.advance(1)
    assert keeper.tick() == T0 + 2 * S
    assert marked.cancel_token.is_set() and not other.cancel_token.is_set()
    clock.advance(1)
    assert keeper.tick() == T0 + 3 * S  # the marked one is no longer polled: its next deadline is its renewal
    clock.advance(13)
    keeper.tick()  # at 15 s: renewed although canceled, so nobody takes its scope while it settles
    assert _lease(journal, "s:marked") == T0 + 45 * S


@pytest.mark.clause("run.cancel.engine-keeper", "run.own.unclosed-execution")
def test_close_and_drop_deregister_and_a_drop_records_no_status(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    keeper = Keeper(clock, poll_s=1, start=False)
    closed = open_execution(journal, "s:closed", PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
    dropped: Execution | None = open_execution(journal, "s:dropped", PLAN, holder="h", lease_s=30, clock=clock,
                                               keeper=keeper)
    assert dropped is not None
    dropped_id = dropped.execution_id
    assert keeper.registered() == [closed.execution_id, dropped_id]
    closed.close(ok=True)
    assert keeper.registered() == [dropped_id]
    before = journal.owner("s:dropped")
    dropped = None
    gc.collect()
    assert keeper.registered() == [] and keeper.next_due_us() is None
    clock.advance(60)
    keeper.tick()
    after = journal.owner("s:dropped")
    assert after == before and after is not None and (after.status, after.closed_us) == (PENDING, None)


@pytest.mark.clause("run.cancel.engine-keeper")
def test_one_keeper_per_engine_registers_every_open_and_its_thread_feeds_the_token(
        site: JournalSite, journal: JournalStore, open_execution: Opener = open_execution) -> None:
    first = open_execution(journal, "s:a", PLAN, lease_s=600)
    second = open_execution(journal, "s:b", PLAN, lease_s=600)
    keeper = engine_keeper()
    assert first.keeper is keeper and second.keeper is keeper and engine_keeper() is keeper
    assert {first.execution_id, second.execution_id} <= set(keeper.registered())
    elsewhere = site.open()  # another handle on the catalog: `contextful run cancel` in another process
    try:
        request_cancel(elsewhere, "s:b")
    finally:
        elsewhere.close_store()
    assert second.cancel_token.wait(120)  # the keeper's thread polled the mark and fed the token
    assert not first.cancel_token.is_set()
    first.close(ok=True)
    second.close_canceled()
    assert not {first.execution_id, second.execution_id} & set(keeper.registered())


def test_the_keeper_lets_go_of_an_execution_whose_journal_was_closed(tmp_path: Path,
        open_execution: Opener = open_execution) -> None:
    from contextful.storage.journal import open_journal_store

    clock = ManualClock(T0)
    keeper = Keeper(clock, poll_s=1, start=False)
    journal = open_journal_store("sqlite", path=str(tmp_path / "journal.sqlite"))
    ex = open_execution(journal, "s:a", PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
    journal.close_store()  # the handle outlives its store (a test's traceback, a leak): retrying cannot help
    clock.advance(1)
    assert keeper.tick() is None and keeper.registered() == [] and not ex.closed


@pytest.mark.clause("run.cancel.engine-keeper", "run.journal.durable-dispatch")
def test_a_hold_through_one_handle_defers_renewals_through_another_handle_of_the_same_file(tmp_path: Path) -> None:
    """Holds are counted per journal location: a callback admitted through one handle of a SQLite
    journal holds its write lock, so the keeper defers the renewals of an execution opened through a
    second handle of the same file instead of waiting behind the lock for the busy timeout."""
    import threading

    from contextful.storage.journal import open_journal_store

    path = str(tmp_path / "journal.sqlite")
    first, second = open_journal_store("sqlite", path=path), open_journal_store("sqlite", path=path)
    clock = ManualClock(T0)
    keeper = Keeper(clock, poll_s=1, start=False)
    busy = open_execution(first, "s:busy", PLAN, holder="h", lease_s=10, clock=clock, keeper=keeper)
    other = open_execution(second, "s:other", PLAN, holder="h", lease_s=10, clock=clock, keeper=keeper)
    clock.advance(5)
    ticked = threading.Event()

    def tick() -> None:
        keeper.tick()
        ticked.set()

    with busy.admit():
        threading.Thread(target=tick, daemon=True).start()
        assert ticked.wait(60), "the keeper waited behind the hold another handle of its file keeps"
        assert _lease(second, "s:other") == T0 + 10 * S  # deferred, not attempted
    clock.advance(1)
    keeper.tick()  # the hold ended: the deferred renewal goes through
    assert _lease(second, "s:other") == T0 + 16 * S and other.fenced is None
    first.close_store()
    second.close_store()


@pytest.mark.clause("run.cancel.engine-keeper")
def test_a_renewal_waiting_on_a_locked_catalog_never_lets_the_other_leases_lapse(tmp_path: Path) -> None:
    """The keeper's thread hands each renewal to a thread of its own: one journal whose write lock
    another process holds keeps its renewal waiting, and every other execution is renewed meanwhile."""
    import sqlite3
    import time

    from contextful.storage.clock import SystemClock
    from contextful.storage.journal import open_journal_store

    locked_path = str(tmp_path / "locked.sqlite")
    locked, free = open_journal_store("sqlite", path=locked_path), open_journal_store("sqlite",
                                                                                     path=str(tmp_path / "free.sqlite"))
    keeper = Keeper(SystemClock(), poll_s=1000)
    try:
        stuck = open_execution(locked, "s:stuck", PLAN, holder="h", lease_s=0.4, keeper=keeper)
        kept = open_execution(free, "s:kept", PLAN, holder="h", lease_s=0.4, keeper=keeper)
        stuck_lease = _lease(locked, "s:stuck")
        blocker = sqlite3.connect(locked_path, isolation_level=None)  # another process's write transaction
        blocker.execute("BEGIN IMMEDIATE")
        try:
            renewals, last = 0, kept.lease_expires_us
            deadline = time.monotonic() + 60  # a bound for the failure case only: renewals come every 0.2 s
            while renewals < 5:
                assert time.monotonic() < deadline, "the other lease was not renewed while one renewal waited"
                time.sleep(0.05)
                if kept.lease_expires_us != last:
                    renewals, last = renewals + 1, kept.lease_expires_us
            assert stuck.lease_expires_us == stuck_lease  # its renewal is the one still waiting
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        stuck.close(ok=True)
        kept.close(ok=True)
    finally:
        locked.close_store()
        free.close_store()
