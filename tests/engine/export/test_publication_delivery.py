"""``contextful export group <name>`` (a child process) delivering to a receiver run as its own
process on loopback (``python -m contextful.engine.export.receiver``): one ordered outbox per group —
member-complete events in publication order, then one group-complete event — whose identifiers bind
the group and its sequence (``run.export.group-delivery``, ``run.export.group-identity``); the receiver
activates the members together only when the group completes, an interrupted delivery leaves the
active group as it was, the resumed delivery reoffers identical identifiers, and acknowledged retries
change no byte (``run.export.group-activation``); under the postgres profile the command refuses
before anything (``run.export.group-storage``). Oracles: the store's tables read at each frontier, the
identifiers recomputed here with hashlib, the receiver's SQLite file read directly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.export.receiver import rows

from tests.engine.export.publication_project import (
    TOKEN,
    Gate,
    Project,
    ReceiverProcess,
    export_group,
    outbox,
    post,
)


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@pytest.fixture
def project(tmp_path: Path, gate: Gate, fired_project: Path) -> Project:
    return Project(tmp_path / "p", gate.url, copy_of=fired_project)


MEMBERS = ["enrich.enriched", "enrich.rejected", "build_reports.daily", "build_reports.weekly"]


@pytest.mark.clause("run.export.group-delivery", "run.export.group-identity", "run.export.group-activation")
def test_a_group_is_staged_in_order_and_the_receiver_activates_every_member_together(
        project: Project, receiver: ReceiverProcess, gate: Gate) -> None:
    heads = project.heads(["enriched", "daily", "weekly"])
    done = json.loads(export_group(project).stdout)
    assert (done["order"], done["resumed"], done["delivered"], done["events"]) == (1, False, 5, 5)
    staged = outbox(project)
    assert [(g, s, kind) for g, s, _id, kind, _p in staged] == [
        (1, 0, "member-complete"), (1, 1, "member-complete"), (1, 2, "member-complete"),
        (1, 3, "member-complete"), (1, 4, "group-complete")]
    # the identity binds what the clause lists, and the group id is its digest; each event id binds group and sequence
    first = json.loads(staged[0][4])
    identity, group_id = first["identity"], first["group_id"]
    assert group_id == done["group"] == _digest(identity)
    assert [event_id for _g, _s, event_id, _k, _p in staged] == [_digest({"group": group_id, "sequence": n})
                                                                for n in range(5)]
    completions = {c["producer"]: c for c in project.completions()}
    assert identity == {
        "incarnation": project.store_uuid(), "destination": gate.url, "namespace": "bi",
        "read_identity": identity["read_identity"], "predecessor": None, "order": 1,
        "input_frontier": {p: completions[p]["input_frontier"] for p in ("build_reports", "enrich")},
        "membership": [["table", "enrich", "enriched"], ["table", "enrich", "rejected"],
                       ["model", "build_reports", "daily"], ["model", "build_reports", "weekly"]],
        "delivered_base": {},
        "next_state": {"enrich.enriched": heads["enriched"], "enrich.rejected": None,
                       "build_reports.daily": heads["daily"], "build_reports.weekly": heads["weekly"]}}
    # delivered as staged, in order, with the publication's header binding resolved
    assert [body for _h, body in gate.seen] == [p.encode() for *_x, p in staged]
    assert all(h["Authorization"] == f"Bearer {TOKEN}" for h, _b in gate.seen)
    active = receiver.active()
    assert active is not None and (active["group_id"], active["order"]) == (group_id, 1)
    assert list(active["members"]) == MEMBERS
    for member, table in (("enrich.enriched", "enriched"), ("build_reports.daily", "daily"),
                          ("build_reports.weekly", "weekly")):
        assert rows(active["members"][member]).equals(project.arrow(table, heads[table])), member
    assert rows(active["members"]["enrich.rejected"]) is None  # the empty output, a member all the same

    # nothing new: nothing staged or delivered
    assert json.loads(export_group(project).stdout)["group"] is None
    assert len(gate.seen) == 5
    # a later frontier: group 2 follows group 1
    project.land("b", [4, 5])
    project.fire("enrich")
    project.fire("build_reports")
    second = json.loads(export_group(project).stdout)
    identity2 = json.loads(outbox(project)[5][4])["identity"]
    assert (second["order"], identity2["predecessor"], identity2["delivered_base"]) == (2, group_id,
                                                                                        identity["next_state"])
    after = receiver.active()
    assert after is not None and (after["group_id"], after["order"]) == (second["group"], 2)
    later = project.heads(["enriched"])["enriched"]
    assert rows(after["members"]["enrich.enriched"]).equals(project.arrow("enriched", later))
    assert identity2["next_state"]["enrich.enriched"] == later > heads["enriched"]


@pytest.mark.clause("run.export.group-activation", "run.export.group-delivery")
@pytest.mark.parametrize("passed", [1, 4])
def test_an_interrupted_delivery_keeps_the_active_group_and_resumes_with_identical_identifiers(
        project: Project, receiver: ReceiverProcess, gate: Gate, passed: int) -> None:
    """Delivery stops after ``passed`` events (and the answer to the next is lost): the receiver's
    active group stays the previous complete one (or, when the lost answer was the group-complete
    event's, is the new group whole); the next ``export group`` reoffers the same events,
    and the receiver acknowledges the one it staged already without changing a byte."""
    export_group(project)
    before = receiver.active()
    assert before is not None and before["order"] == 1
    project.fire("enrich")  # a new completion: group 2
    gate.seen.clear()
    gate.allow, gate.lose_ack = passed, True
    failed = export_group(project, check=False)
    assert failed.returncode != 0 and "error: SourceUnavailable:" in failed.stderr, failed.stderr
    interrupted = receiver.active()
    if passed < 4:  # an interrupted delivery preserves the active group
        assert interrupted == before
    else:  # the group-complete event reached the receiver, its answer was lost: the group is active, whole
        assert interrupted is not None and interrupted["order"] == 2 and list(interrupted["members"]) == MEMBERS
    staged = [p.encode() for g, *_x, p in outbox(project) if g == 2]
    assert [body for _h, body in gate.seen] == staged[:passed + 1]  # the sender stops at the lost answer
    received = receiver.events()
    gate.seen.clear()
    gate.allow = 1_000_000
    resumed = json.loads(export_group(project).stdout)
    assert (resumed["resumed"], resumed["order"], resumed["delivered"]) == (True, 2, 5 - passed)
    # the resumed delivery reoffers identical identifiers and bytes from the first unacknowledged event
    assert [body for _h, body in gate.seen] == staged[passed:]
    now = receiver.events()
    assert now[:len(received)] == received or set(received) <= set(now)  # nothing staged before changed
    after = receiver.active()
    assert after is not None and (after["group_id"], after["order"]) == (resumed["group"], 2)
    # an acknowledged retry of any event changes nothing; other bytes under its id are refused
    for body in staged:
        assert post(receiver.events_url, body)[0] == 200
    assert receiver.events() == now and receiver.active() == after
    forged = json.loads(staged[0])
    forged["payload"]["commit_seq"] = 999
    status, answer = post(receiver.events_url, json.dumps(forged, sort_keys=True).encode())
    assert status == 409 and b"staged with other bytes" in answer
    assert receiver.events() == now


@pytest.mark.clause("run.export.group-activation")
def test_the_receiver_refuses_a_group_whose_member_events_are_not_all_staged(
        project: Project, receiver: ReceiverProcess, gate: Gate) -> None:
    export_group(project)
    staged = [p.encode() for *_x, p in outbox(project)]
    # a group-complete event whose members are not all staged activates nothing
    other = ReceiverProcess(receiver.db.with_name("other.sqlite"))
    try:
        for body in staged[:2]:
            assert post(other.events_url, body)[0] == 200
        status, answer = post(other.events_url, staged[-1])
        assert status == 409 and b"incomplete: 2 of 4 member events staged" in answer
        assert other.active() is None
    finally:
        other.stop()


@pytest.mark.clause("run.export.group-storage")
def test_under_postgres_export_group_refuses_before_anything(tmp_path: Path, receiver: ReceiverProcess,
                                                             gate: Gate) -> None:
    project = Project(tmp_path / "p", gate.url)
    refused = export_group(project, check=False, env={"CONTEXTFUL_STORAGE_PROFILE": "postgres"})
    assert refused.returncode != 0
    assert refused.stderr.startswith("error: PublicationStorageUnsupported: publication 'bi' under storage "
                                     "profile 'postgres'"), refused.stderr
    assert "coordinated-group-outbox" in refused.stderr
    # nothing read, staged or delivered: no store was even opened, the receiver heard nothing
    assert not (project.root / ".contextful" / "store").exists()
    assert gate.seen == [] and receiver.events() == []
