"""A suspended or waiting execution hears that it was canceled (engine.run.awakeable).

A thread waits in :meth:`Execution.suspend`; the test cancels the execution through the public verb
(:func:`engine.run.cancel.request_cancel`) while it waits. The clock is a ManualClock and the
keeper is driven by hand (``Keeper(start=False)``, :meth:`Keeper.tick`): the awakeable's deadline
never comes unless the test moves the clock there, so a wait that ends did so because it heard the
cancel. The test learns the wait began from ``on_token`` (an event), never from a sleep. Every test
runs on each journal adapter (files, SQLite, PostgreSQL: the ``journal`` fixture of
``tests/engine/run/conftest.py``), with the awakeable store beside it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from contextful.engine.run.cancel import request_cancel
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.engine.run.keeper import CANCEL_POLL_S, Keeper
from contextful.engine.run.orchestrate import EngineOrchestrator
from contextful.storage.awakeables import PENDING, awakeable_store_beside
from contextful.storage.clock import ManualClock
from contextful.storage.errors import ExecutionSuspended, RunCanceled
from contextful.storage.journal import CLOSED_CANCELED, JournalStore
from contextful.storage.journal import PENDING as OWNER_PENDING

T0 = 1_700_000_000_000_000
HOUR_S = 3600
DEADLINE = T0 + HOUR_S * 1_000_000
PLAN = plan_reference({"job": "approvals", "v": 1})
TIMEOUT_S = 60.0
"""How long the test waits for the waiter's thread to end: an event with a bound, never a guess."""


class Waiter:
    """A thread running ``wait()``; ``began`` is set with the token once the suspension is pending."""

    def __init__(self, wait: Any) -> None:
        self.began = threading.Event()
        self.token = ""
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._run, args=(wait,), daemon=True)
        self.thread.start()

    def on_token(self, token: str) -> None:
        self.token = token
        self.began.set()

    def _run(self, wait: Any) -> None:
        try:
            self.outcome["value"] = wait(self)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.outcome["error"] = exc
        finally:
            self.began.set()

    def end(self, clock: ManualClock) -> dict[str, Any]:
        """Join the thread; one still waiting after :data:`TIMEOUT_S` did not hear the cancel: it is
        released by moving the clock past the deadline, and the test fails."""
        self.thread.join(TIMEOUT_S)
        if self.thread.is_alive():
            clock.advance(2 * HOUR_S)
            self.thread.join(TIMEOUT_S)
            pytest.fail(f"the wait did not end on cancel; past the deadline it ended with {self.outcome}")
        return self.outcome


def _recorded_labels(journal: JournalStore, execution_id: str) -> list[str]:
    return [step.label for step in journal.steps(execution_id)]


def _awakeable_state(journal: JournalStore, token: str) -> str:
    store = awakeable_store_beside(journal)
    try:
        row = store.get(token)
        assert row is not None
        return row.state
    finally:
        store.close_store()


@pytest.mark.clause("run.cancel.abandoned-work")
def test_a_cancel_ends_a_suspension_under_way_before_its_deadline_and_closes_it_canceled(
        journal: JournalStore) -> None:
    """A provider step's unit waits on an awakeable; ``request_cancel`` marks it and the keeper's
    next poll feeds the token: the wait ends at once with RunCanceled, nothing is recorded as the
    step, and the unit closes canceled through the provider step's ordinary failure path."""
    clock = ManualClock(T0)
    keeper = Keeper(clock, start=False)
    orchestrator = EngineOrchestrator(journal, clock=clock, keeper=keeper)
    workflow = orchestrator.open("host:workflow", PLAN, holder="h1", lease_s=HOUR_S)
    units: list[str] = []

    def unit(execution: Any, w: Waiter) -> int:
        units.append(execution.execution_id)
        execution.step("prepare", lambda: b"draft")
        execution.suspend("approve", timeout_s=HOUR_S, on_token=w.on_token)
        return 1

    waiter = Waiter(lambda w: orchestrator.provider_step(workflow, "host:approvals", PLAN,
                                                         lambda execution: unit(execution, w), holder="h1",
                                                         lease_s=HOUR_S))
    assert waiter.began.wait(TIMEOUT_S) and waiter.token, waiter.outcome
    assert waiter.thread.is_alive()  # pending: the unit waits on the token

    request_cancel(journal, "host:approvals", clock=clock)
    clock.advance(CANCEL_POLL_S)
    keeper.tick()  # the keeper's poll reads the mark and sets the unit's cancellation token
    outcome = waiter.end(clock)

    assert isinstance(outcome.get("error"), RunCanceled), outcome
    assert clock.now_us() < DEADLINE  # it ended long before its deadline
    [execution_id] = units
    assert _recorded_labels(journal, execution_id) == ["prepare"]  # nothing recorded for the wait
    assert _awakeable_state(journal, waiter.token) == PENDING  # nor settled: the token is left as it is
    owner = journal.owner("host:approvals")
    assert owner is not None and (owner.execution_id, owner.status) == (execution_id, CLOSED_CANCELED)
    assert _recorded_labels(journal, workflow.execution_id) == []  # the workflow records nothing either


def test_a_cancel_the_keeper_has_not_fed_yet_is_never_recorded_as_a_timeout(journal: JournalStore) -> None:
    """The mark is written and the deadline passes before the keeper polls: the waiter reads the
    mark durably before it records an outcome, so it ends canceled, not AwakeableTimedOut."""
    clock = ManualClock(T0)
    keeper = Keeper(clock, start=False)
    ex = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=4 * HOUR_S, clock=clock, keeper=keeper)
    waiter = Waiter(lambda w: ex.suspend("approve", timeout_s=HOUR_S, on_token=w.on_token, poll_s=0.01))
    assert waiter.began.wait(TIMEOUT_S) and waiter.token, waiter.outcome

    request_cancel(journal, "host:approvals", clock=clock)
    clock.advance(HOUR_S)  # the deadline: nobody fed the token, the waiter's next look is past it
    outcome = waiter.end(clock)

    assert isinstance(outcome.get("error"), RunCanceled), outcome
    assert _recorded_labels(journal, ex.execution_id) == []  # no AwakeableTimedOut recorded
    assert _awakeable_state(journal, waiter.token) == PENDING  # the waiter did not settle it timed-out
    ex.close_canceled()
    owner = journal.owner("host:approvals")
    assert owner is not None and owner.status == CLOSED_CANCELED


def test_a_resumption_after_a_cancel_stops_at_the_suspension_without_waiting(journal: JournalStore) -> None:
    """An execution suspended, its process gone, then canceled: the next holder resumes it, replays
    to the suspension and is refused there at once (RunCanceled, on_token never called, no second
    token), so it settles canceled instead of waiting again."""
    clock = ManualClock(T0)
    first = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=60, clock=clock,
                           keeper=Keeper(clock, start=False))
    first.step("prepare", lambda: b"draft")
    with pytest.raises(ExecutionSuspended) as suspended:
        first.suspend("approve", timeout_s=HOUR_S, wait_s=0)
    execution_id = first.execution_id
    del first  # the process is gone: the owner stays pending
    request_cancel(journal, execution_id, clock=clock)
    clock.advance(60)  # its lease lapses

    second = open_execution(journal, "host:approvals", PLAN, holder="h2", lease_s=60, clock=clock,
                            keeper=Keeper(clock, start=False))
    assert (second.execution_id, second.resumed) == (execution_id, True)
    assert second.step("prepare", lambda: b"recomputed") == b"draft"
    told: list[str] = []
    with pytest.raises(RunCanceled):
        second.suspend("approve", timeout_s=HOUR_S, on_token=told.append, wait_s=0)
    assert told == [] and _recorded_labels(journal, execution_id) == ["prepare"]
    store = awakeable_store_beside(journal)
    try:
        assert [(r.token, r.state) for r in store.rows_of(execution_id)] == [(suspended.value.token, PENDING)]
    finally:
        store.close_store()
    owner = journal.owner("host:approvals")
    assert owner is not None and owner.status == OWNER_PENDING
    second.close_canceled()
    owner = journal.owner("host:approvals")
    assert owner is not None and owner.status == CLOSED_CANCELED
