"""Pulled control chains for tests: a publisher writing the control-source layout as a synced apply
does, and a real loopback control URL serving such a directory.

:class:`Chain` writes ``manifest@v<N>.toml``, ``receipt@v<N>.json`` (signed with a real Ed25519
key through ``engine.control.receipts``) and ``manifest@current`` into a directory;
:class:`ControlServer` is a ``ThreadingHTTPServer`` on 127.0.0.1 serving that directory's files
directly beneath ``/control/`` (404 for an absent file), or a fault a test sets (a 500, garbage),
and records every request so a test can wait for the next poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from contextful.engine.control.credentials import IssuerKey
from contextful.engine.control.receipts import KeySigner, Receipt, sign_receipt
from contextful.engine.control.snapshots import POINTER, receipt_name, version_name
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.http_api import JsonApi, Reply, Request


def new_signer() -> KeySigner:
    return KeySigner(Ed25519PrivateKey.generate())


def pin_of(signer: KeySigner) -> IssuerKey:
    from contextful.engine.control.credentials import parse_public_key

    return parse_public_key(signer.signer, "test")


def project_text(name: str, *blocks: str, control: str = "") -> str:
    """A manifest of project ``name`` holding ``blocks`` (and a ``[control]`` block's body)."""
    return f'[project]\nname = "{name}"\n' + (f"\n[control]\n{control}\n" if control else "") + "".join(blocks)


class Chain:
    """A control source directory of project ``project``, each version signed by ``signer`` (None:
    unsigned, no receipts)."""

    def __init__(self, directory: Path, project: str, signer: KeySigner | None) -> None:
        self.directory = directory
        self.project = project
        self.signer = signer
        self.receipts: list[Receipt] = []
        self.head = 0
        directory.mkdir(parents=True, exist_ok=True)

    def publish(self, text: str, *, signer: KeySigner | None = None, project: str | None = None,
                parent: str | None = None) -> int:
        """Write the next version holding ``text`` and point at it; ``signer``, ``project`` and
        ``parent`` override what its receipt signs (a forged or forked link)."""
        version = self.head + 1
        data = text.encode()
        (self.directory / version_name(version)).write_bytes(data)
        port = signer or self.signer
        if port is not None:
            previous = parent if parent is not None else (self.receipts[-1].digest() if self.receipts else None)
            receipt = sign_receipt(port, project or self.project, version, previous, data)
            self.receipts.append(receipt)
            (self.directory / receipt_name(version)).write_bytes(receipt.to_bytes())
        (self.directory / POINTER).write_text(f"{version}\n")
        self.head = version
        return version


class ControlServer(JsonApi):
    """A control URL on loopback: ``<url>/control/<name>`` answers ``directory``'s file ``name``."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory
        self.fault: Callable[[str], Reply | None] | None = None
        """Answers a name before the directory does (None from it: the directory answers)."""
        self._seen = threading.Condition()

    @property
    def control_url(self) -> str:
        return f"{self.url}/control"

    def _answer(self, request: Request) -> Reply:
        with self._seen:
            self.requests.append(request)
            self._seen.notify_all()
        name = request.path.removeprefix("/control/")
        if request.path == name or "/" in name:
            return Reply(404, b"")
        if self.fault is not None and (reply := self.fault(name)) is not None:
            return reply
        path = self.directory / name
        if not path.is_file():
            return Reply(404, b"")
        return Reply(200, path.read_bytes(), {"Content-Type": "application/octet-stream"})

    def polls(self) -> int:
        """How many times the pointer was read."""
        with self._seen:
            return sum(1 for r in self.requests if r.path == f"/control/{POINTER}")

    def wait_polls(self, count: int, timeout: float = 120) -> None:
        """Wait until the pointer was read ``count`` times in all."""
        with self._seen:
            if not self._seen.wait_for(lambda: sum(1 for r in self.requests if r.path == f"/control/{POINTER}")
                                       >= count, timeout):
                raise AssertionError(f"{count} poll(s) expected: {[r.path for r in self.requests]}")
