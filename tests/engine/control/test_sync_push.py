"""``contextful control push`` racing another push: the bucket decides, by a conditional write
(surface.apply.receipt-digest; docs/control.md "Synced control").

Two nodes' pushes are interleaved deterministically: one push is held after it read the bucket head
(its ``step``) while the other runs whole. The server (moto on loopback) must refuse the held push's
stale ``If-Match`` or its second create of a version: the loser is told, and nothing the winner
pushed is overwritten.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from contextful.engine.control.apply import snapshot_dir
from contextful.engine.control.synced import SyncedProject, push_control
from contextful.storage.errors import ManifestVersionConflict

from tests.engine.control.test_apply import SECOND_PIPELINE
from tests.engine.control.test_sync import BucketView, Node, make_keys, make_node, sha256
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.s3

THIRD_PIPELINE = SECOND_PIPELINE.replace("orders", "refunds")


def claim_aside(node: Node, shared: str, aside: str, added: str) -> None:
    """Apply ``added`` on ``node`` while it syncs through ``aside``: a version the shared bucket lacks."""
    text = node.root.joinpath("contextful.toml").read_text()
    node.write(text.replace(shared, aside) + added)
    node.run("pipeline", "apply")
    node.write(node.root.joinpath("contextful.toml").read_text().replace(aside, shared))


def copy_node(node: Node, path: Path) -> Node:
    shutil.copytree(node.root, path)
    return Node(path, node.env, node.s3, node.bucket)


@pytest.fixture
def shared_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTFUL_S3_ENDPOINT_URL", s3_server.endpoint)


def test_a_push_whose_head_moved_meanwhile_is_refused_and_the_head_stays_the_winners(
        tmp_path: Path, s3_server: S3Server, shared_env: None) -> None:
    keys = make_keys(tmp_path / "keys")
    shared, aside = s3_server.new_bucket(), s3_server.new_bucket()
    a = make_node(tmp_path / "a", s3_server, shared, keys)
    a.run("pipeline", "import")  # the shared head: v1
    claim_aside(a, shared, aside, SECOND_PIPELINE)
    b = copy_node(a, tmp_path / "b")  # b holds a's v1 and v2
    claim_aside(a, shared, aside, THIRD_PIPELINE)  # a holds v3 besides
    view = BucketView(s3_server, shared)

    def race(what: str, version: int) -> None:  # b read head v1 and holds; a pushes v2 and v3 whole
        assert (what, version) == ("head", 2)
        assert push_control(a.root).pushed == (2, 3)

    with pytest.raises(ManifestVersionConflict, match="another push moved the bucket head first"):
        SyncedProject.at(b.root).push(snapshot_dir(b.root), step=race)
    body, meta = view.head()  # the stale If-Match was refused: the head was not moved back to v2
    assert body == b"3\n" and meta["receipt"] == sha256((a.snapshots / "receipt@v3.json").read_bytes())
    for name in ("manifest@v2.toml", "receipt@v2.json", "manifest@v3.toml", "receipt@v3.json"):
        assert view.get(name) == (a.snapshots / name).read_bytes()
    one = b.run("control", "push", check=False)  # told again, through the command: b is behind the head now
    assert one.returncode == 5 and "ManifestVersionConflict" in one.stderr and "behind the bucket head v3" in one.stderr


def test_a_push_whose_version_another_push_claimed_meanwhile_overwrites_nothing(
        tmp_path: Path, s3_server: S3Server, shared_env: None) -> None:
    keys = make_keys(tmp_path / "keys")
    shared, aside = s3_server.new_bucket(), s3_server.new_bucket()
    d = make_node(tmp_path / "d", s3_server, shared, keys)
    d.run("pipeline", "import")
    e = copy_node(d, tmp_path / "e")  # d and e hold v1, the shared head
    claim_aside(d, shared, aside, SECOND_PIPELINE)
    claim_aside(e, shared, s3_server.new_bucket(), THIRD_PIPELINE)  # e's own v2, another document
    assert (d.snapshots / "manifest@v2.toml").read_bytes() != (e.snapshots / "manifest@v2.toml").read_bytes()
    view = BucketView(s3_server, shared)

    def race(what: str, version: int) -> None:  # e read head v1 and holds; d pushes its v2 whole
        assert push_control(d.root).pushed == (2,)

    with pytest.raises(ManifestVersionConflict, match="is claimed in the bucket by another push"):
        SyncedProject.at(e.root).push(snapshot_dir(e.root), step=race)
    assert view.head()[0] == b"2\n"
    assert view.get("manifest@v2.toml") == (d.snapshots / "manifest@v2.toml").read_bytes()
    assert view.get("receipt@v2.json") == (d.snapshots / "receipt@v2.json").read_bytes()
