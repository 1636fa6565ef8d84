"""A synced node without a control URL polls its ``[sync]`` bucket (``surface.reconcile.learns-by-reading``,
``pulled-control``; docs/control.md "The control source").

Two project directories share one bucket on the test session's S3-compatible server; every command
is a real ``contextful`` child process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.control.test_apply import SECOND_PIPELINE
from tests.engine.control.test_sync import make_keys, make_node
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.s3


@pytest.mark.clause("surface.reconcile.learns-by-reading", "surface.reconcile.pulled-control")
def test_a_synced_node_learns_another_nodes_version_by_reading_its_bucket(tmp_path: Path,
                                                                           s3_server: S3Server) -> None:
    keys, bucket = make_keys(tmp_path / "keys"), s3_server.new_bucket()
    east = make_node(tmp_path / "east", s3_server, bucket, keys)
    east.run("pipeline", "import")
    west = make_node(tmp_path / "west", s3_server, bucket, keys)
    west.run("pipeline", "import")  # adopts v1 from the bucket
    assert (west.snapshots / "manifest@current").read_text() == "1\n"
    east.write(east.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    east.run("pipeline", "apply")  # v2, published to the bucket; nothing is sent to west
    assert (west.snapshots / "manifest@current").read_text() == "1\n"
    cycle = west.run("--json", "pipeline", "serve", "--cycle")
    assert json.loads(cycle.stdout)["version"] == 2, cycle.stderr
    assert "adopted v2 from s3://" in cycle.stderr and "(receipt of v2 verified)" in cycle.stderr
    assert (west.snapshots / "manifest@v2.toml").read_bytes() == (east.snapshots / "manifest@v2.toml").read_bytes()
    # and the next version too, on the next read: its receipt's parent is v2's, verified again
    east.write(east.root.joinpath("contextful.toml").read_text().replace("raw/orders", "raw/orders2"))
    east.run("pipeline", "apply")
    cycle = west.run("--json", "pipeline", "serve", "--cycle")
    assert json.loads(cycle.stdout)["version"] == 3, cycle.stderr
    assert "adopted v3 from s3://" in cycle.stderr
