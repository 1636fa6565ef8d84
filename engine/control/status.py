"""``contextful pipeline status``: what the control plane has armed, read from the store alone.

For the applied version: each armed entry (a unit's head, a job, an active connection's
``connection:<id>``) with its schedule, its last fire (the
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
    from contextful.engine.control.apply import snapshot_dir
    from contextful.engine.control.arming import load_armable
    from contextful.engine.control.fire import arm_version
    from contextful.engine.control.history import entry_scope, pulled_starts
    from contextful.storage.clock import SystemClock

    snapshots = snapshot_dir(root)
    version = snapshots.applied()
    if version is None:
        return ControlStatus(None)
    manifest, refused = load_armable(root, version, snapshots)
    deployment = snapshots.project  # as serve names its deployment
    now = (store.clock if store is not None else SystemClock()).now_us()
    pulled = pulled_starts(snapshots.path, deployment)
    units, armed, unarmed = arm_version(manifest, store, deployment, now, pulled)
    unarmed += refused
    status = ControlStatus(version, unarmed=[{"pipeline": u.id, "reason": u.reason} for u in unarmed])
    for head in armed.ids():
        members = units[head].members if head in units else (head,)  # a connection's entry runs alone
        owners = [store.journal.owner(entry_scope(m)) for m in members] if store is not None else []
        history = armed.history(head)
        status.entries.append(EntryStatus(head, armed.schedule(head).text, members,
                                          history.reference_us if history is not None else None,
                                          armed.next_fire(head),
                                          any(o is not None and o.status == PENDING for o in owners)))
    holder = store.catalog.cadence_holder(deployment) if store is not None else None
    if holder is not None and holder.expires_us > now:
        status.lease_holder, status.lease_expires_us = holder.holder, holder.expires_us
    return status
