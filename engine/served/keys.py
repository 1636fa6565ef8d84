"""Bearer keys of the served face: minted once, stored hashed, compared in constant time.

Two kinds share this module: reader keys (``engine.export.readers``, ``cfr_…``, proving an
export's credential to the query gateway) and writer keys (``engine.land.receive.writers``,
``cfw_…``, admitting batches to the receive pipelines they name). A :class:`KeyKind` says a
kind's token prefix, folder under the project, and the field naming what its keys grant.

A key is printed once as ``<prefix>_<key id>_<secret>`` (16 hex digits of id, 43 url-safe
characters of secret). Only the SHA-256 of the secret is kept, one JSON file per key under
``<project>/<folder>/<key id>.json`` (mode 0600, its folder 0700, written whole then renamed):
``{key_id, <grant>, sha256, created_at, revoked_at}``. :func:`admit` answers the record a presented
``Authorization: Bearer`` key proves, or raises the kind's 401 error for a missing, malformed,
unknown or revoked key; a key of another kind is malformed for this one. Revoking keeps the record
(``revoked_at``) so a listing shows it.

    >>> import tempfile
    >>> kind = KeyKind("cfx", Path("keys"), "scope", "example key", ValueError)
    >>> root = Path(tempfile.mkdtemp())
    >>> record, token = issue(root, kind, "s1")
    >>> admit(root, kind, f"Bearer {token}")["scope"]
    's1'
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_KEY_ID = re.compile(r"[0-9a-f]{16}")
FIELDS = ("key_id", "sha256", "created_at", "revoked_at")


@dataclass(frozen=True)
class KeyKind:
    prefix: str
    """The token's prefix before its first ``_``: ``cfr`` (reader), ``cfw`` (writer)."""
    folder: Path
    """Where the kind's records live, relative to the project root."""
    grant: str
    """The record field naming what a key admits (``credential``, ``pipelines``)."""
    what: str
    """How messages name a key of this kind (``reader key``)."""
    unadmitted: Callable[[str], Exception]
    """The error raised (with a reason) for a key that admits nothing."""

    @property
    def token(self) -> re.Pattern[str]:
        return re.compile(rf"{self.prefix}_([0-9a-f]{{16}})_([A-Za-z0-9_-]{{43}})")


def issue(root: Path, kind: KeyKind, grant: Any) -> tuple[dict[str, Any], str]:
    """Mint a key granting ``grant``: its record and the whole token (shown once, never stored)."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    record = {"key_id": key_id, kind.grant: grant, "sha256": _digest(secret), "created_at": _now(),
              "revoked_at": None}
    _write(root, kind, record)
    return record, f"{kind.prefix}_{key_id}_{secret}"


def revoke(root: Path, kind: KeyKind, key_id: str) -> dict[str, Any]:
    """Mark a key revoked (idempotent); KeyError for an unknown key id."""
    record = read(root, kind, key_id)
    if record is None:
        raise KeyError(key_id)
    if record["revoked_at"] is None:
        record = {**record, "revoked_at": _now()}
        _write(root, kind, record)
    return record


def list_records(root: Path, kind: KeyKind) -> list[dict[str, Any]]:
    """Every key of the kind, revoked ones included, oldest first."""
    folder = root / kind.folder
    if not folder.is_dir():
        return []
    records = [r for r in (read(root, kind, p.stem) for p in sorted(folder.glob("*.json"))) if r is not None]
    return sorted(records, key=lambda r: (r["created_at"], r["key_id"]))


def admit(root: Path, kind: KeyKind, authorization: str | None) -> dict[str, Any]:
    """The record an ``Authorization: Bearer <token>`` header proves; the kind's error else."""
    if not authorization:
        raise kind.unadmitted("the request carries no Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise kind.unadmitted(f"the Authorization header is not 'Bearer <{kind.what}>'")
    match = kind.token.fullmatch(token.strip())
    if match is None:
        raise kind.unadmitted(f"the bearer token is not a {kind.what} ({kind.prefix}_<key id>_<secret>)")
    record = read(root, kind, match.group(1))
    presented = _digest(match.group(2))
    if record is None or not hmac.compare_digest(presented, record["sha256"]):
        raise kind.unadmitted(f"{kind.what} {match.group(1)} is not known here")
    if record["revoked_at"] is not None:
        raise kind.unadmitted(f"{kind.what} {record['key_id']} was revoked at {record['revoked_at']}")
    return record


def read(root: Path, kind: KeyKind, key_id: str) -> dict[str, Any] | None:
    """A key's record, or None for an unknown (or malformed) key id."""
    if not _KEY_ID.fullmatch(key_id):
        return None
    try:
        doc = json.loads(_path(root, kind, key_id).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return {k: doc.get(k) for k in (*FIELDS, kind.grant)}


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _path(root: Path, kind: KeyKind, key_id: str) -> Path:
    return root / kind.folder / f"{key_id}.json"


def _write(root: Path, kind: KeyKind, record: dict[str, Any]) -> None:
    path = _path(root, kind, record["key_id"])
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
