"""Signed control receipts: what a synced apply signs, and what a pulling node verifies.

Implements ``surface.apply.receipt-message``, ``surface.apply.receipt-digest`` and the
verification half of ``surface.reconcile.pulled-control`` / ``issuer-pin`` /
``pulled-control-untrusted`` (decision "synced control head"; docs/control.md "Synced control").

A receipt is a JSON object::

    {"format": 1, "project": "shop", "version": 3, "parent": "<sha256 hex of v2's receipt>" | "-",
     "snapshot": "<sha256 hex of manifest@v3.toml's bytes>", "signer": "ed25519:<43 base64url>",
     "signature": "<base64url of the Ed25519 signature>"}

The signature is over the UTF-8 bytes of the **message**::

    contextful-control-v1\\n<project>\\n<version>\\n<parent-or-minus>\\n<snapshot-sha256>\\n<signer>\\n

and ``parent`` is ``-`` only for the first version. A receipt's **digest** is the lowercase SHA-256
hex of its RFC 8785 canonical JSON bytes (the ``rfc8785`` package); a successor's ``parent`` and
the bucket head name receipts by it. Receipts are written as those canonical bytes, so the digest
of the file is the digest of the receipt.

Verification (:func:`verify_receipt`) parses nothing it trusts before the signature holds: the
object's shape, then the signer against the pinned issuer keys (``issuer-pin``), then the signature
over the message rebuilt from the object's own fields, then the fields against what the caller
expects (project, version, predecessor digest, snapshot digest). Each failure is
``ControlSnapshotUntrusted`` naming its reason.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import rfc8785
from contextful.engine.control.credentials import (
    IssuerKey,
    b64url_decode,
    b64url_encode,
    issuer_key,
    load_signing_key,
    public_key_problem,
)
from contextful.storage.errors import ControlSnapshotUntrusted
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

FORMAT = 1
DOMAIN = "contextful-control-v1"
FIRST_PARENT = "-"
"""The ``parent`` of the first version's receipt."""
FIELDS = ("format", "project", "version", "parent", "snapshot", "signer", "signature")
MAX_RECEIPT_BYTES = 4096
"""A longer receipt is refused before it is parsed."""

_DIGEST = re.compile(r"[0-9a-f]{64}")


def sha256_hex(data: bytes) -> str:
    """The lowercase SHA-256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def receipt_message(project: str, version: int, parent: str, snapshot: str, signer: str) -> bytes:
    """The bytes a receipt's signature covers (``surface.apply.receipt-message``)."""
    return f"{DOMAIN}\n{project}\n{version}\n{parent}\n{snapshot}\n{signer}\n".encode()


class SigningPort(Protocol):
    """What signs receipts (``signing-port``): a public key and a signature over a message."""

    @property
    def signer(self) -> str:
        """The public key, spelled ``ed25519:<43 base64url characters>``."""
        ...

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of ``message``."""
        ...


@dataclass(frozen=True)
class KeySigner:
    """A signing port over a private key held in this process (loaded from a PKCS#8 PEM file of mode
    0600 by :meth:`from_file`, as ``contextful key generate`` writes one)."""

    private: Ed25519PrivateKey

    @classmethod
    def from_file(cls, path: Path) -> KeySigner:
        return cls(load_signing_key(path))

    @property
    def signer(self) -> str:
        return issuer_key(self.private.public_key()).text

    def sign(self, message: bytes) -> bytes:
        return self.private.sign(message)


@dataclass(frozen=True)
class Receipt:
    """One verified-shape control receipt."""

    project: str
    version: int
    parent: str
    """The predecessor receipt's digest, or ``-`` for the first version."""
    snapshot: str
    """The SHA-256 hex of the version's snapshot bytes."""
    signer: str
    signature: str

    def message(self) -> bytes:
        return receipt_message(self.project, self.version, self.parent, self.snapshot, self.signer)

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT, "project": self.project, "version": self.version, "parent": self.parent,
                "snapshot": self.snapshot, "signer": self.signer, "signature": self.signature}

    def to_bytes(self) -> bytes:
        """The receipt's RFC 8785 canonical JSON bytes: what a receipt file holds."""
        return bytes(rfc8785.dumps(self.document()))

    def digest(self) -> str:
        """``surface.apply.receipt-digest``: the SHA-256 hex of the canonical JSON bytes."""
        return sha256_hex(self.to_bytes())


def sign_receipt(port: SigningPort, project: str, version: int, parent: str | None, snapshot: bytes) -> Receipt:
    """A receipt for ``snapshot`` claimed as ``version`` of ``project`` after the receipt whose digest is
    ``parent`` (None for the first version), signed through ``port``."""
    parent_text = FIRST_PARENT if parent is None else parent
    if (version == 1) != (parent is None):
        raise ValueError("only the first version's receipt has no parent")
    digest = sha256_hex(snapshot)
    signer = port.signer
    signature = port.sign(receipt_message(project, version, parent_text, digest, signer))
    return Receipt(project, version, parent_text, digest, signer, b64url_encode(signature))


def parse_receipt(data: bytes, location: str) -> Receipt:
    """The receipt ``data`` holds; ControlSnapshotUntrusted naming ``location`` when it is not one.

    Its signature is not checked here (:func:`verify_receipt` does)."""
    if len(data) > MAX_RECEIPT_BYTES:
        raise ControlSnapshotUntrusted(location, f"the receipt is over {MAX_RECEIPT_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ControlSnapshotUntrusted(location, "the receipt is not JSON") from exc
    if not isinstance(doc, dict) or set(doc) != set(FIELDS):
        raise ControlSnapshotUntrusted(location, f"the receipt is not an object holding exactly {', '.join(FIELDS)}")
    if doc["format"] != FORMAT or type(doc["format"]) is not int:
        raise ControlSnapshotUntrusted(location, f"the receipt's format is {doc['format']!r}, not {FORMAT}")
    version = doc["version"]
    if type(version) is not int or version < 1:
        raise ControlSnapshotUntrusted(location, "the receipt's version is not a positive integer")
    texts = {name: doc[name] for name in ("project", "parent", "snapshot", "signer", "signature")}
    if not all(isinstance(value, str) and value for value in texts.values()) or "\n" in doc["project"]:
        raise ControlSnapshotUntrusted(location, "the receipt's project, parent, snapshot, signer and signature "
                                                 "must be one-line strings")
    if not _DIGEST.fullmatch(doc["snapshot"]):
        raise ControlSnapshotUntrusted(location, "the receipt's snapshot is not a lowercase SHA-256 hex digest")
    if doc["parent"] != FIRST_PARENT and not _DIGEST.fullmatch(doc["parent"]):
        raise ControlSnapshotUntrusted(location, "the receipt's parent is neither '-' nor a lowercase SHA-256 hex digest")
    if (version == 1) != (doc["parent"] == FIRST_PARENT):
        raise ControlSnapshotUntrusted(location, "only the first version's receipt has parent '-'")
    if public_key_problem(doc["signer"]) is not None:
        raise ControlSnapshotUntrusted(location, "the receipt's signer is not an Ed25519 public key")
    return Receipt(doc["project"], version, doc["parent"], doc["snapshot"], doc["signer"], doc["signature"])


def verify_receipt(receipt: Receipt, pins: Sequence[IssuerKey], location: str, *, project: str,
                   version: int | None = None, parent: str | None = None, snapshot: bytes | None = None) -> None:
    """Raise ``ControlSnapshotUntrusted`` naming the reason unless ``receipt`` is signed by a pinned key,
    its signature holds over its message, and it names ``project`` (and, where given, ``version``, the
    predecessor digest ``parent`` — None with a version of 1 means the first — and ``snapshot``'s digest)."""
    pin = next((p for p in pins if p.text == receipt.signer), None)
    if pin is None:
        raise ControlSnapshotUntrusted(location, f"its signer {receipt.signer} is not a pinned issuer key")
    try:
        pin.public.verify(b64url_decode(receipt.signature), receipt.message())
    except (InvalidSignature, ValueError) as exc:
        raise ControlSnapshotUntrusted(location, "its signature does not verify") from exc
    if receipt.project != project:
        raise ControlSnapshotUntrusted(location, f"it is project {receipt.project!r}'s, not {project!r}'s")
    if version is not None and receipt.version != version:
        raise ControlSnapshotUntrusted(location, f"it signs version {receipt.version}, not {version}")
    if version is not None or parent is not None:
        expected = FIRST_PARENT if parent is None else parent
        if receipt.parent != expected:
            raise ControlSnapshotUntrusted(location, "its predecessor is not the receipt before it "
                                                     f"(names {receipt.parent[:12]}, expected {expected[:12]})")
    if snapshot is not None and sha256_hex(snapshot) != receipt.snapshot:
        raise ControlSnapshotUntrusted(location, "the snapshot's digest is not the one its receipt signs")
