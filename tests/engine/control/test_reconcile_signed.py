"""The reconciler of a project that syncs (``[sync]``): a signed control head served by a real loopback
control URL, adopted by real ``serve --cycle`` processes and a real ``serve`` daemon only when its
receipts verify under the node's pinned issuer keys and its snapshot validates here; the spec's
scenarios of section "reconcile".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config.parse import TOP_KEYS
from contextful.engine.control.receipts import KeySigner

from tests.engine.control.pulled import Chain, ControlServer, new_signer, project_text
from tests.engine.control.scenario import ControlProject, files_pipeline, serving
from tests.support.cli import contextful_in

pytestmark = pytest.mark.skipif("sync" not in TOP_KEYS, reason="a manifest reads [sync] once engine/config/sync.py "
                                                            "(helper sync) is merged")

SYNC = '\n[sync]\nbucket = "s3://control-bucket/shop"\n'
"""A [sync] block: the project signs its control (nothing here reads the bucket)."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControlServer]:
    with ControlServer(tmp_path / "published") as api:
        yield api


def synced_node(tmp_path: Path, server: ControlServer, *blocks: str, pins: tuple[KeySigner, ...] = (),
                control: str = "") -> ControlProject:
    """A node of project ``ctl`` that syncs, reading ``server``'s control URL, pinning ``pins`` in its
    ``[project] issuer_keys``."""
    node = ControlProject(tmp_path / "node")
    keys = ", ".join(f'"{p.signer}"' for p in pins)
    text = (f'[project]\nname = "ctl"\nissuer_keys = [{keys}]\n\n[control]\nurl = "{server.control_url}"\n{control}\n'
            + SYNC + "".join(blocks))
    (node.root / "contextful.toml").write_text(text)
    return node


def cycle(node: ControlProject, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    proc = contextful_in(None, "--project", str(node.root), "--json", "pipeline", "serve", "--cycle", env=env,
                         check=False)
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError as exc:
        raise AssertionError(f"cycle exit {proc.returncode}: {proc.stdout!r} {proc.stderr}") from exc


def local_files(node: ControlProject) -> dict[str, bytes]:
    directory = node.root / ".contextful" / "control" / "ctl"
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file() and p.name.startswith(
        ("manifest@", "receipt@"))} if directory.is_dir() else {}


@pytest.mark.clause("surface.reconcile.pulled-control", "surface.reconcile.issuer-pin")
def test_a_cold_node_installs_a_signed_head_that_validates_here_and_arms_its_schedules(
        tmp_path: Path, server: ControlServer) -> None:
    signer = new_signer()
    chain = Chain(server.directory, "ctl", signer)
    chain.publish(project_text("ctl", files_pipeline("orders", schedule=None)))
    chain.publish(project_text("ctl", files_pipeline("orders", schedule="every 1h")))
    node = synced_node(tmp_path, server, files_pipeline("orders"), pins=(signer,), control='poll = "every 1s"')
    node.rows("orders", 2)
    with serving(node) as daemon:
        daemon.wait_line(f"adopted v2 from {server.control_url} (receipts of v1..v2 verified)")
        daemon.wait_line("armed v2: 1 entry")
        daemon.wait_line("orders: ok")
        chain.publish(project_text("ctl", files_pipeline("orders", schedule="every 2h")))
        daemon.wait_line(f"adopted v3 from {server.control_url} (receipt of v3 verified)")
        daemon.wait_line("armed v3: 1 entry")
        assert daemon.stop() == 0
    files = local_files(node)
    assert files["receipt@v3.json"] == chain.receipts[2].to_bytes()
    assert files["manifest@v3.toml"] == (server.directory / "manifest@v3.toml").read_bytes()
    assert files["manifest@current"] == b"3\n"
    assert node.count("orders") == 2


@pytest.mark.clause("surface.reconcile.pulled-control")
def test_a_signed_head_declaring_one_of_two_local_pipelines_is_adopted_and_the_other_stays_unarmed(
        tmp_path: Path, server: ControlServer) -> None:
    signer = new_signer()
    Chain(server.directory, "ctl", signer).publish(project_text("ctl", files_pipeline("orders")))
    node = synced_node(tmp_path, server, files_pipeline("orders"), files_pipeline("returns"))
    node.rows("orders", 2)
    node.rows("returns", 3)
    # the pin read through CONTEXTFUL_ISSUER_PUBKEY, the pin source before [project] issuer_keys
    code, answer, err = cycle(node, env={"CONTEXTFUL_ISSUER_PUBKEY": signer.signer})
    assert code == 0, err
    assert answer["version"] == 1 and answer["fired"] == ["orders"] and answer["armed"] == 1
    assert node.count("orders") == 2
    with pytest.raises(Exception, match="returns"):
        node.count("returns")  # never armed, never landed


@pytest.mark.clause("surface.reconcile.pulled-control-untrusted")
def test_snapshot_bytes_replaced_without_a_matching_signature_arm_none_of_that_version(
        tmp_path: Path, server: ControlServer) -> None:
    signer = new_signer()
    chain = Chain(server.directory, "ctl", signer)
    chain.publish(project_text("ctl", files_pipeline("orders")))
    node = synced_node(tmp_path, server, files_pipeline("orders"), files_pipeline("returns"), pins=(signer,))
    node.rows("orders", 2)
    node.rows("returns", 3)
    code, answer, err = cycle(node)
    assert code == 0 and answer["version"] == 1, err
    chain.publish(project_text("ctl", files_pipeline("orders"), files_pipeline("returns")))
    # a bucket writer replaces v2's bytes; its receipt still signs the bytes the issuer applied
    (server.directory / "manifest@v2.toml").write_text(project_text("ctl", files_pipeline("returns")))
    before = local_files(node)
    code, answer, err = cycle(node)
    assert code == 0, err
    assert f"error: poll of {server.control_url} failed: ControlSnapshotUntrusted: {server.control_url}/" \
           "receipt@v2.json: untrusted: the snapshot's digest is not the one its receipt signs" in err
    assert answer["version"] == 1 and answer["armed"] == 1 and answer["fired"] == []
    assert local_files(node) == before
    with pytest.raises(Exception, match="returns"):
        node.count("returns")


@pytest.mark.clause("surface.reconcile.issuer-pin", "surface.reconcile.pulled-control-untrusted")
def test_a_head_signed_by_a_key_the_node_does_not_pin_is_refused(tmp_path: Path, server: ControlServer) -> None:
    signer, stranger = new_signer(), new_signer()
    Chain(server.directory, "ctl", stranger).publish(project_text("ctl", files_pipeline("orders")))
    node = synced_node(tmp_path, server, files_pipeline("orders"), pins=(signer,))
    node.rows("orders", 1)
    proc = contextful_in(None, "--project", str(node.root), "pipeline", "serve", "--cycle", check=False)
    assert proc.returncode == 5 and "StoreNotInitialized" in proc.stderr  # nothing adopted, nothing to run
    assert f"its signer {stranger.signer} is not a pinned issuer key" in proc.stderr
    assert local_files(node) == {}
