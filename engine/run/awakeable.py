"""Suspending an execution on an awakeable: what :meth:`Execution.suspend` does.

Implements the execution side of ``run.suspend.awakeable`` (decision
"awakeable-resumes-credentialed": the engine mints an opaque single-use token and persists a
pending row through the awakeable store; an external party resumes by posting the token back), of
``run.suspend.expired-token`` (decision "external-signals-single": a signal's value is fixed once
observed, so replay reads what the first resumption saw; deadlines evaluate lazily) and of the
cancel mark for a waiting execution (``run.cancel.*``, ``engine.run.cancel``).

A suspension is one journal step. In order:

1. **Replay.** The step is recorded: return its payload (or raise the AwakeableTimedOut it
   recorded) without minting or reading the awakeable store.
2. **Mint.** An execution already canceled stops here (RunCanceled: no token is handed out for a
   run that will not read it). Otherwise :meth:`AwakeableStore.mint` for ``(execution_id, seq)``:
   the first attempt creates a pending row with a fresh token, every later attempt (a resumption
   after a crash) gets that same row back. ``on_token`` is called with the token while the row is
   pending.
3. **Wait.** Look at the cancellation token and the row; while the token is clear and the row is
   pending with its deadline ahead, wait. A resolution made in this process, and the keeper (or
   anyone) setting this execution's cancellation token, wake the waiter at once; a resolution made
   by another process is seen at the next look, every ``poll_s`` seconds. While it waits the
   execution renews its owner lease, so no other holder takes the execution over. With ``wait_s``
   the caller bounds the wait: when it runs out with the row still pending,
   :class:`ExecutionSuspended` carries the token and the execution stays pending (nothing is
   recorded) for whoever opens it next.
4. **Cancel.** Once the token is set the wait ends with RunCanceled, and nothing is recorded as the
   step: the run gives up through the ordinary failure path (its caller closes it canceled). The
   awakeable is left as it is — pending until someone resolves it or its deadline is looked past —
   since no replay of a canceled execution reaches the step: a resumption sees the mark when it
   opens and stops at the mint above.
5. **Record.** Before recording an outcome the waiter reads the cancel mark durably (the keeper
   feeds the token only every poll), so a cancel that came first is never recorded as a timeout or a
   payload. Resolved: the payload is recorded. Past the deadline while pending: the waiter settles
   the row timed-out (:meth:`AwakeableStore.expire`, a conditional write that a resolution landing
   first defeats, and then the payload is recorded instead), records the timeout and raises
   AwakeableTimedOut; a resumption raises it again. The row's one outcome is what the resolver was
   told and what the step records; the journal write is conditional too, so a racing attempt that
   recorded first wins and both return its value.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from contextful.storage.awakeables import (
    PENDING,
    RESOLUTIONS,
    RESOLVED,
    AwakeableRow,
    AwakeableStore,
    resolutions_seen,
)
from contextful.storage.errors import AwakeableTimedOut, ExecutionSuspended, JournalConflict

if TYPE_CHECKING:
    from contextful.engine.run.execution import Execution

POLL_S = 0.25
"""How often a waiter looks for a resolution another process made (one made in this process wakes
it at once)."""

# A suspension's recorded step value starts with one tag byte: resolved (the payload follows) or
# timed out (the token and deadline follow, as JSON).
_TAG_RESOLVED = b"r"
_TAG_TIMED_OUT = b"t"


def _encode_timed_out(row: AwakeableRow) -> bytes:
    return _TAG_TIMED_OUT + json.dumps({"token": row.token, "deadline_us": row.deadline_us}).encode()


def decode_suspension(execution_id: str, seq: int, label: str, stored: bytes) -> bytes:
    """The payload a recorded suspension holds, or the AwakeableTimedOut it recorded."""
    tag, body = stored[:1], stored[1:]
    if tag == _TAG_RESOLVED:
        return body
    if tag == _TAG_TIMED_OUT:
        timed_out = json.loads(body)
        raise AwakeableTimedOut(timed_out["token"], execution_id, label, int(timed_out["deadline_us"]))
    raise JournalConflict(execution_id, seq, f"step {seq} ({label!r}) was recorded by a step, not a suspension")


def await_resolution(execution: Execution, awakeables: AwakeableStore, seq: int, label: str, timeout_s: float, *,
                     on_token: Callable[[str], None] | None = None, wait_s: float | None = None,
                     poll_s: float = POLL_S) -> bytes:
    """Mint the awakeable of step ``seq``, wait for it and record its outcome; return the recorded
    step value (:func:`decode_suspension` reads it). Raises ExecutionSuspended, recording nothing,
    when ``wait_s`` runs out first, and RunCanceled, recording nothing, once the execution is
    canceled. Replaying a recorded step is the caller's, :meth:`Execution.suspend`."""
    clock = execution.clock
    execution.raise_if_canceled(durable=True)  # a fenced attempt stops here too
    now = clock.now_us()
    row = awakeables.mint(execution.execution_id, seq, label, now + int(timeout_s * 1_000_000), now)
    give_up_at = None if wait_s is None else time.monotonic() + wait_s
    told = False
    while True:
        seen = resolutions_seen()
        execution.raise_if_canceled()
        current = awakeables.get(row.token)
        assert current is not None, "a minted awakeable is never removed"
        now = clock.now_us()
        if current.state != PENDING or current.timed_out(now):
            execution.raise_if_canceled(durable=True)  # a cancel the keeper has not fed yet comes first
            if current.state == PENDING:
                current = awakeables.expire(current.token, now)
            return execution.record_at(seq, label, _outcome(current))  # only while this attempt owns it
        if on_token is not None and not told:
            on_token(current.token)
            told = True
        remaining = None if give_up_at is None else give_up_at - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise ExecutionSuspended(execution.execution_id, current.token, label, current.deadline_us)
        if now >= execution.lease_expires_us - execution.lease_us // 2:
            execution.renew()
        _wait_for_resolution(seen, poll_s if remaining is None else min(poll_s, remaining))


def _outcome(row: AwakeableRow) -> bytes:
    """The step value recording a settled row's outcome."""
    if row.state == RESOLVED:
        assert row.payload is not None
        return _TAG_RESOLVED + row.payload
    return _encode_timed_out(row)


def _wait_for_resolution(seen: int, timeout_s: float) -> None:
    """Wait until this process settles an awakeable or sets a cancellation token (any: the caller
    looks again) or ``timeout_s`` passes."""
    with RESOLUTIONS:  # a reentrant lock: the predicate's count read takes it again
        RESOLUTIONS.wait_for(lambda: resolutions_seen() != seen, timeout=timeout_s)
