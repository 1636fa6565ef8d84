"""A coordinated group's identity and its events' identifiers (``run.export.group-identity``).

A group's identity binds its store incarnation (the store's uuid), destination, namespace, read
identity (what the sender read: each producer's completion run and its outputs' frontiers),
predecessor (the group acknowledged before it, None for the first), publication order (its
sequence in the publication), input frontier (each producer's pinned input frontier), membership
(the typed members, in publication order), delivered base (the predecessor's next state) and next
state (each member's frontier). Its identifier is the SHA-256 of that identity's canonical JSON, and
each event's identifier the SHA-256 of the group identifier and the event's sequence: the same
group staged again, by any process, names itself and its events the same.

    >>> identity = GroupIdentity("store-1", "http://127.0.0.1:9/groups", "bi", "r1", None, 1, {}, (), {}, {})
    >>> identity.group_id == GroupIdentity.from_json(identity.to_json()).group_id
    True
    >>> event_id(identity.group_id, 0) != event_id(identity.group_id, 1)
    True
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any


def digest(doc: Any) -> str:
    """The SHA-256 of ``doc``'s canonical JSON."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class GroupIdentity:
    """Everything a group binds (see the module docstring)."""

    incarnation: str
    destination: str
    namespace: str
    read_identity: str
    predecessor: str | None
    order: int
    input_frontier: dict[str, Any]
    membership: tuple[tuple[str, str, str], ...]
    """``(type, producer, name)`` per member, in publication order."""
    delivered_base: dict[str, int | None]
    """The predecessor's next state (empty for the first group)."""
    next_state: dict[str, int | None]
    """Each member's frontier: ``producer.name`` -> its commit (None: empty)."""

    @property
    def group_id(self) -> str:
        return digest(self.to_json())

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["membership"] = [list(m) for m in self.membership]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GroupIdentity:
        return cls(**{**doc, "membership": tuple(tuple(m) for m in doc["membership"])})


def event_id(group_id: str, sequence: int) -> str:
    """The identifier of the group's event at ``sequence``: it binds the group and the sequence."""
    return digest({"group": group_id, "sequence": sequence})
