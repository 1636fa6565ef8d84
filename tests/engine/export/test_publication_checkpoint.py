"""``run.export.group-checkpoint``: ``contextful export checkpoint bi --to FILE`` saves the delivery
state (every staged group, its immutable events, how far each was acknowledged, the store
incarnation) as one file; ``contextful export restore bi --from FILE`` replays a compatible
checkpoint's events, which the receiver (its own process, on loopback) acknowledges without changing
a byte, keeping its accepted groups and active group: an older checkpoint reverses no later
publication, and a sender whose state is older than the checkpoint takes the checkpoint's groups and
continues after them. Oracles: the sender's outbox and the receiver's SQLite file read directly, the
store's tables read at each frontier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.engine.export.receiver import rows

from tests.engine.export.publication_project import Gate, Project, ReceiverProcess, export_group, outbox


def checkpoint(project: Project, path: Path) -> dict[str, object]:
    saved: dict[str, object] = json.loads(project.cli("--json", "export", "checkpoint", "bi", "--to", str(path)).stdout)
    return saved


def restore(project: Project, path: Path) -> dict[str, object]:
    done: dict[str, object] = json.loads(project.cli("--json", "export", "restore", "bi", "--from", str(path)).stdout)
    return done


@pytest.mark.clause("run.export.group-checkpoint")
def test_a_checkpoint_saves_delivery_state_and_its_restore_reverses_nothing_the_receiver_accepted(
        tmp_path: Path, fired_project: Path, receiver: ReceiverProcess, gate: Gate) -> None:
    first = Project(tmp_path / "first", gate.url, copy_of=fired_project)
    group1 = json.loads(export_group(first).stdout)["group"]
    first.fire("enrich")
    # an older sender state: a copy of the store holding the new completion, its outbox at group 1
    older = Project(tmp_path / "older", gate.url, copy_of=first.root)
    gate.allow = 2  # group 2's delivery stops after 2 of its 5 events
    assert export_group(first, check=False).returncode != 0
    midway = tmp_path / "midway.json"
    assert checkpoint(first, midway) == {"publication": "bi", "path": str(midway), "groups": 2, "events": 10}
    saved = json.loads(midway.read_text())
    staged = outbox(first)
    assert saved["incarnation"] == first.store_uuid()
    assert [(g["identity"]["order"], g["acknowledged"]) for g in saved["groups"]] == [(1, 5), (2, 2)]
    assert [(n + 1, e["sequence"], e["event_id"], e["kind"], e["payload"]) for n, g in enumerate(saved["groups"])
            for e in g["events"]] == staged  # the immutable events, byte for byte
    gate.allow = 1_000_000
    group2 = json.loads(export_group(first).stdout)
    assert (group2["order"], group2["resumed"], group2["delivered"]) == (2, True, 3)
    complete = tmp_path / "complete.json"
    checkpoint(first, complete)
    held, active = receiver.events(), receiver.active()
    assert active is not None and (active["group_id"], active["order"]) == (group2["group"], 2)

    # the older checkpoint replays every event it holds; the receiver holds them all and changes nothing
    seen = len(gate.seen)
    assert restore(first, midway)["events"] == 10
    assert [body for _h, body in gate.seen[seen:]] == [p.encode() for *_x, p in staged]
    assert receiver.events() == held and receiver.active() == active
    assert outbox(first) == staged and first.rows("SELECT sequence, acknowledged FROM cf_publication_groups "
                                                  "ORDER BY sequence") == [(1, 5), (2, 5)]

    # the older sender, restored from the complete checkpoint, continues after group 2
    older.fire("enrich")
    assert older.rows("SELECT sequence, acknowledged FROM cf_publication_groups") == [(1, 5)]
    assert restore(older, complete)["events"] == 10
    assert outbox(older) == staged and receiver.events() == held and receiver.active() == active
    group3 = json.loads(export_group(older).stdout)
    assert (group3["order"], group3["resumed"]) == (3, False)
    identity = json.loads(outbox(older)[-1][4])["identity"]
    assert (identity["predecessor"], identity["order"]) == (group2["group"], 3)
    after = receiver.active()
    assert after is not None and (after["group_id"], after["order"]) == (group3["group"], 3)
    enriched = older.heads(["enriched"])["enriched"]
    assert identity["next_state"]["enrich.enriched"] == enriched
    assert rows(after["members"]["enrich.enriched"]).equals(older.arrow("enriched", enriched))
    assert group1 != group2["group"] != group3["group"]
    # a restore of the older checkpoint now still changes nothing the receiver accepted
    now = receiver.events()
    restore(older, midway)
    assert receiver.events() == now and receiver.active() == after
