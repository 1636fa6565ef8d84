"""Tampering with a pulled signed chain, generated (hypothesis): whatever byte of the head's snapshot,
a receipt or the pointer is flipped, whichever link is dropped or reordered and whoever re-signs,
adoption refuses, and the node's snapshot directory is byte-for-byte what it was.

One chain of three versions is published once per module in a directory the node reads
(``DirectorySource``, the layout a control URL serves unchanged); the node holds v1. Each example
tampers with a copy of the published directory.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from contextful.engine.control.adopt import Adoption, adopt, node_validation
from contextful.engine.control.credentials import IssuerKey
from contextful.engine.control.receipts import KeySigner, parse_receipt, sign_receipt
from contextful.engine.control.snapshots import SnapshotDir
from contextful.engine.control.source import DirectorySource
from contextful.storage.errors import (
    ControlPointerMalformed,
    ControlSnapshotUnreadable,
    ControlSnapshotUntrusted,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.control.pulled import Chain, new_signer, pin_of, project_text
from tests.engine.control.scenario import files_pipeline

EXAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SIGNED = ("manifest@v3.toml", "receipt@v2.json", "receipt@v3.json")
"""What the adoption of v3 over v1 reads and verifies: the head's snapshot and the receipts after v1."""


@dataclass
class World:
    published: Path
    """The genuine chain (never changed)."""
    node: Path
    """The node's project directory; its snapshot directory holds v1."""
    signer: KeySigner
    pins: tuple[IssuerKey, ...]
    count: int = 0

    def scratch(self) -> Path:
        """A fresh copy of the published chain to tamper with."""
        self.count += 1
        copy = self.published.parent / f"tampered-{self.count}"
        shutil.copytree(self.published, copy)
        return copy

    @property
    def snapshots(self) -> SnapshotDir:
        return SnapshotDir(str(self.node / ".contextful" / "control" / "ctl"), "ctl")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    base = tmp_path_factory.mktemp("tamper")
    signer = new_signer()
    chain = Chain(base / "published", "ctl", signer)
    texts = [project_text("ctl", files_pipeline("orders")),
             project_text("ctl", files_pipeline("orders"), files_pipeline("returns")),
             project_text("ctl", files_pipeline("returns"))]
    node = base / "node"
    node.mkdir()
    (node / "contextful.toml").write_text(texts[0])
    found = World(base / "published", node, signer, (pin_of(signer),))
    chain.publish(texts[0])
    assert adopt_from(found, chain.directory).installed == 1
    for text in texts[1:]:
        chain.publish(text)
    return found


def adopt_from(world: World, directory: Path) -> Adoption:
    return adopt(DirectorySource(directory), world.snapshots, project="ctl", pins=world.pins, signed=True,
                 validate=node_validation(world.node))


def held(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def refused(world: World, tamper: Callable[[Path], None],
            allowed: tuple[type[Exception], ...] = (ControlSnapshotUntrusted,)) -> Exception:
    """Tamper with a copy of the chain; adopting it raises one of ``allowed`` and writes nothing."""
    copy = world.scratch()
    tamper(copy)
    before = held(world.snapshots.path)
    with pytest.raises(allowed) as info:
        adopt_from(world, copy)
    assert held(world.snapshots.path) == before
    return info.value


@pytest.mark.clause("surface.reconcile.pulled-control-untrusted")
@EXAMPLES
@given(name=st.sampled_from(SIGNED), at=st.integers(min_value=0), xor=st.integers(min_value=1, max_value=255))
def test_any_flipped_byte_of_the_head_or_a_receipt_is_refused(world: World, name: str, at: int, xor: int) -> None:
    def flip(copy: Path) -> None:
        data = bytearray((copy / name).read_bytes())
        data[at % len(data)] ^= xor
        (copy / name).write_bytes(bytes(data))

    refused(world, flip)


@pytest.mark.clause("surface.reconcile.pointer-malformed")
@EXAMPLES
@given(at=st.integers(min_value=0, max_value=1), xor=st.integers(min_value=1, max_value=255))
def test_a_flipped_pointer_is_refused_unless_it_still_names_a_genuine_version(world: World, at: int, xor: int) -> None:
    body = bytearray(b"3\n")
    body[at] ^= xor
    if bytes(body) in (b"1\n", b"2\n"):  # still wholly a version of the chain: adopting it is right
        copy = world.scratch()
        (copy / "manifest@current").write_bytes(bytes(body))
        local = world.snapshots.path
        kept = held(local)
        try:
            outcome = adopt_from(world, copy)
            named = int(body.decode())
            assert outcome.installed == (named if named > 1 else None)
            if named > 1:
                assert (local / f"manifest@v{named}.toml").read_bytes() == \
                    (world.published / f"manifest@v{named}.toml").read_bytes()
        finally:  # back to the node holding v1
            for path in local.iterdir():
                if path.is_file() and path.name not in kept:
                    path.unlink()
            (local / "manifest@current").write_bytes(kept["manifest@current"])
        return
    refused(world, lambda copy: (copy / "manifest@current").write_bytes(bytes(body)),
            (ControlPointerMalformed, ControlSnapshotUnreadable, ControlSnapshotUntrusted))


def _swap(first: str, second: str) -> Callable[[Path], None]:
    def swap(copy: Path) -> None:
        a, b = (copy / first).read_bytes(), (copy / second).read_bytes()
        (copy / first).write_bytes(b)
        (copy / second).write_bytes(a)

    return swap


def _drop(name: str) -> Callable[[Path], None]:
    return lambda copy: (copy / name).unlink()


def _resign(*versions: int) -> Callable[[Path], None]:
    """Versions ``versions`` re-signed by another key, each over its true parent and snapshot."""

    def resign(copy: Path) -> None:
        other = new_signer()
        for version in versions:
            receipt = parse_receipt((copy / f"receipt@v{version}.json").read_bytes(), "x")
            parent = None if receipt.parent == "-" else receipt.parent
            forged = sign_receipt(other, "ctl", version, parent, (copy / f"manifest@v{version}.toml").read_bytes())
            (copy / f"receipt@v{version}.json").write_bytes(forged.to_bytes())

    return resign


@pytest.mark.clause("surface.reconcile.pulled-control-untrusted", "surface.reconcile.issuer-pin")
@pytest.mark.parametrize("how", ["swap receipts", "swap head snapshot", "drop receipt v2", "drop receipt v3",
                                 "resign v2", "resign v3", "resign all", "drop head snapshot"])
def test_a_reordered_dropped_or_resigned_link_is_refused(world: World, how: str) -> None:
    tamper: Callable[[Path], None] = {
        "swap receipts": _swap("receipt@v2.json", "receipt@v3.json"),
        "swap head snapshot": _swap("manifest@v2.toml", "manifest@v3.toml"),
        "drop receipt v2": _drop("receipt@v2.json"),
        "drop receipt v3": _drop("receipt@v3.json"),
        "resign v2": _resign(2),
        "resign v3": _resign(3),
        "resign all": _resign(1, 2, 3),
        "drop head snapshot": _drop("manifest@v3.toml"),
    }[how]
    allowed = (ControlSnapshotUnreadable,) if how == "drop head snapshot" else (ControlSnapshotUntrusted,)
    error = refused(world, tamper, allowed)
    if how.startswith("resign"):
        assert "is not a pinned issuer key" in str(error)
    if how == "drop head snapshot":
        assert not isinstance(error, ControlSnapshotUntrusted)
