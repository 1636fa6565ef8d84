"""``contextful export checkpoint|restore``: a publication's delivery state as one file, and its replay.

Implements ``run.export.group-checkpoint`` and the checkpoint case of ``run.export.group-incompatible``
(decision "coordinated-exports-activate"; docs/exports.md "Coordinated publications"):

- :func:`save_checkpoint` writes the publication's delivery state — the store incarnation and every
  staged group in staging order, each with its identity, its immutable events (their staged bytes)
  and how many the receiver acknowledged — as one JSON file, written whole (a temporary file
  renamed over it).
- :func:`restore_checkpoint` checks the WHOLE checkpoint before it loads or delivers anything: its
  publication and store incarnation are this one's, every group is staged for the publication's
  members and destination from producer completions this store holds
  (:func:`~.sender.check_group`), every event's identifier binds its group and sequence and its bytes
  carry that group's identity, and a group the sender holds already holds the same bytes at the same
  staging position. Anything else is ``PublicationIncompatible``. It then loads the groups into the
  sender's outbox (:meth:`~.outbox.GroupOutbox.restore`: a group held already keeps its events, its
  acknowledgement only advances) and replays every event of the checkpoint to the receiver in order.
  The receiver acknowledges an event it holds without changing a byte, and keeps its accepted
  groups and its active frontier, so an older checkpoint reverses no deletion or later publication;
  the sender's outbox keeps its later groups, so the next ``export group`` follows them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.export.publications.identity import GroupIdentity, event_id
from contextful.engine.export.publications.outbox import (
    GROUP_COMPLETE,
    MEMBER_COMPLETE,
    GroupEvent,
    StagedGroup,
)
from contextful.engine.export.publications.sender import (
    Post,
    check_group,
    check_storage,
    deliver,
    http_post,
    member_payload,
    publication,
)
from contextful.storage.errors import PublicationIncompatible

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.store import Store

FORMAT = "contextful-publication-checkpoint/1"


@dataclass(frozen=True)
class Checkpointed:
    """What ``export checkpoint`` saved or ``export restore`` replayed."""

    publication: str
    path: str
    groups: int
    """Groups in the checkpoint."""
    events: int
    """Events saved (checkpoint) or replayed to the receiver (restore)."""

    def to_json(self) -> dict[str, Any]:
        return {"publication": self.publication, "path": self.path, "groups": self.groups, "events": self.events}


def save_checkpoint(store: Store, manifest: Manifest, name: str, path: Path) -> Checkpointed:
    """Write publication ``name``'s delivery state to ``path`` (see the module docstring)."""
    publication(manifest, name)
    groups = check_storage(store, name).groups(name)
    doc = {"format": FORMAT, "publication": name, "incarnation": store.uuid,
           "groups": [{"identity": g.identity.to_json(), "acknowledged": g.acknowledged,
                       "events": [{"event_id": e.event_id, "sequence": e.sequence, "kind": e.kind, "payload": e.payload}
                                  for e in g.events]} for g in groups]}
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(json.dumps(doc, sort_keys=True, indent=1))
    os.replace(temporary, path)
    return Checkpointed(name, str(path), len(groups), sum(len(g.events) for g in groups))


def restore_checkpoint(store: Store, manifest: Manifest, name: str, path: Path, *,
                       post: Post | None = None) -> Checkpointed:
    """Check, load and replay the checkpoint at ``path`` (see the module docstring)."""
    spec = publication(manifest, name)
    outbox = check_storage(store, name)
    groups = _read(name, path, store.uuid)
    held = outbox.groups(name)
    for position, group in enumerate(groups):
        what = f"checkpoint group {position + 1} ({group.group_id[:12]})"
        check_group(store, spec, group, what)
        if position < len(held) and held[position].group_id != group.group_id:
            raise PublicationIncompatible(name, f"incompatible checkpoint: {what} is not the sender's group "
                                          f"{position + 1} ({held[position].group_id[:12]}): their histories diverge")
        if position < len(held) and held[position].events != group.events:
            raise PublicationIncompatible(name, f"incompatible checkpoint: {what}'s events differ from the ones "
                                          "the sender staged")
        if position >= len(held):
            _check_members(store, name, group, what)
    replayed = 0
    for group in groups:  # bounded by the checkpoint's groups; each replayed whole, in order
        replayed += deliver(manifest, spec, outbox, outbox.restore(name, group), post or http_post, start=0)
    return Checkpointed(name, str(path), len(groups), replayed)


def _read(name: str, path: Path, incarnation: str) -> list[StagedGroup]:
    """The checkpoint's groups, each checked to bind its events; ``PublicationIncompatible`` otherwise."""
    def refuse(why: str) -> PublicationIncompatible:
        return PublicationIncompatible(name, f"incompatible checkpoint {path}: {why}")

    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise refuse(f"not a {FORMAT} file")
        raw = [(GroupIdentity.from_json(g["identity"]), int(g["acknowledged"]),
                tuple(GroupEvent(str(e["event_id"]), int(e["sequence"]), str(e["kind"]), str(e["payload"]))
                      for e in g["events"])) for g in doc["groups"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise refuse(f"unreadable ({type(exc).__name__}: {exc})") from exc
    if doc["publication"] != name:
        raise refuse(f"it is publication {doc['publication']!r}'s")
    if doc["incarnation"] != incarnation:
        raise refuse(f"incarnation mismatch: it was saved from store {doc['incarnation']}, this is store {incarnation}")
    groups = []
    for identity, acknowledged, events in raw:
        group_id = identity.group_id
        kinds = [MEMBER_COMPLETE] * (len(events) - 1) + [GROUP_COMPLETE]
        for n, event in enumerate(events):
            body = _body(event.payload)
            if (event.sequence, event.kind, event.event_id) != (n, kinds[n], event_id(group_id, n)) or \
                    (body.get("event_id"), body.get("group_id"), body.get("sequence"), body.get("kind"),
                     body.get("identity")) != (event.event_id, group_id, n, event.kind, identity.to_json()):
                raise refuse(f"event {n} of group {group_id[:12]} does not bind its group and sequence (its "
                             "identifiers or identity were changed)")
        if len(events) != len(identity.membership) + 1 or not 0 <= acknowledged <= len(events):
            raise refuse(f"group {group_id[:12]} holds {len(events)} events for {len(identity.membership)} members, "
                         f"{acknowledged} acknowledged")
        groups.append(StagedGroup(name, identity, events, acknowledged))
    return groups


def _check_members(store: Store, name: str, group: StagedGroup, what: str) -> None:
    """Each member event of a group the sender does not hold carries what the store holds at that
    member's frontier, read again now (a post-commit read)."""
    for event in group.events[:-1]:  # one per member
        staged = _body(event.payload)["payload"]
        _type, producer, table = group.identity.membership[event.sequence]
        again = member_payload(store, name, _type, producer, table,
                               group.identity.next_state[f"{producer}.{table}"], staged.get("run_id", ""))
        if staged != again:
            raise PublicationIncompatible(name, f"incompatible checkpoint: {what}'s member {producer}.{table} is not "
                                          "what the store holds at its frontier (the event was changed)")


def _body(payload: str) -> dict[str, Any]:
    try:
        found = json.loads(payload)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
