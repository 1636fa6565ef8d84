"""Two synced nodes applying at the same instant: the bucket head's conditional write decides the
version, and the loser reapplies onto the winner (surface.apply.version-race on the synced path;
docs/control.md "Synced control").

Each node is a project directory of its own syncing through one bucket (moto on loopback). Both
applies are held at one barrier at their ``step`` seam ("claim": signed, nothing published or
written yet) so each has read the same head before either publishes: the race is real. What lands is
read back from both snapshot directories and the bucket; every command after the race is the CLI.
The other tests lose through the command alone: to a push that ran whole, to a push that died
between its objects and its head (rolled forward), and a node whose chain parted from the bucket's
by the earlier claim-then-push order (refused, naming the recovery).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from contextful.engine.control.apply import ApplyOutcome, apply_manifest
from contextful.engine.control.synced import Offered

from tests.engine.control.test_apply import SECOND_PIPELINE
from tests.engine.control.test_sync import (
    BucketView,
    Keys,
    Node,
    make_keys,
    make_node,
    sha256,
    signature_holds,
)
from tests.engine.control.test_sync_push import THIRD_PIPELINE, claim_aside
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.s3


def held(node: Node) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in node.snapshots.glob("*@v*")}


def applied(node: Node) -> int:
    return int((node.snapshots / "manifest@current").read_text())


def two_nodes(tmp_path: Path, s3: S3Server) -> tuple[Keys, str, Node, Node]:
    keys, control = make_keys(tmp_path / "keys"), s3.new_bucket()
    east, west = (make_node(tmp_path / name, s3, control, keys) for name in ("east", "west"))
    assert east.run("pipeline", "import").stdout == "claimed v1 (applied)\n"
    assert west.run("control", "pull").stdout == "adopted v1 (applied)\n"
    return keys, control, east, west


def bucket_chain(s3: S3Server, bucket: str) -> dict[str, bytes]:
    """The bucket's versions and receipts, the receipt chain verified from the head down to v1."""
    view = BucketView(s3, bucket)
    body, meta = view.head()
    digest, found = meta["receipt"], {}
    for version in range(int(body), 0, -1):
        data, snapshot = view.get(f"receipt@v{version}.json"), view.get(f"manifest@v{version}.toml")
        receipt: dict[str, Any] = json.loads(data)
        assert sha256(data) == digest and data == rfc8785.dumps(receipt) and signature_holds(receipt)
        assert receipt["version"] == version and receipt["snapshot"] == sha256(snapshot)
        found |= {f"receipt@v{version}.json": data, f"manifest@v{version}.toml": snapshot}
        digest = receipt["parent"]
    assert digest == "-"
    return found


@pytest.mark.clause("surface.apply.version-race")
def test_two_synced_applies_at_once_the_loser_reapplies_onto_the_winner_and_both_end_on_one_chain(
        tmp_path: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    keys, control, east, west = two_nodes(tmp_path, s3_server)
    monkeypatch.setenv("CONTEXTFUL_S3_ENDPOINT_URL", s3_server.endpoint)
    east.write(east.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    west.write(west.root.joinpath("contextful.toml").read_text() + THIRD_PIPELINE)
    before = {node.root.name: held(node) for node in (east, west)}
    barrier = threading.Barrier(2, timeout=120)
    moments: dict[str, list[tuple[str, int, int]]] = {"east": [], "west": []}
    answers: dict[str, ApplyOutcome | BaseException] = {}

    def run(node: Node) -> None:
        def step(what: str, version: int) -> None:
            moments[node.root.name].append((what, version, applied(node)))
            if (what, version) == ("claim", 2):  # both signed v2 after head v1; neither published
                barrier.wait()

        try:
            answers[node.root.name] = apply_manifest(node.root, step=step,
                                                     offered=Offered(token=keys.admin, signing_key=keys.pem))
        except BaseException as exc:  # noqa: BLE001 - reported below, on the test's thread
            answers[node.root.name] = exc

    threads = [threading.Thread(target=run, args=(node,)) for node in (east, west)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    outcomes = {name: answer for name, answer in answers.items() if isinstance(answer, ApplyOutcome)}
    assert len(outcomes) == 2, answers
    winner_name = next(name for name, o in outcomes.items() if o.version == 2)
    winner, loser = (east, west) if winner_name == "east" else (west, east)
    won, lost = outcomes[winner.root.name], outcomes[loser.root.name]
    assert (won.version, won.claimed, won.conflicts) == (2, True, 0)
    assert (lost.version, lost.claimed, lost.previous, lost.conflicts) == (3, True, 2, 1)
    # the loser wrote nothing of its v2: it adopted the winner's v2, then claimed v3 after it
    assert moments[loser.root.name][:2] == [("claim", 2, 1), ("claim", 3, 2)]
    assert (loser.snapshots / "manifest@v2.toml").read_bytes() == (winner.snapshots / "manifest@v2.toml").read_bytes()
    mine = loser.root.joinpath("contextful.toml").read_text()
    assert (loser.snapshots / "manifest@v3.toml").read_text().startswith(mine)  # its edit, reapplied onto v2

    assert winner.run("control", "pull").stdout == "adopted v3 (applied)\n"
    assert applied(winner) == applied(loser) == 3
    chain = bucket_chain(s3_server, control)
    assert held(winner) == held(loser) == chain  # one chain on both nodes and in the bucket
    for name, files in before.items():  # no version file was rewritten
        assert all(chain[file] == data for file, data in files.items()), name


@pytest.mark.clause("surface.apply.version-race")
def test_a_synced_apply_lost_to_a_whole_push_reapplies_through_the_command(
        tmp_path: Path, s3_server: S3Server) -> None:
    _keys, control, east, west = two_nodes(tmp_path, s3_server)
    east.write(east.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    assert east.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"
    west.write(west.root.joinpath("contextful.toml").read_text() + THIRD_PIPELINE)
    out = west.run("--json", "pipeline", "apply")  # west is at v1: it adopts east's v2 first, then claims v3
    answer = json.loads(out.stdout)
    assert (answer["version"], answer["previous"], answer["claimed"]) == (3, 2, True)
    assert east.run("control", "pull").stdout == "adopted v3 (applied)\n"
    assert held(east) == held(west) == bucket_chain(s3_server, control)


def test_a_node_holding_a_version_the_bucket_does_not_is_told_how_to_recover(
        tmp_path: Path, s3_server: S3Server) -> None:
    _keys, control, east, west = two_nodes(tmp_path, s3_server)
    claim_aside(west, control, s3_server.new_bucket(), THIRD_PIPELINE)  # west's v2, never published here
    east.write(east.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    assert east.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"
    stuck = held(west)
    for args in (("control", "pull"), ("pipeline", "apply")):
        out = west.run(*args, check=False)
        assert out.returncode == 5 and "ManifestVersionConflict" in out.stderr, out.stderr
        assert "is not the bucket's v2" in out.stderr and "never published" in out.stderr
        assert "[control] snapshot_dir" in out.stderr and "contextful pipeline import" in out.stderr
        assert held(west) == stuck  # refused: nothing written, nothing rewritten
    text = west.root.joinpath("contextful.toml").read_text()  # the recovery the message names
    west.write(text.replace("\n[[pipeline]]", '\n[control]\nsnapshot_dir = "rejoined"\n\n[[pipeline]]', 1))
    assert west.run("pipeline", "import").stdout.startswith("adopted v2")
    assert (west.root / "rejoined" / "manifest@v2.toml").read_bytes() == (east.snapshots / "manifest@v2.toml").read_bytes()
    assert held(west) == stuck  # the old directory is left as it was


@pytest.mark.clause("surface.apply.version-race")
def test_a_version_published_without_its_head_is_rolled_forward_and_the_apply_reapplies_after_it(
        tmp_path: Path, s3_server: S3Server) -> None:
    _keys, control, east, west = two_nodes(tmp_path, s3_server)
    claim_aside(west, control, s3_server.new_bucket(), THIRD_PIPELINE)  # west's signed v2, after v1
    view = BucketView(s3_server, control)
    for name in ("manifest@v2.toml", "receipt@v2.json"):  # a push that died between its objects and its head
        view.put(name, (west.snapshots / name).read_bytes())
    assert view.head()[0] == b"1\n"
    east.write(east.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    answer = json.loads(east.run("--json", "pipeline", "apply").stdout)
    assert (answer["version"], answer["previous"], answer["conflicts"]) == (3, 2, 1)
    chain = bucket_chain(s3_server, control)  # the head went to west's v2, then to east's v3
    assert chain["manifest@v2.toml"] == (west.snapshots / "manifest@v2.toml").read_bytes()
    assert held(east) == chain
