"""``contextful pipeline status``: what the control plane has armed, read from the store alone.

For the applied version: each armed entry (a unit's head) with its schedule, its last fire (the
later of its last journaled run start and its last dispatch) and its next fire; the units in flight
(a member's ``pipeline:<id>`` execution pending); the pipelines that arm nothing, with their reasons
(``surface.arm.unarmed-named``); and who holds the deployment's cadence lease. It reads the
catalog and the journal, so it answers the same whichever process asks, serve running or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.storage.journal import PENDING

if TYPE_CHECKING:
    from contextful.storage import Store


@dataclass
class EntryStatus:
    id: str
    schedule: str
    members: tuple[str, ...]
    last_fire_us: int | None
    next_fire_us: int | None
    in_flight: bool


@dataclass
class ControlStatus:
    version: int | None
    entries: list[EntryStatus] = field(default_factory=list)
    unarmed: list[dict[str, str]] = field(default_factory=list)
    lease_holder: str | None = None
    lease_expires_us: int | None = None

    def to_json(self) -> dict[str, Any]:
        from contextful.engine.control.fire import rfc3339

        return {
            "version": self.version,
            "armed": [{"id": e.id, "schedule": e.schedule, "members": list(e.members),
                       "last_fire": rfc3339(e.last_fire_us), "next_fire": rfc3339(e.next_fire_us),
                       "in_flight": e.in_flight} for e in self.entries],
            "in_flight": [e.id for e in self.entries if e.in_flight],
            "unarmed": self.unarmed,
            "cadence_lease": None if self.lease_holder is None else {
                "holder": self.lease_holder, "expires": rfc3339(self.lease_expires_us)},
        }


def control_status(root: Path, store: Store | None) -> ControlStatus:
    """The control plane's status for the project at ``root`` over ``store`` (see the module docstring;
    None: no store exists yet, so nothing has run or been dispatched)."""
    from contextful.engine.control.apply import load_applied
    from contextful.engine.control.arm import ArmedSet
    from contextful.engine.control.fire import plan_entries
    from contextful.engine.control.history import histories

    applied = load_applied(root)
    if applied is None:
        return ControlStatus(None)
    deployment = applied.manifest.project.name
    units, entries, unarmed = plan_entries(applied.manifest)
    from contextful.engine.control.arm import History
    from contextful.storage.clock import SystemClock

    now = (store.clock if store is not None else SystemClock()).now_us()
    armed = ArmedSet(entries, now)
    found = (histories(store, deployment, [e.id for e in entries], now) if store is not None
             else {e.id: History() for e in entries})
    for head, history in found.items():
        armed.update(head, history)
    status = ControlStatus(applied.version, unarmed=[{"pipeline": u.id, "reason": u.reason} for u in unarmed])
    for entry in entries:
        members = units[entry.id].members
        owners = [store.journal.owner(f"pipeline:{m}") for m in members] if store is not None else []
        history = found[entry.id]
        refs = [t for t in (history.last_start_us, history.last_dispatch_us) if t is not None]
        status.entries.append(EntryStatus(entry.id, entry.schedule.text, members, max(refs) if refs else None,
                                          armed.next_fire(entry.id),
                                          any(o is not None and o.status == PENDING for o in owners)))
    holder = store.catalog.cadence_holder(deployment) if store is not None else None
    if holder is not None and holder.expires_us > now:
        status.lease_holder, status.lease_expires_us = holder.holder, holder.expires_us
    return status
