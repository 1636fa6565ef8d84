"""``contextful run cancel RUN``: mark a run in flight so it stops at its next boundary.

Implements ``run.cancel.not-in-flight`` (decision "external-signals-single": an external signal
is a single-valued catalog write). What ``RUN`` names: the id of a pending execution (the
``execution`` column of ``contextful run executions``, the ``execution`` field of ``contextful
pipeline run --json``), or the scope it runs under (``pipeline:<id>``). A run in flight is one
whose owner is pending, its only non-terminal status; the mark is written on that owner row
(:meth:`JournalStore.request_cancel`). A second mark keeps the first one's instant, so canceling
twice is canceling once. A target matching no pending owner — unknown, or already settled
(``closed-ok``, ``closed-failed``, ``closed-canceled``, ``retired``) — raises
:class:`CancelTargetNotInFlight` (conflict: HTTP 409, exit 5).

The run itself observes the mark through its cancellation token (the engine keeper,
``engine.run.keeper``, feeds it) and at its commit boundary, and gives up through the ordinary
failure path (``run.cancel.abandoned-work``, ``engine.land.journal``). A pending owner whose
process died keeps the mark: the next run under its scope resumes the execution, sees the mark at
once and settles it ``closed-canceled``; the run after that starts a fresh execution.
"""

from __future__ import annotations

from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import CancelTargetNotInFlight
from contextful.storage.journal import PENDING, JournalStore, OwnerRow


def request_cancel(journal: JournalStore, target: str, *, clock: Clock | None = None) -> OwnerRow:
    """Mark the pending execution ``target`` names (its id, or its scope) canceled; the owner row."""
    now = (clock or SystemClock()).now_us()
    by_scope = journal.owner(target)
    if by_scope is None:
        return journal.request_cancel(target, now)
    if by_scope.status != PENDING:  # named by its scope: say so (the verb below checks it atomically)
        raise CancelTargetNotInFlight(target, f"its last execution {by_scope.execution_id} is {by_scope.status}")
    return journal.request_cancel(by_scope.execution_id, now)
