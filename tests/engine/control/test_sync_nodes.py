"""Two synced nodes converge: applying on one while the other pulls, turn about, through one bucket
and one PostgreSQL catalog (docs/control.md "Synced control").

Each node is a project directory with a store directory of its own, under the container profile
(one PostgreSQL catalog, one corpus bucket) and one ``[sync]`` bucket (moto on loopback). Each step
starts an apply on one node and a pull on the other at one barrier, as real child processes; after
it the puller pulls again. At the end both apply one version, no version was overwritten anywhere,
and the bucket's receipt chain verifies from the head down to v1.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from tests.engine.control.test_sync import BucketView, Node, make_keys, make_node, sha256, signature_holds
from tests.engine.land.test_reconnect import postgres_env, provisioned
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.s3, pytest.mark.postgres]

STEPS = 4


def pipeline(n: int) -> str:
    return f'\n[[pipeline]]\nid = "p{n}"\nsource = {{ kind = "files", config = {{ paths = ["raw/p{n}/*.ndjson"] }} }}\n'


def applied(node: Node) -> int:
    return int((node.snapshots / "manifest@current").read_text())


def held(node: Node) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in node.snapshots.glob("*@v*")}


def at_once(calls: list[tuple[Node, tuple[str, ...]]]) -> list[Any]:
    """Run each command in a thread of its own, all released at one barrier; their completed processes."""
    barrier, answers = threading.Barrier(len(calls), timeout=120), [None] * len(calls)

    def run(index: int, node: Node, args: tuple[str, ...]) -> None:
        barrier.wait()
        answers[index] = node.run(*args)

    threads = [threading.Thread(target=run, args=(i, node, args)) for i, (node, args) in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return answers


def test_two_nodes_applying_and_pulling_at_once_converge_on_one_signed_chain(
        tmp_path: Path, s3_server: S3Server, pg_dsn: str, pg_schema: str) -> None:
    keys, control = make_keys(tmp_path / "keys"), s3_server.new_bucket()
    nodes = [make_node(tmp_path / name, s3_server, control, keys) for name in ("east", "west")]
    corpus = provisioned(nodes[0].root, pg_dsn, pg_schema, s3_server)
    for node in nodes:
        node.env = postgres_env(pg_dsn, pg_schema, f"cf-sync-{node.root.name}", s3_server, corpus) | node.env
    east, west = nodes
    assert east.run("pipeline", "import").stdout == "claimed v1 (applied)\n"
    assert west.run("control", "pull").stdout == "adopted v1 (applied)\n"

    seen: dict[str, bytes] = dict(held(east))
    for step in range(1, STEPS + 1):
        applier, puller = (east, west) if step % 2 else (west, east)
        applier.write(_document(applier, step))
        answers = at_once([(applier, ("pipeline", "apply")), (puller, ("control", "pull"))])
        assert answers[0].stdout == f"claimed v{step + 1} (applied)\n"
        assert answers[1].stdout in (f"adopted v{step + 1} (applied)\n",
                                          f"nothing to pull: the bucket head is v{step}, this node's is v{step}\n")
        puller.run("control", "pull")
        assert applied(puller) == applied(applier) == step + 1
        for node in nodes:  # no version is ever rewritten, on either node
            for name, data in held(node).items():
                assert seen.setdefault(name, data) == data, name

    view = BucketView(s3_server, control)
    body, meta = view.head()
    assert body == f"{STEPS + 1}\n".encode()
    digest = meta["receipt"]
    for version in range(STEPS + 1, 0, -1):  # the chain from the head down to v1
        data = view.get(f"receipt@v{version}.json")
        receipt: dict[str, Any] = json.loads(data)
        assert sha256(data) == digest and data == rfc8785.dumps(receipt) and signature_holds(receipt)
        assert receipt["version"] == version and receipt["snapshot"] == sha256(view.get(f"manifest@v{version}.toml"))
        assert seen[f"receipt@v{version}.json"] == data
        digest = receipt["parent"]
    assert digest == "-"


def _document(node: Node, step: int) -> str:
    """The node's working document declaring pipelines p1..p<step> besides BASE's (its [project] and [sync] kept)."""
    text = node.root.joinpath("contextful.toml").read_text()
    head, sync = text.split("\n[sync]\n", 1)
    head = head.split("\n[[pipeline]]\nid = \"p1\"")[0]
    return head + "".join(pipeline(n) for n in range(1, step + 1)) + "\n[sync]\n" + sync
