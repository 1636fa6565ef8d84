"""Adopting a pulled control head (``engine.control.adopt``) through its public API, read from a real
loopback control URL or a snapshot directory: what is installed, and what is refused with nothing
written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from contextful.engine.control.adopt import Adoption, adopt, node_pins, node_validation
from contextful.engine.control.apply import load_applied
from contextful.engine.control.credentials import IssuerKey
from contextful.engine.control.receipts import parse_receipt
from contextful.engine.control.snapshots import SnapshotDir
from contextful.engine.control.source import DirectorySource, UrlSource
from contextful.storage.errors import (
    ControlPointerMalformed,
    ControlSnapshotUnreadable,
    ControlSnapshotUntrusted,
    ControlSourceNotLoopback,
)

from tests.engine.control.pulled import Chain, ControlServer, new_signer, pin_of, project_text
from tests.engine.control.scenario import files_pipeline
from tests.support.http_api import Reply

ORDERS = files_pipeline("orders")
RETURNS = files_pipeline("returns")


def held(directory: Path) -> dict[str, bytes]:
    """Every file of a snapshot directory with its bytes (empty when it does not exist)."""
    if not directory.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


class Node:
    """A project directory pulling from a control source: its working manifest and snapshot directory."""

    def __init__(self, root: Path, name: str = "ctl") -> None:
        self.root = root
        self.name = name
        root.mkdir(parents=True, exist_ok=True)
        (root / "contextful.toml").write_text(project_text(name, ORDERS))
        self.snapshots = SnapshotDir(str(root / ".contextful" / "control" / name), name)

    def adopt(self, source: DirectorySource | UrlSource, pins: tuple[IssuerKey, ...], *, signed: bool = True) -> Adoption:
        return adopt(source, self.snapshots, project=self.name, pins=pins, signed=signed,
                     validate=node_validation(self.root))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControlServer]:
    with ControlServer(tmp_path / "published") as api:
        yield api


@pytest.mark.clause("surface.reconcile.pulled-control", "surface.reconcile.url-layout")
def test_a_cold_node_installs_a_signed_head_over_a_control_url_and_then_its_successors(
        tmp_path: Path, server: ControlServer) -> None:
    signer = new_signer()
    chain = Chain(server.directory, "ctl", signer)
    node = Node(tmp_path / "node")
    source = UrlSource(server.control_url)
    assert node.adopt(source, (pin_of(signer),)) == Adoption(None, None)  # pointer 404: no applied version
    assert held(node.snapshots.path) == {}
    chain.publish(project_text("ctl", ORDERS))
    chain.publish(project_text("ctl", ORDERS, RETURNS))
    adopted = node.adopt(source, (pin_of(signer),))
    assert adopted == Adoption(2, None, 2, (1, 2))
    files = held(node.snapshots.path)
    assert files["manifest@v2.toml"] == (server.directory / "manifest@v2.toml").read_bytes()
    assert files["receipt@v2.json"] == chain.receipts[1].to_bytes()
    assert files["manifest@current"] == b"2\n" and "manifest@v1.toml" not in files  # the head alone is read
    applied = load_applied(node.root)
    assert applied is not None and [p.id for p in applied.manifest.pipelines] == ["orders", "returns"]
    assert [r.path for r in server.requests].count("/control/manifest@v1.toml") == 0
    assert node.adopt(source, (pin_of(signer),)) == Adoption(2, 2)  # nothing new
    chain.publish(project_text("ctl", RETURNS))
    assert node.adopt(source, (pin_of(signer),)) == Adoption(3, 2, 3, (3,))  # descends from the local head
    assert parse_receipt((node.snapshots.path / "receipt@v3.json").read_bytes(), "x").parent == \
        chain.receipts[1].digest()


def forged(tmp_path: Path, how: str) -> tuple[Chain, tuple[IssuerKey, ...], str]:
    """A two-version chain whose second version is forged ``how``; the pins and the reason expected."""
    signer = new_signer()
    chain = Chain(tmp_path / "published", "ctl", signer)
    chain.publish(project_text("ctl", ORDERS))
    pins = (pin_of(signer),)
    second = project_text("ctl", ORDERS, RETURNS)
    if how == "signer":
        chain.publish(second, signer=new_signer())
        return chain, pins, "is not a pinned issuer key"
    if how == "snapshot":
        chain.publish(second)
        (chain.directory / "manifest@v2.toml").write_text(project_text("ctl", RETURNS))  # bytes replaced
        return chain, pins, "the snapshot's digest is not the one its receipt signs"
    if how == "signature":
        chain.publish(second)
        path = chain.directory / "receipt@v2.json"
        path.write_bytes(path.read_bytes().replace(b'"version":2', b'"version":3'))
        return chain, pins, "its signature does not verify"
    if how == "project":
        chain.publish(second, project="other")
        return chain, pins, "it is project 'other''s, not 'ctl''s"
    if how == "predecessor":
        chain.publish(second, parent="0" * 64)
        return chain, pins, "its predecessor is not the receipt before it"
    if how == "validation":
        chain.publish(second + '\n[[pipeline]]\nid = "orders"\n[pipeline.source]\nkind = "files"\n'
                               '[pipeline.source.config]\npaths = ["x/*.ndjson"]\n')
        return chain, pins, "it does not validate against this node's declarations"
    if how == "named":
        chain.publish(project_text("elsewhere", ORDERS))
        return chain, pins, "it is project 'elsewhere''s snapshot, not 'ctl''s"
    if how == "dropped":
        chain.publish(second)
        chain.publish(second + "\n")
        (chain.directory / "receipt@v2.json").unlink()
        return chain, pins, "the chain is broken: the source holds no receipt of v2"
    raise AssertionError(how)


@pytest.mark.clause("surface.reconcile.pulled-control-untrusted", "surface.reconcile.issuer-pin")
@pytest.mark.parametrize("how", ["signer", "snapshot", "signature", "project", "predecessor", "validation", "named",
                                 "dropped"])
def test_an_untrusted_head_names_its_reason_and_installs_nothing_of_it(tmp_path: Path, how: str) -> None:
    chain, pins, reason = forged(tmp_path, how)
    node = Node(tmp_path / "node")
    (chain.directory / "manifest@current").write_text("1\n")
    assert node.adopt(DirectorySource(chain.directory), pins).installed == 1  # the genuine first version
    (chain.directory / "manifest@current").write_text(f"{chain.head}\n")
    before = held(node.snapshots.path)
    with pytest.raises(ControlSnapshotUntrusted) as refused:
        node.adopt(DirectorySource(chain.directory), pins)
    assert reason in refused.value.reason, refused.value.reason
    assert str(chain.directory) in refused.value.location
    assert held(node.snapshots.path) == before
    assert node.snapshots.applied() == 1


@pytest.mark.clause("surface.reconcile.issuer-pin")
def test_receipts_are_verified_under_the_nodes_pinned_issuers_and_the_callers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    signer, other = new_signer(), new_signer()
    chain = Chain(tmp_path / "published", "ctl", signer)
    chain.publish(project_text("ctl", ORDERS))
    node = Node(tmp_path / "node")
    monkeypatch.delenv("CONTEXTFUL_ISSUER_PUBKEY", raising=False)
    assert node_pins(node.root) == ()
    with pytest.raises(ControlSnapshotUntrusted, match="is not a pinned issuer key"):
        node.adopt(DirectorySource(chain.directory), node_pins(node.root, (pin_of(other),)))
    (node.root / "contextful.toml").write_text(project_text("ctl", ORDERS).replace(
        '[project]\nname = "ctl"\n', f'[project]\nname = "ctl"\nissuer_keys = ["{signer.signer}"]\n'))
    assert [p.text for p in node_pins(node.root)] == [signer.signer]
    assert node.adopt(DirectorySource(chain.directory), node_pins(node.root)).installed == 1


def test_an_unsigned_source_is_adopted_only_while_it_holds_the_local_head_as_it_is_here(
        tmp_path: Path, server: ControlServer) -> None:
    chain = Chain(server.directory, "ctl", None)
    chain.publish(project_text("ctl", ORDERS))
    node = Node(tmp_path / "node")
    source = UrlSource(server.control_url)
    assert node.adopt(source, (), signed=False) == Adoption(1, None, 1)
    chain.publish(project_text("ctl", ORDERS, RETURNS))
    assert node.adopt(source, (), signed=False) == Adoption(2, 1, 2)
    (server.directory / "manifest@v2.toml").write_text(project_text("ctl", RETURNS))  # the source forked
    chain.publish(project_text("ctl", ORDERS))
    before = held(node.snapshots.path)
    with pytest.raises(ControlSnapshotUntrusted, match="does not descend from the local head v2"):
        node.adopt(source, (), signed=False)
    assert held(node.snapshots.path) == before


@pytest.mark.clause("surface.reconcile.pointer-malformed", "surface.reconcile.url-layout",
                    "surface.reconcile.fail-static")
def test_a_control_urls_pointer_must_be_wholly_a_version_and_anything_but_200_or_404_is_unreadable(
        tmp_path: Path, server: ControlServer) -> None:
    signer = new_signer()
    chain = Chain(server.directory, "ctl", signer)
    chain.publish(project_text("ctl", ORDERS))
    node = Node(tmp_path / "node")
    source = UrlSource(server.control_url + "/")
    for body in (b"1x\n", b" 1\n", b"01\n", b"1\n\n", b"-1\n", b"0\n", b"", b"\xff"):
        server.fault = lambda name, body=body: Reply(200, body) if name == "manifest@current" else None
        with pytest.raises(ControlPointerMalformed) as malformed:
            node.adopt(source, (pin_of(signer),))
        assert malformed.value.location == f"{server.control_url}/manifest@current"
    for status in (500, 503, 302, 401, 204):
        server.fault = lambda name, status=status: Reply(status, b"", {"Location": "/control/elsewhere"}) \
            if name == "manifest@current" else None
        with pytest.raises(ControlSnapshotUnreadable) as unreadable:
            node.adopt(source, (pin_of(signer),))
        assert f"HTTP {status}" in unreadable.value.reason
    assert not [r for r in server.requests if r.path == "/control/elsewhere"]  # no redirect followed
    server.fault = lambda name: Reply(500, b"") if name == "manifest@v1.toml" else None
    with pytest.raises(ControlSnapshotUnreadable, match="HTTP 500"):
        node.adopt(source, (pin_of(signer),))
    server.fault = lambda name: Reply(200, b"\xff\xfe not toml") if name == "manifest@v1.toml" else None
    with pytest.raises(ControlSnapshotUntrusted, match="digest"):  # signed: the digest fails before the parse
        node.adopt(source, (pin_of(signer),))
    assert held(node.snapshots.path) == {}
    server.fault = None
    assert node.adopt(source, (pin_of(signer),)).installed == 1


def test_an_unparseable_unsigned_snapshot_is_unreadable(tmp_path: Path, server: ControlServer) -> None:
    node = Node(tmp_path / "node")
    (server.directory).mkdir(parents=True, exist_ok=True)
    (server.directory / "manifest@current").write_text("1\n")
    (server.directory / "manifest@v1.toml").write_bytes(b"[[pipeline]\n")
    with pytest.raises(ControlSnapshotUnreadable, match="not UTF-8 TOML"):
        node.adopt(UrlSource(server.control_url), (), signed=False)
    assert held(node.snapshots.path) == {}


@pytest.mark.clause("surface.reconcile.loopback-only")
def test_a_control_url_whose_host_is_not_loopback_is_refused_before_anything_is_sent() -> None:
    for url in ("http://192.0.2.7:8787/control", "http://example.com/control", "http://10.0.0.1/c"):
        with pytest.raises(ControlSourceNotLoopback) as refused:
            UrlSource(url)
        assert refused.value.url == url
    for url in ("http://127.0.0.1:1/c", "http://localhost:1/c", "http://[::1]:1/c", "http://127.9.9.9/c"):
        assert UrlSource(url).location == url
