"""A fire meeting the durable callback guard an earlier fire's call left on its owner row (D1 profile).

Implements the production side of ``run.callback-guard.replay`` and the refusal of
``run.callback-guard.class`` (decision "d1-execution-state"). A fire killed while its delegate held
a call leaves that call's guard committed (``run.journal.d1-guard``): the next fire's claim of the
job's owner row refuses with CallbackGuardHeld. :func:`open_past_guard` then decides, without an
operator, by the guard's own record:

* its holder is gone, its owner lease has lapsed and the destination's deduplication window still
  covers its idempotency key (evidence class replay-safe): the guard's release and the takeover of
  the owner row commit in one D1 batch (:meth:`~contextful.storage.d1.guards.CallbackGuards.replay`),
  and the fire resumes the same execution, whose call sends that same key again
  (``engine.control.delegate.idempotency_key`` of the execution and item);
* otherwise the fire refuses with CallbackGuardHeld naming the guard, its evidence class
  (``unknown`` for a call whose delegate declares no window, or whose window has passed) and why,
  until its holder returns or an operator runs ``contextful storage reconcile-guard``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from contextful.engine.run.execution import Execution, open_execution
from contextful.storage.errors import CallbackGuardHeld
from contextful.storage.holders import default_holder, holder_is_dead

if TYPE_CHECKING:
    from contextful.storage import Store

LEASE_S = 60.0
"""The lease a fire's execution is opened under (``engine.run.execution.open_execution``'s)."""


def open_past_guard(store: Store, scope: str, plan_ref: str, pins: Mapping[str, str] | None) -> Execution:
    """Open or resume the execution under ``scope`` as a fire does (a dead holder's lease taken over
    at once), replaying the callback guard that protects its owner row when the guard's record allows
    it (module docstring); CallbackGuardHeld naming the guard's evidence class otherwise."""
    journal = store.journal

    def opened(holder: str | None = None) -> Execution:
        return open_execution(journal, scope, plan_ref, holder=holder, pins=pins, clock=store.clock,
                              lease_s=LEASE_S, take_over_dead=True)

    try:
        return opened()
    except CallbackGuardHeld as held:
        from contextful.storage.d1.guards import CallbackGuards

        guards = getattr(journal, "guards", None)
        if not isinstance(guards, CallbackGuards):
            raise
        found = guards.guard(held.token)
        if found is None:  # released since the claim read it: claim again
            return opened()
        now_us = store.clock.now_us()
        evidence = found.evidence_class(now_us)
        why = (f"evidence class {evidence}; call {found.journal_entry} sent idempotency key "
               f"{found.idempotency_key}; release it with `contextful storage reconcile-guard {found.token} "
               f"--evidence ... --operator ...` once its effect is known")
        if found.owner_scope != scope:  # an ancestor's or fence's guard: only its own execution replays it
            raise CallbackGuardHeld(held.scope, found.token, f"{why} (it guards {found.owner_scope})") from None
        holder = default_holder()
        try:
            guards.replay(found.token, holder, now_us, int(LEASE_S * 1_000_000), holder_gone=holder_is_dead)
        except CallbackGuardHeld as refused:
            raise CallbackGuardHeld(refused.scope, found.token, f"{refused.why}: {why}") from None
        return opened(holder)  # the row replay took over for ``holder``: the same execution, resumed
