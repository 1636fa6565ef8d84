"""``open_execution(..., take_over_dead=True)`` takes a lease over at once only from a holder that
is provably dead, on every journal adapter.

A holder of another PID namespace on this hostname (a container beside this one, sharing the
journal) whose pid does not exist here may be running: its lease is waited out, and the open
resumes the execution once the lease lapses. A holder of this namespace whose pid is gone is taken
over at once.
"""

from __future__ import annotations

import dataclasses

import pytest
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.storage.clock import ManualClock
from contextful.storage.errors import ExecutionHeld, JournalConflict
from contextful.storage.journal import PENDING, JournalStore

from tests.support.holders import gone_pid, here

T0 = 1_700_000_000_000_000
LEASE_S = 600.0
PLAN = plan_reference({"pipeline": "orders", "source": {"kind": "files"}})
SCOPE = "host:nightly"


def _held_by(journal: JournalStore, holder: str, clock: ManualClock) -> str:
    """An execution opened under ``holder`` and dropped unclosed, as its process left it."""
    held = open_execution(journal, SCOPE, PLAN, holder=holder, lease_s=LEASE_S, clock=clock)
    return held.execution_id


@pytest.mark.clause("run.own.unclosed-execution")
@pytest.mark.parametrize("elsewhere", [{"pid_ns": 1}, {"boot_id": "00000000-0000-0000-0000-000000000000"}],
                         ids=["another PID namespace", "another boot"])
def test_a_lease_of_a_holder_of_another_namespace_is_waited_out(journal: JournalStore,
                                                                elsewhere: dict[str, object]) -> None:
    clock = ManualClock(T0)
    holder = dataclasses.replace(here(), pid=gone_pid(), **elsewhere)  # type: ignore[arg-type]
    other = str(holder)
    execution = _held_by(journal, other, clock)
    clock.advance(LEASE_S - 0.001)
    with pytest.raises(JournalConflict) as info:
        open_execution(journal, SCOPE, PLAN, lease_s=LEASE_S, clock=clock, take_over_dead=True)
    assert info.value.execution == execution
    assert isinstance(info.value, ExecutionHeld)  # naming the holder, its process and host, and the expiry
    assert (info.value.holder, info.value.until_us) == (other, T0 + int(LEASE_S * 1_000_000))
    assert (info.value.host, info.value.pid) == (holder.host, holder.pid)
    owner = journal.owner(SCOPE)
    assert owner is not None and (owner.holder, owner.status, owner.attempts) == (other, PENDING, 1)

    clock.advance(0.001)  # the lease lapses: the open resumes the execution
    resumed = open_execution(journal, SCOPE, PLAN, lease_s=LEASE_S, clock=clock, take_over_dead=True)
    assert (resumed.execution_id, resumed.resumed, resumed.attempt) == (execution, True, 2)
    resumed.close(ok=True)


def test_a_lease_of_a_holder_of_this_namespace_whose_pid_is_gone_is_taken_over_at_once(journal: JournalStore) -> None:
    clock = ManualClock(T0)
    execution = _held_by(journal, str(dataclasses.replace(here(), pid=gone_pid())), clock)
    with pytest.raises(JournalConflict):  # without take_over_dead the lease is waited out
        open_execution(journal, SCOPE, PLAN, lease_s=LEASE_S, clock=clock)
    resumed = open_execution(journal, SCOPE, PLAN, lease_s=LEASE_S, clock=clock, take_over_dead=True)
    assert (resumed.execution_id, resumed.resumed, resumed.attempt) == (execution, True, 2)
    resumed.close(ok=True)
