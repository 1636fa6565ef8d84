"""``run.export.group-incompatible``: each case the clause lists raises ``PublicationIncompatible``
before delivery or activation, through the commands a user runs (``contextful export group|restore``
child processes) and the receiver process on loopback: membership drift (at staging and of a pending
group), an incarnation mismatch and a changed read identity of a pending group, an incomplete
producer frontier, a predecessor/order mismatch (the receiver's 409), and an incompatible checkpoint
(another store's, another membership's, events whose identifiers no longer bind, changed member rows).
Oracles: the forwarder's record of every request (nothing reaches the receiver), the receiver's
SQLite file and ``GET /active`` (nothing activates), the sender's outbox read from the catalog."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engine.export.publication_project import (
    MANIFEST,
    PUBLICATION,
    Gate,
    Project,
    ReceiverProcess,
    carry_outbox,
    export_group,
    outbox,
)

REFUSED = "error: PublicationIncompatible: publication 'bi': "

WITHOUT_REJECTED = {
    "manifest": MANIFEST.replace('tables = ["enriched", "rejected"]', 'tables = ["enriched"]'),
    "publication": PUBLICATION.replace('\n[[publication.member]]\ntype = "table"\nproducer = "enrich"\n'
                                       'name = "rejected"\n', "")}
"""The declaration drops ``rejected`` from the job and the publication (the completions still hold it)."""

WITH_MONTHLY = {
    "manifest": MANIFEST + '\n[[model]]\nname = "monthly"\nsql = "SELECT max(amount) AS top FROM orders"\n\n'
                '[[job]]\nname = "build_monthly"\nkind = "build"\ntarget = ["monthly"]\n',
    "publication": PUBLICATION + '\n[[publication.member]]\ntype = "model"\nproducer = "build_monthly"\n'
                                 'name = "monthly"\n'}
"""A third producer joins the publication; it has never completed."""


def refused(done: Any, why: str) -> None:
    assert done.returncode != 0, done.stdout
    assert done.stderr.startswith(REFUSED) and why in done.stderr, done.stderr
    assert "nothing was delivered or activated" in done.stderr


@pytest.mark.clause("run.export.group-incompatible")
def test_an_incomplete_producer_frontier_or_membership_drift_refuses_before_staging(
        tmp_path: Path, fired_project: Path, receiver: ReceiverProcess, gate: Gate) -> None:
    project = Project(tmp_path / "p", gate.url, copy_of=fired_project)
    project.write(gate.url, **WITH_MONTHLY)
    refused(export_group(project, check=False), "incomplete producer frontier: 'build_monthly' has no completed run")
    project.write(gate.url, **WITHOUT_REJECTED)
    refused(export_group(project, check=False),
            "membership drift: 'enrich' completed outputs enriched, rejected, the publication declares enriched")
    assert outbox(project) == [] and gate.seen == [] and receiver.events() == []


@pytest.mark.clause("run.export.group-incompatible")
def test_a_pending_group_from_another_incarnation_read_or_membership_refuses_before_delivery(
        tmp_path: Path, fired_project: Path, receiver: ReceiverProcess, gate: Gate) -> None:
    """A pending group (delivery stopped after 2 of 5 events) is resumed only into the store, the
    producer completions and the members it was staged from."""
    first = Project(tmp_path / "first", gate.url, copy_of=fired_project)
    first.fire("enrich")  # a completion only ``first`` holds
    gate.allow = 2
    assert export_group(first, check=False).returncode != 0
    assert [(g, s) for g, s, *_x in outbox(first)] == [(1, n) for n in range(5)]
    seen, received = len(gate.seen), receiver.events()
    assert len(received) == 2 and receiver.active() is None
    gate.allow = 1_000_000

    # the same sender state in another store (another incarnation)
    other = Project(tmp_path / "other", gate.url)
    other.land("a", [9])  # a store of its own
    carry_outbox(first, other)
    refused(export_group(other, check=False),
            f"incarnation mismatch: the pending group was staged from store {first.store_uuid()}, this is store "
            f"{other.store_uuid()}")
    # in a copy of the same store that never completed the run the group was read from
    earlier = Project(tmp_path / "earlier", gate.url, copy_of=fired_project)
    assert earlier.store_uuid() == first.store_uuid()
    carry_outbox(first, earlier)
    refused(export_group(earlier, check=False), "the pending group's read identity changed")
    # the publication's members changed since the group was staged
    first.write(gate.url, **WITHOUT_REJECTED)
    refused(export_group(first, check=False),
            "membership drift: the pending group was staged for members table enrich.enriched, table "
            "enrich.rejected, model build_reports.daily, model build_reports.weekly, the publication declares "
            "table enrich.enriched, model build_reports.daily, model build_reports.weekly")
    assert len(gate.seen) == seen and receiver.events() == received and receiver.active() is None
    for project in (first, other, earlier):  # nothing acknowledged, nothing restaged
        assert [(g, s) for g, s, *_x in outbox(project)] == [(1, n) for n in range(5)]


@pytest.mark.clause("run.export.group-incompatible")
def test_a_predecessor_or_order_mismatch_is_the_receivers_refusal(
        tmp_path: Path, fired_project: Path, receiver: ReceiverProcess, gate: Gate) -> None:
    """Two copies of one store publish into one namespace: the second's first group follows no group
    the receiver holds, and its 409 surfaces as ``PublicationIncompatible`` naming the mismatch."""
    first = Project(tmp_path / "first", gate.url, copy_of=fired_project)
    second = Project(tmp_path / "second", gate.url, copy_of=fired_project)
    second.fire("enrich")
    export_group(first)
    before, held = receiver.active(), receiver.events()
    assert before is not None and before["order"] == 1
    refused(export_group(second, check=False), "predecessor/order mismatch: group ")
    assert receiver.active() == before
    # its member events were staged (they change nothing a reader sees), its group-complete event was not
    assert len(receiver.events()) == len(held) + 4 and not any(
        kind == "group-complete" for _e, group, _s, kind, _b in receiver.events() if group != before["group_id"])


@pytest.mark.clause("run.export.group-incompatible")
def test_an_incompatible_checkpoint_refuses_before_anything_is_delivered(
        tmp_path: Path, fired_project: Path, receiver: ReceiverProcess, gate: Gate) -> None:
    project = Project(tmp_path / "p", gate.url, copy_of=fired_project)
    export_group(project)
    saved = tmp_path / "bi.checkpoint.json"
    project.cli("export", "checkpoint", "bi", "--to", str(saved))
    staged, seen, received, active = outbox(project), len(gate.seen), receiver.events(), receiver.active()
    doc = json.loads(saved.read_text())

    def restore(target: Project, changed: dict[str, Any] | None, why: str) -> None:
        path = saved
        if changed is not None:
            path = tmp_path / "changed.json"
            path.write_text(json.dumps(changed))
        refused(target.cli("export", "restore", "bi", "--from", str(path), check=False), why)
        assert len(gate.seen) == seen and receiver.events() == received and receiver.active() == active

    # another store incarnation
    other = Project(tmp_path / "other", gate.url)
    other.land("a", [9])  # a store of its own
    restore(other, None, f"incarnation mismatch: it was saved from store {project.store_uuid()}")
    assert outbox(other) == []
    # an event whose identifier no longer binds its group and sequence
    tampered = json.loads(json.dumps(doc))
    tampered["groups"][0]["events"][1]["event_id"] = tampered["groups"][0]["events"][2]["event_id"]
    restore(project, tampered, "event 1 of group")
    # an event carrying another identity (its group id no longer its identity's digest)
    tampered = json.loads(json.dumps(doc))
    body = json.loads(tampered["groups"][0]["events"][0]["payload"])
    body["identity"]["order"] = 7
    tampered["groups"][0]["events"][0]["payload"] = json.dumps(body, sort_keys=True)
    restore(project, tampered, "does not bind its group and sequence")
    # member rows changed under an unchanged identifier
    tampered = json.loads(json.dumps(doc))
    body = json.loads(tampered["groups"][0]["events"][0]["payload"])
    body["payload"]["arrow_ipc"] = body["payload"]["arrow_ipc"][:-8] + "AAAAAAAA"
    tampered["groups"][0]["events"][0]["payload"] = json.dumps(body, sort_keys=True)
    restore(project, tampered, "events differ from the ones the sender staged")
    fresh = Project(tmp_path / "fresh", gate.url, copy_of=fired_project)  # holds no group: reads the store again
    restore(fresh, tampered, "member enrich.enriched is not what the store holds at its frontier")
    assert outbox(fresh) == []
    # another membership
    project.write(gate.url, **WITHOUT_REJECTED)
    restore(project, None, "membership drift: checkpoint group 1")
    assert outbox(project) == staged
