"""The sender's state: one ordered outbox of staged groups per publication, behind a small port.

Implements the persistence half of ``run.export.group-delivery`` and ``run.export.group-identity``
(decision "coordinated-exports-activate"): a group is staged whole — its identity and every event,
member-complete events first and the group-complete event last — in one transaction, before
anything is delivered; each event is acknowledged in order as the receiver accepts it, and the
group is acknowledged with its last event. Groups are kept in staging order (a rebuild starts
order 1 again in a fresh namespace, so the staging position is not the group's order). A staged
group's events never change: a resumed delivery
reoffers the same identifiers and payloads. The state machine (``engine.export.publications.sender``)
sees only :class:`GroupOutbox`; the local profile's adapter is ``engine.export.publications.sqlite``,
and D1's ("d1-coordinated-groups") is ``engine.export.publications.d1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from contextful.engine.export.publications.identity import GroupIdentity

if TYPE_CHECKING:
    from contextful.storage.store import Store

MEMBER_COMPLETE = "member-complete"
GROUP_COMPLETE = "group-complete"


@dataclass(frozen=True)
class GroupEvent:
    """One staged event."""

    event_id: str
    sequence: int
    kind: str
    """``member-complete`` or ``group-complete``."""
    payload: str
    """The event's JSON body, exactly as staged (and as every delivery sends it)."""


@dataclass(frozen=True)
class StagedGroup:
    """A group in the sender's outbox and how far its delivery went."""

    publication: str
    identity: GroupIdentity
    events: tuple[GroupEvent, ...]
    acknowledged: int
    """How many of ``events`` (a prefix, in order) the receiver acknowledged."""

    @property
    def group_id(self) -> str:
        return self.identity.group_id

    @property
    def complete(self) -> bool:
        return self.acknowledged == len(self.events)


class GroupOutbox(Protocol):
    """Where a publication's staged groups persist."""

    def pending(self, publication: str) -> StagedGroup | None:
        """The staged group not yet wholly acknowledged (at most one)."""

    def last_acknowledged(self, publication: str) -> StagedGroup | None:
        """The newest wholly acknowledged group (the next group's predecessor)."""

    def stage(self, publication: str, identity: GroupIdentity, events: tuple[GroupEvent, ...]) -> StagedGroup:
        """Stage a group whole; the same group staged again keeps what was staged."""

    def acknowledge(self, publication: str, group_id: str, sequence: int) -> None:
        """Record the receiver's acknowledgement of the group's event at ``sequence`` (the next in order)."""

    def groups(self, publication: str) -> tuple[StagedGroup, ...]:
        """Every group staged for the publication, in staging order (``run.export.group-checkpoint``)."""

    def restore(self, publication: str, group: StagedGroup) -> StagedGroup:
        """Load ``group`` (staged elsewhere: a checkpoint's, its events unchanged) at the next staging
        position; a group the outbox holds already keeps its events, and its acknowledged count becomes
        the larger of the two. The caller has checked the group binds its events and this store."""


def open_outbox(store: Store) -> GroupOutbox | None:
    """The store's group outbox, by its catalog's profile (None: the profile keeps none)."""
    from contextful.storage.catalog.sqlite import SqliteCatalog

    if isinstance(store.catalog, SqliteCatalog) and store.container is None:
        from contextful.engine.export.publications.sqlite import SqliteGroupOutbox

        return SqliteGroupOutbox(store.catalog.path)
    from contextful.storage.d1.catalog import D1Catalog

    if isinstance(store.catalog, D1Catalog):
        from contextful.engine.export.publications.d1 import D1GroupOutbox

        return D1GroupOutbox(store.catalog.client, store.clock)
    return None
