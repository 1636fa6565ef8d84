"""Admission: the current-owner check an execution passes immediately before an effect or a
publication, and the hold it keeps on its owner through the admitted callback.

Implements ``run.journal.current-owner`` and ``run.journal.durable-dispatch`` (decision
"run-substrate-storage") and ``run.export.writer-fenced`` (decision "disposable-execution-state").
:meth:`Execution.admit <contextful.engine.run.execution.Execution.admit>` opens the block; here
:func:`admit` reads the durable owner row through the journal port's ``hold_owner`` and refuses
with :class:`ExecutionWriterFenced` unless the row is still this execution's, pending, under the
plan and pins the execution was admitted with, leased (unexpired) to this holder, at this attempt.
A superseded attempt therefore enters neither boundary: the callback never runs. The scopes of an
item's ancestors and its entity fences (owner rows keyed like any scope) are read and held with
it, and each must be pending under an unexpired lease.

What the hold guarantees depends on the adapter:

* **PostgreSQL** holds the owner row — which carries the lease — and the fences' rows ``FOR SHARE``
  on a connection of its own through the block. Takeover, retirement and replacement write the row ``FOR UPDATE``, so
  they serialize after the admitted callback returns; two admitted callbacks of one owner share it.
* **SQLite** holds the database's write lock through the block: every owner write waits (strict,
  and coarser: other scopes' owner writes, and every other write to that file — the catalog's
  commits when the journal shares its file — wait too). So the block itself must not write that
  database: journal the callback's value, or commit the publication it admitted, after the block.
* **The file tree** checks, then acts: nothing is held during the callback. A takeover meanwhile is
  learned at the superseded holder's next owner write, which fails conditionally.
* **D1** commits a durable callback guard over the rows (``storage.d1.guards``): their transfer
  refuses with CallbackGuardHeld until the callback returns, even after a crash of its holder.

The owner's own renewals wait behind the hold too (PostgreSQL, SQLite): renew before the block,
never inside it, and keep a callback shorter than the lease and the server's idle-in-transaction
bound. A stop (cancel) arriving while a callback is admitted does not cut it: the callback returns,
and the stop takes effect at the next boundary, as landing's path does.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from contextful.storage.clock import from_us
from contextful.storage.errors import ExecutionWriterFenced
from contextful.storage.fence import DISPATCH, PUBLICATION
from contextful.storage.journal import PENDING, CallbackIdentity, HeldOwners, OwnerRow

if TYPE_CHECKING:
    from contextful.engine.run.execution import Execution
    from contextful.storage.outbox import OutboxEvent, OutboxStore

BOUNDARIES = (DISPATCH, PUBLICATION)


def fenced_reason(held: HeldOwners, execution: Execution, fences: Sequence[str], now_us: int,
                  until_us: int | None = None) -> str | None:
    """Why ``execution`` is not its scope's current writer at ``now_us``, or a scope of ``fences``
    has no pending owner with an unexpired lease (None: admitted). ``until_us``: the lease must run
    past it too (an admitted callback's deadline)."""
    row = held.own
    if execution.closed:
        return "the execution is closed"
    if row is None or row.execution_id != execution.execution_id:
        return f"no owner of scope {execution.scope} holds this execution any more"
    if row.status != PENDING:
        return f"its owner on {row.scope} is {row.status}"
    if row.plan_ref != execution.plan_ref:
        return f"its owner is pinned to plan {row.plan_ref[:12]}, this attempt to {execution.plan_ref[:12]}"
    if row.pins != execution.pins:
        return f"its owner pins {row.pins}, this attempt was admitted under {execution.pins}"
    if row.holder != execution.holder or row.attempts != execution.attempt:
        return (f"the owner lease transferred: attempt {row.attempts} of {row.holder} holds it, not attempt "
                f"{execution.attempt} of {execution.holder}")
    if row.lease_expires_us <= now_us:
        return f"its owner lease lapsed at {from_us(row.lease_expires_us).isoformat()}"
    if until_us is not None and row.lease_expires_us <= until_us:
        return (f"its owner lease runs until {from_us(row.lease_expires_us).isoformat()}, not past the callback's "
                f"deadline {from_us(until_us).isoformat()}")
    for scope in fences:
        fence = held.others.get(scope)
        if fence is None or fence.status != PENDING:
            return f"its ancestor or fence {scope} has no pending owner"
        if fence.lease_expires_us <= now_us:
            return f"the lease of its ancestor or fence {scope} lapsed at {from_us(fence.lease_expires_us).isoformat()}"
    return None


_holds: Counter[str] = Counter()
_holds_lock = threading.Lock()


def holds_at(location: str) -> int:
    """Admitted blocks of this process holding owners of the journal at ``location`` now, through
    any of its handles (the keeper defers renewals a hold there would block: SQLite)."""
    with _holds_lock:
        return _holds[location]


@contextmanager
def _counted_hold(execution: Execution) -> Iterator[None]:
    location = execution.journal.location
    with _holds_lock:
        _holds[location] += 1
    execution.admissions += 1  # the keeper defers renewing it: a renewal would wait behind the hold
    try:
        yield
    finally:
        execution.admissions -= 1
        with _holds_lock:
            _holds[location] -= 1
            if not _holds[location]:
                del _holds[location]


@contextmanager
def admit(execution: Execution, boundary: str = DISPATCH, fences: Sequence[str] = (), *,
          deadline_s: float | None = None, callback: CallbackIdentity | None = None) -> Iterator[OwnerRow]:
    """Hold ``execution``'s owner row, and the owner rows of ``fences`` (the scopes of an item's
    ancestors and its entity fences), through the block if it is the current writer and every
    fence is pending under an unexpired lease; otherwise raise :class:`ExecutionWriterFenced`
    naming the boundary and why, before the block runs.

    ``deadline_s`` bounds the admitted callback: the lease is renewed first (outside the hold,
    where a renewal cannot wait behind it) to run past the deadline with half a lease to spare,
    and the hold admits only a lease that outlives it. ``callback`` is what the admitted callback
    is (its journal entry, the idempotency key it sends, its destination's deduplication window):
    D1's durable guard records it (``run.callback-guard.identity``)."""
    with admitted(execution, boundary, fences, deadline_s=deadline_s, callback=callback) as held:
        assert held.own is not None
        yield held.own


@contextmanager
def admitted(execution: Execution, boundary: str = DISPATCH, fences: Sequence[str] = (), *,
             deadline_s: float | None = None, callback: CallbackIdentity | None = None) -> Iterator[HeldOwners]:
    """:func:`admit`, yielding what the hold read and holds: ``HeldOwners.record`` records a step
    inside the hold (:meth:`Execution.dispatch`)."""
    if boundary not in BOUNDARIES:
        raise ValueError(f"admission boundary {boundary!r} is not one of {BOUNDARIES}")
    execution.raise_if_fenced(boundary)
    deadline_us = None if deadline_s is None else int(deadline_s * 1_000_000)
    if deadline_us is not None:
        execution.renew(min_lease_us=deadline_us + execution.lease_us // 2)
    with _counted_hold(execution), execution.journal.hold_owners(
            execution.execution_id, fences, execution.fence, callback) as held:
        now = execution.clock.now_us()
        reason = fenced_reason(held, execution, fences, now, None if deadline_us is None else now + deadline_us)
        if reason is not None or held.own is None:
            raise ExecutionWriterFenced(execution.execution_id, execution.attempt, boundary, reason or "")
        yield held


def drain_admitted(execution: Execution, outbox: OutboxStore, stream: str,
                   send: Callable[[OutboxEvent], Mapping[str, bytes]]) -> list[OutboxEvent]:
    """Drain ``stream`` of ``outbox`` as ``execution``'s writer: each delivery admitted to effect
    dispatch and each acknowledgement to state publication, so a writer whose lease transferred is
    fenced before it sends or publishes anything (``run.export.writer-fenced``)."""
    return outbox.drain(stream, send, dispatch=lambda: admit(execution, DISPATCH),
                        publish=lambda: admit(execution, PUBLICATION), fence=execution.fence)
