"""Admission before effects: the current-owner check on every adapter, and on PostgreSQL the owner
row held through the admitted callback (``run.journal.current-owner``,
``run.journal.durable-dispatch``, ``run.export.writer-fenced``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from contextful.engine.run.dispatch import DISPATCH, PUBLICATION, drain_admitted
from contextful.engine.run.execution import Execution, open_execution
from contextful.engine.run.keeper import Keeper
from contextful.engine.run.owners import Scope
from contextful.storage.clock import ManualClock
from contextful.storage.errors import ExecutionWriterFenced
from contextful.storage.journal import JournalStore, open_journal_store
from contextful.storage.outbox import OutboxEvent, open_outbox_store

PLAN = "a" * 64
SCOPE = Scope.host("export:orders")
PARENT = Scope.host("job:orders")
"""An ancestor of the export's items: admission holds its owner row too."""


def _open(journal: JournalStore, clock: ManualClock, holder: str) -> Execution:
    # a keeper of the test's clock that never runs: no renewal behind the test's back on a slow machine
    return open_execution(journal, SCOPE, PLAN, holder=holder, lease_s=30, clock=clock, pins={"input": "orders@1"},
                          keeper=Keeper(clock, start=False))


def _refused(execution: Execution, boundary: str) -> ExecutionWriterFenced:
    """Try to enter ``boundary``; the block must not run."""
    ran: list[str] = []
    with pytest.raises(ExecutionWriterFenced) as info, execution.admit(boundary):
        ran.append(boundary)
    assert ran == [] and info.value.boundary == boundary and info.value.execution == execution.execution_id
    return info.value


@pytest.mark.clause("run.journal.current-owner")
def test_only_the_current_attempt_enters_dispatch_or_publication(journal: JournalStore) -> None:
    clock = ManualClock()
    first = _open(journal, clock, "a")
    entered: list[str] = []
    for boundary in (DISPATCH, PUBLICATION):
        with first.admit(boundary) as row:
            entered.append(boundary)
            assert row.execution_id == first.execution_id and row.pin_map() == {"input": "orders@1"}
    assert entered == [DISPATCH, PUBLICATION]

    again = _open(journal, clock, "a")  # the same holder claims again: attempt 2 supersedes attempt 1
    assert (again.execution_id, again.attempt) == (first.execution_id, 2)
    for boundary in (DISPATCH, PUBLICATION):
        assert "attempt 2 of a" in _refused(first, boundary).reason
    with again.admit(DISPATCH):
        entered.append("again")

    clock.advance(31)  # its lease lapsed without renewal: not the current writer either
    assert "lapsed" in _refused(again, DISPATCH).reason
    taken = _open(journal, clock, "b")
    assert "attempt 3 of b" in _refused(again, PUBLICATION).reason
    journal.retire(taken.execution_id, clock.now_us())  # retired under it
    assert "retired" in _refused(taken, DISPATCH).reason
    fresh = _open(journal, clock, "c")  # a new execution replaced it
    assert "no owner" in _refused(taken, PUBLICATION).reason
    fresh.close(ok=True)
    assert "closed" in _refused(fresh, DISPATCH).reason
    assert entered == [DISPATCH, PUBLICATION, "again"]


@pytest.mark.clause("run.journal.current-owner")
def test_an_items_ancestor_and_entity_fences_must_be_current_too(journal: JournalStore) -> None:
    clock = ManualClock()
    parent = open_execution(journal, PARENT, PLAN, holder="job", lease_s=600, clock=clock)
    item = _open(journal, clock, "a")
    fence = Scope.host("fence:customer-7")
    with pytest.raises(ExecutionWriterFenced) as absent, item.admit(DISPATCH, fences=[PARENT, fence]):
        pytest.fail("admitted with a fence no owner holds")
    assert "fence:customer-7" in absent.value.reason
    open_execution(journal, fence, PLAN, holder="fencer", lease_s=600, clock=clock)
    with item.admit(DISPATCH, fences=[PARENT, fence]) as row:
        assert row.execution_id == item.execution_id
    journal.retire(parent.execution_id, clock.now_us())  # the ancestor is superseded: its items stop
    with pytest.raises(ExecutionWriterFenced) as info, item.admit(PUBLICATION, fences=[PARENT]):
        pytest.fail("admitted under a retired ancestor")
    assert PARENT.key in info.value.reason


# --- PostgreSQL: the owner row is held through the admitted callback ---------------------------------


def _backend_waits_on_a_lock(dsn: str, pid: int) -> Callable[[], bool]:
    def waiting() -> bool:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT wait_event_type, cardinality(pg_blocking_pids(pid)) FROM pg_stat_activity"
                               " WHERE pid = %s", (pid,)).fetchone()
        return row is not None and row[0] == "Lock" and row[1] > 0

    return waiting


def _wait_until(condition: Callable[[], bool], done: threading.Event) -> None:
    """Poll ``condition`` until it holds; a thread that finished instead fails the test at once."""
    while not condition():
        assert not done.wait(0.05), "the owner write finished while the admitted callback still ran"


@pytest.mark.postgres
@pytest.mark.clause("run.journal.durable-dispatch", "run.export.writer-fenced")
@pytest.mark.parametrize("operation", ["takeover", "retirement", "ancestor retirement"])
def test_an_owner_write_waits_for_the_admitted_callback_and_the_old_writer_is_fenced_after(
        pg_dsn: str, pg_schema: str, operation: str) -> None:
    mine = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)
    theirs = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)  # another connection (process)
    clock = ManualClock()
    parent = open_execution(mine, PARENT, PLAN, holder="job", lease_s=600, clock=clock)
    writer = _open(mine, clock, "exporter-1")
    events: list[str] = []
    admitted, release, written = threading.Event(), threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def callback() -> None:
        try:
            with writer.admit(DISPATCH, fences=[PARENT]):
                admitted.set()
                release.wait()  # the outbound call, in flight
                events.append("callback returned")
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failures.append(exc)
            admitted.set()

    def owner_write() -> None:
        try:
            if operation == "takeover":
                _open(theirs, clock, "exporter-2")
            elif operation == "retirement":
                theirs.retire(writer.execution_id, clock.now_us())
            else:
                theirs.retire(parent.execution_id, clock.now_us())
            events.append(operation)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failures.append(exc)
        finally:
            written.set()

    calling = threading.Thread(target=callback)
    calling.start()
    admitted.wait()
    assert failures == []
    clock.advance(31)  # the lease lapses mid-call: only the held row stands between it and takeover
    writing = threading.Thread(target=owner_write)
    writing.start()
    try:
        _wait_until(_backend_waits_on_a_lock(pg_dsn, theirs._conn.info.backend_pid), written)
        assert events == []  # the owner write is blocked behind the admitted callback
    finally:
        release.set()
        calling.join()
        writing.join()
    assert failures == [] and events == ["callback returned", operation]
    row = mine.owner(SCOPE.key if operation != "ancestor retirement" else PARENT.key)
    assert row is not None
    if operation == "takeover":
        assert (row.holder, row.attempts) == ("exporter-2", 2)
    else:
        assert row.status == "retired"

    # the writer whose lease transferred (or whose ancestor retired) enters neither boundary now
    for boundary in (DISPATCH, PUBLICATION):
        with pytest.raises(ExecutionWriterFenced), writer.admit(boundary, fences=[PARENT]):
            pytest.fail(f"a superseded writer entered {boundary}")
    mine.close_store()
    theirs.close_store()


@pytest.mark.postgres
@pytest.mark.clause("run.export.writer-fenced")
def test_a_writer_whose_lease_transferred_is_fenced_before_dispatch_and_publication(
        pg_dsn: str, pg_schema: str) -> None:
    mine = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)
    theirs = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)
    clock = ManualClock()
    writer = _open(mine, clock, "exporter-1")
    sent: list[Any] = []
    clock.advance(31)
    replacement = _open(theirs, clock, "exporter-2")  # a replacement machine took the lease over
    for boundary in (DISPATCH, PUBLICATION):
        fenced = _refused(writer, boundary)
        assert "exporter-2" in fenced.reason and fenced.attempt == 1
    with replacement.admit(DISPATCH):
        sent.append("event 1")
    with replacement.admit(PUBLICATION):
        sent.append("state")
    assert sent == ["event 1", "state"]
    mine.close_store()
    theirs.close_store()


@pytest.mark.postgres
@pytest.mark.clause("run.export.writer-fenced", "run.export.remote-state")
def test_an_exporter_whose_lease_transferred_sends_and_publishes_nothing_and_its_replacement_drains(
        pg_dsn: str, pg_schema: str) -> None:
    """The outbox drained through admission: the superseded writer is fenced before its first send,
    every event stays pending, and the replacement reoffers exactly those ids."""
    mine = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)
    theirs = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)
    outbox = open_outbox_store("postgres", dsn=pg_dsn, schema=pg_schema)
    clock = ManualClock()
    writer = _open(mine, clock, "exporter-1")
    outbox.stage("orders", [(1, "orders/1", "upsert", b"one"), (2, "orders/2", "upsert", b"two")], 2,
                 clock.now_us())
    sent: list[str] = []

    def send(event: OutboxEvent) -> dict[str, bytes]:
        sent.append(event.event_id)
        return {event.event_id: event.payload}

    clock.advance(31)
    replacement = _open(theirs, clock, "exporter-2")  # a replacement machine took the lease over
    with pytest.raises(ExecutionWriterFenced) as fenced:
        drain_admitted(writer, outbox, "orders", send)
    assert fenced.value.boundary == DISPATCH and sent == []
    assert [e.event_id for e in outbox.pending("orders")] == ["orders/1", "orders/2"]
    delivered = drain_admitted(replacement, outbox, "orders", send)
    assert [e.event_id for e in delivered] == sent == ["orders/1", "orders/2"]
    assert outbox.pending("orders") == [] and outbox.acknowledged("orders", "orders/2") == b"two"
    outbox.close()
    mine.close_store()
    theirs.close_store()
