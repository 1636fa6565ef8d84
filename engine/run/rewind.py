"""``contextful run rewind``: retire a pending owner so its scope's next run claims a fresh execution.

Implements ``run.own.rewind`` and ``run.own.rewind-unsafe`` (decision "superseded-owner-retires":
a superseded owner retires by operator verb or applied declaration, never at open). Rewinding
retires the owner holding the execution and leaves the scope's committed position alone: the
rows and cursor its commits landed stay, and the next run starts a new execution from that
position. An owner whose attempt still holds an unexpired lease (its holder is not provably dead),
or whose execution has an awakeable pending before its deadline (someone holds a token that would
resume it), refuses with :class:`ExecutionRewindUnsafe` naming it; nothing overrides that (the
spec's "--force overrides none").
"""

from __future__ import annotations

from dataclasses import dataclass

from contextful.storage.awakeables import AwakeableStore, awakeable_store_beside
from contextful.storage.clock import Clock, SystemClock, from_us
from contextful.storage.errors import ExecutionNotFound, ExecutionRewindUnsafe
from contextful.storage.holders import holder_is_dead
from contextful.storage.journal import PENDING, JournalStore, OwnerRow


@dataclass(frozen=True)
class Rewound:
    owner: OwnerRow
    reason: str


def rewind(journal: JournalStore, execution_id: str, reason: str, *, clock: Clock | None = None,
           awakeables: AwakeableStore | None = None) -> Rewound:
    """Retire the pending owner holding ``execution_id``. ``awakeables`` defaults to the awakeable
    store beside ``journal``."""
    if not reason.strip():
        raise ExecutionNotFound(execution_id, "a rewind needs a --reason")
    now = (clock or SystemClock()).now_us()
    owner = next((o for o in journal.owners() if o.execution_id == execution_id), None)
    if owner is None:
        raise ExecutionNotFound(execution_id)
    if owner.status != PENDING:
        raise ExecutionNotFound(execution_id, f"its owner on {owner.scope} is {owner.status}, not pending")
    ensure_rewind_safe(journal, owner, now, awakeables)
    # conditional on the row the check read: a claim or renewal since then refuses, never retires
    return Rewound(journal.retire(execution_id, now, expect=owner, holder_dead=holder_is_dead), reason)


def ensure_rewind_safe(journal: JournalStore, owner: OwnerRow, now_us: int,
                       awakeables: AwakeableStore | None = None) -> None:
    """Raise :class:`ExecutionRewindUnsafe` naming the execution if retiring ``owner`` at ``now_us``
    could leave an attempt running or a token able to resume it (the one check both the operator's
    rewind and an applied retirement make). ``awakeables`` defaults to the store beside ``journal``."""
    if owner.lease_expires_us > now_us and not holder_is_dead(owner.holder):
        raise ExecutionRewindUnsafe(owner.execution_id,
                                    f"attempt {owner.attempts} of {owner.holder} holds the owner lease on "
                                    f"{owner.scope} until {from_us(owner.lease_expires_us)}")
    store = awakeables or awakeable_store_beside(journal)
    try:
        pending = store.pending_for(owner.execution_id, now_us)
    finally:
        if awakeables is None:
            store.close_store()
    if pending:
        row = pending[0]
        raise ExecutionRewindUnsafe(owner.execution_id,
                                    f"awakeable {row.label!r} (step {row.seq}) is pending until "
                                    f"{from_us(row.deadline_us)}: its token would resume the execution")
