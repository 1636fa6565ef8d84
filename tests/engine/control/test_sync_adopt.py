"""A cold node joins the bucket's signed chain instead of claiming a fresh v1, and a warm node
restarts through pull, import, apply and push (surface.apply.adopt-before-claim, guarded-import).

Through the command: each node is a project directory of its own syncing through one bucket (moto
on loopback); a cold node's snapshot directory holds no version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.control.test_apply import SECOND_PIPELINE, one_error
from tests.engine.control.test_sync import (
    BucketView,
    Node,
    make_keys,
    make_node,
    sha256,
    signature_holds,
)
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.s3

THIRD_PIPELINE = SECOND_PIPELINE.replace("orders", "refunds")

SCHEDULED = """\
[project]
name = "shop"

[[pipeline]]
id = "events"
source = { kind = "files", config = { paths = ["raw/*.ndjson"] } }
schedule = "every 10m"

[[pipeline]]
id = "orders"
source = { kind = "files", config = { paths = ["raw/orders/*.ndjson"] } }
schedule = "every 10m"

[[model]]
name = "daily"
sql = "SELECT count(*) AS n FROM events"

[[job]]
name = "build_daily"
kind = "build"
after = "events"
target = ["daily"]

[[model]]
name = "order_counts"
sql = "SELECT count(*) AS n FROM orders"

[[job]]
name = "build_orders"
kind = "build"
after = "orders"
target = ["order_counts"]
"""

WITHOUT_ORDERS = SCHEDULED.split("\n[[pipeline]]\nid = \"orders\"")[0] + "\n" + \
    SCHEDULED.split('schedule = "every 10m"\n', 2)[2].split("\n[[model]]\nname = \"order_counts\"")[0]


def adopted(line: str, version: int) -> bool:
    return line == f"adopted v{version} from the bucket (applied); import claims nothing\n"


def bucket_head(node: Node) -> tuple[bytes, dict[str, str]]:
    return BucketView(node.s3, node.bucket).head()


@pytest.mark.clause("surface.apply.adopt-before-claim")
def test_a_cold_node_adopts_the_signed_head_and_its_apply_claims_the_heads_successor_and_pushes(
        tmp_path: Path, s3_server: S3Server) -> None:
    keys = make_keys(tmp_path / "keys")
    bucket = s3_server.new_bucket()
    warm = make_node(tmp_path / "warm", s3_server, bucket, keys)
    warm.run("pipeline", "import")
    warm.write(warm.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    warm.run("pipeline", "apply")  # the bucket head: v2

    cold = make_node(tmp_path / "cold", s3_server, bucket, keys)  # declares only events
    assert cold.run("control", "pull").stdout == "adopted v2 (applied)\n"
    assert cold.run("pipeline", "import").stdout == "v2 is applied already; import claims nothing\n"
    for name in ("manifest@v2.toml", "receipt@v2.json"):
        assert (cold.snapshots / name).read_bytes() == (warm.snapshots / name).read_bytes()
    assert not (cold.snapshots / "manifest@v1.toml").exists()  # it joined the chain; it claimed no v1

    cold.write(warm.root.joinpath("contextful.toml").read_text() + THIRD_PIPELINE)  # one added pipeline
    assert cold.run("pipeline", "apply").stdout == "claimed v3 (applied)\n"
    third = json.loads((cold.snapshots / "receipt@v3.json").read_bytes())
    assert third["parent"] == sha256((warm.snapshots / "receipt@v2.json").read_bytes()) and signature_holds(third)
    body, meta = bucket_head(cold)  # and pushed it
    assert body == b"3\n" and meta["receipt"] == sha256((cold.snapshots / "receipt@v3.json").read_bytes())

    colder = make_node(tmp_path / "colder", s3_server, bucket, keys)  # import alone adopts too, and claims nothing
    assert adopted(colder.run("pipeline", "import").stdout, 3)
    assert (colder.snapshots / "manifest@current").read_text() == "3\n"
    assert sorted(p.name for p in colder.snapshots.glob("*@v*")) == ["manifest@v3.toml", "receipt@v3.json"]
    assert bucket_head(colder)[0] == b"3\n"


def test_a_synced_apply_adopts_a_newer_head_before_it_claims(tmp_path: Path, s3_server: S3Server) -> None:
    keys, bucket = make_keys(tmp_path / "keys"), s3_server.new_bucket()
    east = make_node(tmp_path / "east", s3_server, bucket, keys)
    east.run("pipeline", "import")
    west = make_node(tmp_path / "west", s3_server, bucket, keys)
    assert adopted(west.run("pipeline", "import").stdout, 1)
    east.write(east.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    east.run("pipeline", "apply")  # the bucket head: v2, which west has not pulled
    west.write(east.root.joinpath("contextful.toml").read_text() + THIRD_PIPELINE)
    assert west.run("pipeline", "apply").stdout == "claimed v3 (applied)\n"
    assert (west.snapshots / "manifest@v2.toml").read_bytes() == (east.snapshots / "manifest@v2.toml").read_bytes()
    third = json.loads((west.snapshots / "receipt@v3.json").read_bytes())
    assert third["parent"] == sha256((east.snapshots / "receipt@v2.json").read_bytes())
    assert bucket_head(west)[0] == b"3\n"


@pytest.mark.clause("surface.apply.receipt-digest")
def test_a_pull_refuses_a_head_naming_another_receipt_digest(tmp_path: Path, s3_server: S3Server) -> None:
    keys = make_keys(tmp_path / "keys")
    warm = make_node(tmp_path / "warm", s3_server, s3_server.new_bucket(), keys)
    warm.run("pipeline", "import")
    view = BucketView(s3_server, warm.bucket)
    body, meta = view.head()
    view.put("manifest@current", body, meta | {"receipt": sha256(b"another receipt")})  # a bucket writer's edit
    cold = make_node(tmp_path / "cold", s3_server, warm.bucket, keys)
    line = one_error(cold.run("control", "pull", check=False), "ControlSnapshotUntrusted", 9)
    assert "receipt@v1.json" in line and "its digest is not the one the bucket head names" in line
    assert not cold.snapshots.exists() or not list(cold.snapshots.glob("*@*"))
    view.put("manifest@current", body, meta)  # the head as pushed is adopted
    assert cold.run("control", "pull").stdout == "adopted v1 (applied)\n"


@pytest.mark.clause("surface.apply.adopt-before-claim")
def test_a_cold_node_adopts_a_head_only_under_the_verbs_public_key(
        tmp_path: Path, s3_server: S3Server) -> None:
    keys = make_keys(tmp_path / "keys")
    bucket = s3_server.new_bucket()
    make_node(tmp_path / "warm", s3_server, bucket, keys).run("pipeline", "import")  # signed by keys
    own = make_keys(tmp_path / "own-keys")
    cold = make_node(tmp_path / "cold", s3_server, bucket, own)  # pins and signs with its own issuer key alone
    line = one_error(cold.run("pipeline", "import", check=False), "ControlSnapshotUntrusted", 9)
    assert "its signer" in line and "is not a pinned issuer key" in line
    assert not cold.snapshots.exists() or not list(cold.snapshots.glob("manifest@*"))
    assert adopted(cold.run("pipeline", "import", "--public-key", keys.pin).stdout, 1)
    cold.write(cold.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    assert cold.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"  # signed with its own key
    assert json.loads((cold.snapshots / "receipt@v2.json").read_bytes())["signer"] == own.pin


@pytest.mark.clause("surface.apply.adopt-before-claim")
def test_a_cold_node_adopts_the_old_head_when_a_release_changes_only_the_schedules_a_build_job_runs_after(
        tmp_path: Path, s3_server: S3Server) -> None:
    keys = make_keys(tmp_path / "keys")
    bucket = s3_server.new_bucket()
    make_node(tmp_path / "old", s3_server, bucket, keys, SCHEDULED).run("pipeline", "import")
    release = SCHEDULED.replace('schedule = "every 10m"', 'schedule = "every 15m"')
    cold = make_node(tmp_path / "cold", s3_server, bucket, keys, release)
    assert adopted(cold.run("pipeline", "import").stdout, 1)
    assert 'schedule = "every 10m"' in (cold.snapshots / "manifest@v1.toml").read_text()
    assert cold.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"
    assert 'schedule = "every 15m"' in (cold.snapshots / "manifest@v2.toml").read_text()
    assert bucket_head(cold)[0] == b"2\n"


@pytest.mark.clause("surface.apply.adopt-before-claim")
def test_a_release_removing_a_pipeline_with_its_build_job_is_adopted_claimed_and_adopted_again(
        tmp_path: Path, s3_server: S3Server) -> None:
    keys = make_keys(tmp_path / "keys")
    assert "orders" not in WITHOUT_ORDERS and "build_daily" in WITHOUT_ORDERS
    bucket = s3_server.new_bucket()
    make_node(tmp_path / "old", s3_server, bucket, keys, SCHEDULED).run("pipeline", "import")
    cold = make_node(tmp_path / "cold", s3_server, bucket, keys, WITHOUT_ORDERS)
    assert adopted(cold.run("pipeline", "import").stdout, 1)  # the head's build_orders runs after its own orders
    assert "build_orders" in (cold.snapshots / "manifest@v1.toml").read_text()
    assert cold.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"
    assert "orders" not in (cold.snapshots / "manifest@v2.toml").read_text().split("[snapshot")[0]
    next_cold = make_node(tmp_path / "next", s3_server, bucket, keys, WITHOUT_ORDERS)
    assert adopted(next_cold.run("pipeline", "import").stdout, 2)
    assert (next_cold.snapshots / "manifest@v2.toml").read_bytes() == (cold.snapshots / "manifest@v2.toml").read_bytes()


@pytest.mark.clause("surface.apply.guarded-import")
def test_a_warm_synced_node_restarts_through_pull_import_apply_and_push(tmp_path: Path, s3_server: S3Server) -> None:
    node = make_node(tmp_path / "shop", s3_server, s3_server.new_bucket(), make_keys(tmp_path / "keys"))
    node.run("pipeline", "import")
    node.write(node.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    node.run("pipeline", "apply")
    before = {p.name: p.read_bytes() for p in node.snapshots.iterdir()}
    head = bucket_head(node)
    assert node.run("control", "pull").stdout == "nothing to pull: the bucket head is v2, this node's is v2\n"
    assert node.run("pipeline", "import").stdout == "v2 is applied already; import claims nothing\n"
    assert node.run("pipeline", "apply").stdout == "unchanged: v2 is applied\n"
    assert node.run("control", "push").stdout == \
        "nothing to push: the bucket head is v2, this node's applied version\n"
    assert {p.name: p.read_bytes() for p in node.snapshots.iterdir()} == before
    assert bucket_head(node) == head
