"""``contextful export group <name>``: the sender's state machine for one coordinated publication.

Implements ``run.export.group-delivery``, ``run.export.group-identity`` and the sender's half of
``run.export.group-incompatible`` and ``run.export.group-storage`` (decision
"coordinated-exports-activate"; docs/exports.md "Coordinated publications"). One call:

1. refuses under a storage profile that keeps no coordinated-group outbox
   (``PublicationStorageUnsupported``, before anything is read, staged or delivered);
2. resumes the publication's pending group when there is one: its membership, store incarnation,
   destination and read identity must still be the ones it was staged under (:func:`check_group`,
   which a checkpoint's groups pass too; ``PublicationIncompatible`` otherwise, before delivery), and
   it is reoffered with its staged identifiers and payloads;
3. otherwise reads every producer's newest completion (``engine.export.publications``): a producer
   with none is an incomplete producer frontier, and outputs other than the declared members are
   membership drift (``PublicationIncompatible``); then reads every member at its completed frontier
   through the store (a post-commit read: the committed snapshot, never the head), rechecking that
   each frontier is still readable; when that frontier is the last acknowledged group's, nothing is
   staged; else it stages ONE group — in the namespace of the last staged group (the publication's
   name before any; a rebuild's fresh namespace, order 1 and no predecessor, with ``rebuild``:
   ``engine.export.publications.rebuild``) — its identity (``engine.export.publications.identity``), a
   member-complete event per member in publication order, then one group-complete event — in one
   transaction (``engine.export.publications.outbox``);
4. delivers the pending events in order to the destination (an HTTP POST of each event's staged
   JSON, the publication's headers resolved), recording each acknowledgement as it comes; a
   receiver's refusal (409) is ``PublicationIncompatible``; an unreachable receiver leaves the rest
   pending for the next call (``SourceUnavailable`` naming the receiver).

The sender reads and writes its state only through :class:`~.outbox.GroupOutbox` and
:class:`~contextful.engine.export.publications.CompletionStore`, so another profile is an adapter.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.engine.export.publications import Completion, open_completions
from contextful.engine.export.publications.identity import GroupIdentity, digest, event_id
from contextful.engine.export.publications.outbox import (
    GROUP_COMPLETE,
    MEMBER_COMPLETE,
    GroupEvent,
    GroupOutbox,
    StagedGroup,
    open_outbox,
)
from contextful.storage.errors import (
    ArgumentInvalid,
    ContextfulError,
    PublicationIncompatible,
    PublicationStorageUnsupported,
    SourceUnavailable,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.config.publications import PublicationSpec
    from contextful.storage.store import Store

Post = Callable[[str, dict[str, str], bytes], tuple[int, bytes]]
"""Deliver one event: ``(url, headers, body) -> (status, answer body)``."""


@dataclass(frozen=True)
class GroupDelivery:
    """What one ``export group`` call did."""

    publication: str
    group_id: str | None
    """The group delivered (None: nothing new to publish)."""
    order: int | None
    resumed: bool
    """Whether a pending group was resumed rather than staged."""
    delivered: int
    """Events delivered by this call."""
    events: int
    """Events in the group."""

    def to_json(self) -> dict[str, Any]:
        return {"publication": self.publication, "group": self.group_id, "order": self.order,
                "resumed": self.resumed, "delivered": self.delivered, "events": self.events}


UNSUPPORTED_PROFILES = ("postgres",)
"""The storage profiles that keep no coordinated-group outbox."""


def check_profile(name: str, profile: str | None = None) -> None:
    """``PublicationStorageUnsupported`` under a profile keeping no coordinated-group outbox (default:
    ``CONTEXTFUL_STORAGE_PROFILE``), before anything opens."""
    from contextful.storage.catalog import storage_profile

    found = storage_profile(profile)
    if found in UNSUPPORTED_PROFILES:
        raise PublicationStorageUnsupported(name, found, "this storage profile keeps no coordinated-group outbox")


def check_storage(store: Store, name: str) -> GroupOutbox:
    """The store's group outbox, or ``PublicationStorageUnsupported`` naming its profile."""
    outbox = open_outbox(store)
    if outbox is None:
        raise PublicationStorageUnsupported(name, store.catalog.profile, "this storage profile keeps no "
                                            "coordinated-group outbox")
    return outbox


def publication(manifest: Manifest, name: str) -> PublicationSpec:
    for spec in manifest.publications:
        if spec.name == name:
            return spec
    known = ", ".join(repr(p.name) for p in manifest.publications) or "none declared"
    raise ArgumentInvalid("NAME", name, f"no [[publication]] of that name (publications: {known})")


def export_group(store: Store, manifest: Manifest, name: str, *, post: Post | None = None,
                 rebuild: str | None = None) -> GroupDelivery:
    """Stage (or resume) and deliver publication ``name``'s next group (see the module docstring); with
    ``rebuild``, the group is a rebuild into that fresh namespace (``engine.export.publications.rebuild``)."""
    spec = publication(manifest, name)
    outbox = check_storage(store, name)
    pending = outbox.pending(name)
    resumed = pending is not None
    if pending is not None:
        check_group(store, spec, pending, "the pending group")
        if rebuild is not None and (pending.identity.namespace, pending.identity.order) != (rebuild, 1):
            raise ArgumentInvalid("NAME", name, f"group {pending.identity.order} of namespace "
                                  f"{pending.identity.namespace!r} is pending delivery: run `contextful export group "
                                  f"{name}` before a rebuild")
    else:
        pending = _stage_next(store, spec, outbox, rebuild)
        if pending is None:
            return GroupDelivery(name, None, None, False, 0, 0)
    delivered = deliver(manifest, spec, outbox, pending, post or http_post)
    return GroupDelivery(name, pending.group_id, pending.identity.order, resumed, delivered, len(pending.events))


def deliver(manifest: Manifest, spec: PublicationSpec, outbox: GroupOutbox, group: StagedGroup, post: Post,
            start: int | None = None) -> int:
    """POST ``group``'s events from ``start`` (default: its first unacknowledged one) to the publication's
    destination with its headers resolved, recording each acknowledgement; how many were delivered."""
    from contextful.engine.config.secrets import resolve_headers

    headers = resolve_headers(dict(spec.headers), manifest.root, f"[[publication]] {spec.name!r}.headers")
    return _deliver(spec, outbox, group, headers, post, group.acknowledged if start is None else start)


def _membership(spec: PublicationSpec) -> tuple[tuple[str, str, str], ...]:
    return tuple((m.type, m.producer, m.name) for m in spec.members)


def _read_identity(completions: dict[str, Completion]) -> str:
    """What the sender read: each producer's completed run and its outputs' frontiers."""
    return digest({p: {"run": c.run_id, "outputs": [[o.table, o.commit_seq] for o in c.outputs]}
                   for p, c in sorted(completions.items())})


def check_group(store: Store, spec: PublicationSpec, group: StagedGroup, what: str) -> None:
    """``PublicationIncompatible`` unless ``group`` (``what``: the pending group, a checkpoint's group) was
    staged for this publication's members, from this store incarnation, for its destination, from
    producer completions this store holds as it read them."""
    identity, name = group.identity, spec.name
    if identity.membership != _membership(spec):
        raise PublicationIncompatible(name, f"membership drift: {what} was staged for members "
                                      f"{_names(identity.membership)}, the publication declares "
                                      f"{_names(_membership(spec))}")
    if identity.incarnation != store.uuid:
        raise PublicationIncompatible(name, f"incarnation mismatch: {what} was staged from store "
                                      f"{identity.incarnation}, this is store {store.uuid}")
    if identity.destination != spec.destination:
        raise PublicationIncompatible(name, f"{what} goes to {identity.destination}, the publication "
                                      f"now declares {spec.destination}")
    completions = open_completions(store)
    runs = json.loads(group.events[-1].payload)["payload"].get("runs", {})
    read = {p: c for p, run in runs.items() if completions is not None and (c := completions.of_run(run)) is not None}
    if sorted(read) != sorted(spec.producers) or _read_identity(read) != identity.read_identity:
        raise PublicationIncompatible(name, f"{what}'s read identity changed: the producer completions "
                                      "it was staged from are not the store's")


def _names(membership: tuple[tuple[str, str, str], ...]) -> str:
    return ", ".join(f"{t} {p}.{n}" for t, p, n in membership)


def _stage_next(store: Store, spec: PublicationSpec, outbox: GroupOutbox, rebuild: str | None) -> StagedGroup | None:
    """Stage the group following the last acknowledged one in its namespace (None: nothing new), or
    with ``rebuild`` the first group of that fresh namespace, whatever was delivered before."""
    name = spec.name
    completions = open_completions(store)
    assert completions is not None  # the profile keeps an outbox, so it keeps completions
    latest: dict[str, Completion] = {}
    for producer in spec.producers:
        found = completions.latest(producer)
        if found is None:
            raise PublicationIncompatible(name, f"incomplete producer frontier: {producer!r} has no completed run")
        declared = sorted(m.name for m in spec.members if m.producer == producer)
        if sorted(o.table for o in found.outputs) != declared:
            raise PublicationIncompatible(name, f"membership drift: {producer!r} completed outputs "
                                          f"{', '.join(sorted(o.table for o in found.outputs))}, the publication "
                                          f"declares {', '.join(declared)}")
        latest[producer] = found
    frontier = {f"{p}.{o.table}": o.commit_seq for p, c in latest.items() for o in c.outputs}
    next_state = {f"{m.producer}.{m.name}": frontier[f"{m.producer}.{m.name}"] for m in spec.members}
    read_identity = _read_identity(latest)
    last = outbox.last_acknowledged(name)
    previous = last if rebuild is None else None
    if rebuild is not None and any(g.identity.namespace == rebuild for g in outbox.groups(name)):
        raise ArgumentInvalid("--namespace", rebuild, f"publication {name!r} delivered into that namespace "
                              "already: a rebuild goes to a fresh one")
    if previous is not None and previous.identity.read_identity == read_identity \
            and previous.identity.incarnation == store.uuid:
        return None  # the receiver holds this frontier already
    payloads = [member_payload(store, spec.name, m.type, m.producer, m.name, next_state[f"{m.producer}.{m.name}"],
                                latest[m.producer].run_id) for m in spec.members]
    identity = GroupIdentity(
        incarnation=store.uuid, destination=spec.destination,
        namespace=rebuild or (last.identity.namespace if last is not None else name), read_identity=read_identity,
        predecessor=previous.group_id if previous is not None else None,
        order=previous.identity.order + 1 if previous is not None else 1,
        input_frontier={p: c.input_frontier for p, c in sorted(latest.items())},
        membership=_membership(spec),
        delivered_base=dict(previous.identity.next_state) if previous is not None else {},
        next_state=next_state)
    group_id = identity.group_id
    events = [GroupEvent(event_id(group_id, n), n, MEMBER_COMPLETE,
                         _body(name, group_id, n, MEMBER_COMPLETE, identity, payload))
              for n, payload in enumerate(payloads)]
    end = len(events)
    complete = {"members": [e.event_id for e in events], "runs": {p: c.run_id for p, c in sorted(latest.items())}}
    events.append(GroupEvent(event_id(group_id, end), end, GROUP_COMPLETE,
                             _body(name, group_id, end, GROUP_COMPLETE, identity, complete)))
    return outbox.stage(name, identity, tuple(events))


def member_payload(store: Store, publication: str, kind: str, producer: str, table: str, seq: int | None,
                    run_id: str) -> dict[str, Any]:
    """One member read at its completed frontier (a post-commit read of the committed snapshot)."""
    rows = None
    if seq is not None:
        try:
            rows = base64.b64encode(_ipc(store.table(table).to_arrow(commit_seq=seq))).decode()
        except ContextfulError as exc:
            raise PublicationIncompatible(publication, f"the frontier of {producer}.{table} (commit {seq}) is no "
                                          f"longer readable: {exc.name}") from exc
    return {"type": kind, "producer": producer, "name": table, "commit_seq": seq, "run_id": run_id,
            "arrow_ipc": rows}


def _ipc(table: pa.Table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _body(publication: str, group_id: str, sequence: int, kind: str, identity: GroupIdentity,
          payload: dict[str, Any]) -> str:
    return json.dumps({"event_id": event_id(group_id, sequence), "group_id": group_id, "sequence": sequence,
                       "kind": kind, "publication": publication, "identity": identity.to_json(), "payload": payload},
                      sort_keys=True)


def _deliver(spec: PublicationSpec, outbox: GroupOutbox, group: StagedGroup, headers: dict[str, str],
             post: Post, start: int) -> int:
    delivered = 0
    for event in group.events[start:]:  # bounded by the group's members, in order
        status, answer = post(spec.destination, {"Content-Type": "application/json", **headers},
                              event.payload.encode())
        if status == 409:
            raise PublicationIncompatible(spec.name, f"the receiver refused event {event.sequence} of group "
                                          f"{group.group_id}: {answer.decode(errors='replace')}")
        acknowledged = json.loads(answer).get("acknowledged") if 200 <= status < 300 else None
        if acknowledged != event.event_id:
            raise SourceUnavailable(f"publication {spec.name!r} receiver {spec.destination}",
                                    f"event {event.sequence} was not acknowledged (status {status}); the rest "
                                    "stays pending for the next export group", status)
        outbox.acknowledge(spec.name, group.group_id, event.sequence)
        delivered += 1
    return delivered


def http_post(url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
    """POST ``body`` to ``url`` (no proxy); a refused or failed connection is ``SourceUnavailable``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise SourceUnavailable(f"receiver {url}", str(getattr(exc, "reason", exc))) from exc
