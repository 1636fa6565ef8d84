"""The D1 adapters of the publication ports, through their public verbs against the session's Worker
under miniflare (a fresh namespace per test): the group outbox's staging order, ``groups`` and
``restore`` (``engine.export.publications.outbox``), and the publication holds
(``engine.export.publications.holds``) whose exclusive hold is the publication's D1 lease
(``run.export.group-d1-lease``: the row every sender write predicates on), and a write racing
another in the window between its read and its batch (``run.export.group-d1-state``: the lost batch
changes no row). Oracles: D1's rows read directly through the binding."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
from contextful.engine.export.publications.d1 import D1GroupOutbox, D1Holds
from contextful.engine.export.publications.holds import EXCLUSIVE, SHARED
from contextful.engine.export.publications.identity import GroupIdentity, event_id
from contextful.engine.export.publications.outbox import (
    GROUP_COMPLETE,
    MEMBER_COMPLETE,
    GroupEvent,
    StagedGroup,
)
from contextful.storage.clock import ManualClock
from contextful.storage.d1.client import D1Binding
from contextful.storage.errors import ExecutionHeld

pytestmark = pytest.mark.d1


def group(namespace: str, order: int, predecessor: str | None = None) -> tuple[GroupIdentity, tuple[GroupEvent, ...]]:
    identity = GroupIdentity("store-1", "http://127.0.0.1:9/events", namespace, f"read-{namespace}-{order}",
                             predecessor, order, {}, (("table", "p", "t"),), {}, {"p.t": order})
    gid = identity.group_id
    return identity, (GroupEvent(event_id(gid, 0), 0, MEMBER_COMPLETE, '{"m": 0}'),
                      GroupEvent(event_id(gid, 1), 1, GROUP_COMPLETE, '{"g": 1}'))


def test_groups_keep_staging_order_and_restore_takes_the_larger_acknowledgement(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    outbox = D1GroupOutbox(client, ManualClock())
    first, first_events = group("bi", 1)
    staged = outbox.stage("bi", first, first_events)
    for n in range(2):
        outbox.acknowledge("bi", staged.group_id, n)
    # a rebuild restarts order 1 in a fresh namespace: staged at the next position all the same
    rebuilt, rebuilt_events = group("bi_2", 1)
    outbox.stage("bi", rebuilt, rebuilt_events)
    assert client.query("SELECT group_id, sequence FROM cf_publication_groups ORDER BY sequence") == [
        (first.group_id, 1), (rebuilt.group_id, 2)]
    assert [(g.group_id, g.acknowledged) for g in outbox.groups("bi")] == [(first.group_id, 2), (rebuilt.group_id, 0)]
    assert outbox.groups("bi")[1].events == rebuilt_events
    pending = outbox.pending("bi")
    assert pending is not None and pending.group_id == rebuilt.group_id
    last = outbox.last_acknowledged("bi")
    assert last is not None and last.group_id == first.group_id

    # a checkpoint's copy of the pending group, further acknowledged: the larger count, its events kept,
    # and wholly acknowledged it is promoted with its namespace
    restored = outbox.restore("bi", StagedGroup("bi", rebuilt, rebuilt_events, 2))
    assert (restored.acknowledged, restored.events) == (2, rebuilt_events)
    assert client.query("SELECT active_group, active_namespace FROM cf_publication_senders") == [
        (rebuilt.group_id, "bi_2")]
    # an older checkpoint's count changes nothing; a group held elsewhere lands at the next position
    assert outbox.restore("bi", StagedGroup("bi", rebuilt, rebuilt_events, 1)).acknowledged == 2
    other, other_events = group("bi_2", 2, rebuilt.group_id)
    assert outbox.restore("bi", StagedGroup("bi", other, other_events, 1)).acknowledged == 1
    assert [g.group_id for g in outbox.groups("bi")] == [first.group_id, rebuilt.group_id, other.group_id]
    # a staged event is immutable in D1 itself
    with pytest.raises(Exception, match="a staged event is immutable"):
        client.batch([("UPDATE cf_publication_events SET payload = 'x'", ())])


@pytest.mark.clause("run.export.group-d1-lease")
def test_the_exclusive_hold_is_the_publication_lease_every_write_predicates_on(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    clock = ManualClock()
    holds = D1Holds(client, clock)
    hold = holds.hold_exclusive("bi", "exporter-a", 30)
    assert hold is not None and (hold.holder, hold.mode) == ("exporter-a", EXCLUSIVE)
    assert client.query("SELECT holder, version, expires_us FROM cf_publication_senders") == [
        ("exporter-a", hold.version, clock.now_us() + 30_000_000)]
    assert holds.hold_exclusive("bi", "exporter-b", 30) is None  # one exclusive holder
    assert holds.claim_shared(["bi", "other"], "unit-1", 30) == (hold,)  # all or none: refused, nothing claimed
    assert holds.shared_holders("other") == ()

    # the outbox of the holding process writes as the hold's holder, bumping the row's version
    identity, events = group("bi", 1)
    D1GroupOutbox(client, clock).stage("bi", identity, events)
    [(holder, version)] = client.query("SELECT holder, version FROM cf_publication_senders")
    assert holder == "exporter-a" and version > hold.version
    renewed = holds.renew("exporter-a", 60)
    assert [(h.publication, h.mode, h.expires_us) for h in renewed] == [("bi", EXCLUSIVE, clock.now_us() + 60_000_000)]

    holds.release("exporter-a")
    assert holds.claim_shared(["bi", "other"], "unit-1", 30) == ()
    assert [(h.holder, h.mode) for h in holds.shared_holders("bi")] == [("unit-1", SHARED)]
    # a standing shared claim does not refuse the exclusive take (the exporter then waits for it)
    taken = holds.hold_exclusive("bi", "exporter-b", 30)
    assert taken is not None and taken.holder == "exporter-b"
    # a lapsed hold passes to the next exporter; its holder's renewal then renews nothing
    clock.advance(31)
    later = holds.hold_exclusive("bi", "exporter-c", 30)
    assert later is not None and holds.renew("exporter-b", 30) == ()
    assert holds.shared_holders("bi") == ()  # the claim lapsed too
    holds.release("exporter-c")



class RacingClock(ManualClock):
    """A manual clock that, the first time a write asks it the time (between the write's read and its
    batch), lets ``race`` run: another writer's whole write lands in that window."""

    def __init__(self) -> None:
        super().__init__()
        self.race: Callable[[], object] | None = None

    def now_us(self) -> int:
        race, self.race = self.race, None
        if race is not None:
            race()
        return super().now_us()


@pytest.mark.clause("run.export.group-d1-state")
def test_a_write_that_lost_the_race_to_another_changed_no_row_and_decides_again(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    clock = RacingClock()
    outbox, other = D1GroupOutbox(client, clock), D1GroupOutbox(client, ManualClock())
    mine, mine_events = group("bi", 1)
    theirs, theirs_events = group("bi", 2)
    outbox.pending("bi")  # the lease taken: both write as this process's holder
    # between this stage's read (no group, next position 1) and its batch, another write stages a group
    # at position 1: the batch's token take finds the row moved, so none of its statements lands (its
    # insert at position 1 would break the publication's unique positions), and it stages again at 2
    clock.race = lambda: other.stage("bi", theirs, theirs_events)
    staged = outbox.stage("bi", mine, mine_events)
    assert staged.events == mine_events
    assert client.query("SELECT group_id, sequence FROM cf_publication_groups ORDER BY sequence") == [
        (theirs.group_id, 1), (mine.group_id, 2)]
    assert client.query("SELECT count(*) FROM cf_publication_events") == [(4,)]
    # the completing acknowledgement racing another writer's renewal of the lease: one batch, landed once
    for n in range(2):
        clock.race = lambda: other.pending("bi")
        outbox.acknowledge("bi", theirs.group_id, n)
    assert client.query("SELECT acknowledged FROM cf_publication_groups WHERE group_id = ?", (theirs.group_id,)) == [
        (2,)]
    assert client.query("SELECT active_group, active_namespace FROM cf_publication_senders") == [
        (theirs.group_id, "bi")]


@pytest.mark.clause("run.export.group-d1-lease")
def test_a_live_holders_unexpired_lease_refuses_another_process_until_it_lapses(d1_binding: D1Binding) -> None:
    """Another process takes the publication's exclusive hold and exits without releasing it (as if it
    still ran elsewhere: its holder id is no process of this host's, so never provably dead)."""
    client = d1_binding.client()
    taker = ("import sys\nfrom contextful.engine.export.publications.d1 import D1Holds\n"
             "from contextful.storage.clock import SystemClock\nfrom contextful.storage.d1.client import D1Binding\n"
             "url, token, namespace = sys.argv[1:]\n"
             "assert D1Holds(D1Binding(url, token, namespace).client(), SystemClock())"
             ".hold_exclusive('bi', 'exporter-elsewhere', 30) is not None\n")
    subprocess.run([sys.executable, "-c", taker, d1_binding.url, d1_binding.token, d1_binding.namespace], check=True,
                   timeout=120)
    before = client.query("SELECT version, holder, expires_us FROM cf_publication_senders")
    clock = ManualClock(before[0][2] - 1_000_000)  # a second before the lease lapses
    outbox = D1GroupOutbox(client, clock)
    identity, events = group("bi", 1)
    with pytest.raises(ExecutionHeld, match="holder 'exporter-elsewhere'"):
        outbox.stage("bi", identity, events)
    assert client.query("SELECT version, holder, expires_us FROM cf_publication_senders") == before
    assert client.query("SELECT count(*) FROM cf_publication_groups") == [(0,)]
    clock.advance(1)  # lapsed: taken over, and the stage lands
    assert outbox.stage("bi", identity, events).events == events
    assert client.query("SELECT holder FROM cf_publication_senders")[0][0] != "exporter-elsewhere"
