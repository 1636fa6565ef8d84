"""Reader keys: how a reader proves the credential (audience key) an export publishes for.

The manifest names a credential (``credential = "analysts"``), never key material. ``contextful
export key issue analysts`` mints a key for it and prints it once::

    cfr_<key id>_<secret>

Only the SHA-256 of the secret is kept, one JSON file per key under ``<project>/.contextful/
readers/<key id>.json`` (mode 0600, written whole then renamed): ``{key_id, credential, sha256,
created_at, revoked_at}``. :func:`admit` answers the credential a presented key proves, or raises
``ReaderCredentialUnadmitted`` (HTTP 401) for a missing, malformed, unknown or revoked key. Keys
are compared in constant time. Revoking keeps the record (``revoked_at``) so a listing shows it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from storage.errors import ReaderCredentialUnadmitted

READERS_DIR = Path(".contextful") / "readers"
PREFIX = "cfr_"
_TOKEN = re.compile(r"cfr_([0-9a-f]{16})_([A-Za-z0-9_-]{43})")
_KEY_ID = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class ReaderKey:
    key_id: str
    credential: str
    sha256: str
    """SHA-256 (hex) of the secret; the secret itself is never stored."""
    created_at: str
    revoked_at: str | None = None

    def public(self) -> dict[str, str | None]:
        """What a listing shows: everything but the digest."""
        return {"key_id": self.key_id, "credential": self.credential, "created_at": self.created_at,
                "revoked_at": self.revoked_at}


@dataclass(frozen=True)
class IssuedKey:
    key: ReaderKey
    token: str
    """The whole key, ``cfr_<key id>_<secret>``: shown once, never stored."""


def issue(root: Path, credential: str) -> IssuedKey:
    """Mint a key for ``credential`` under project ``root``."""
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    key = ReaderKey(key_id, credential, _digest(secret), _now())
    _write(root, key)
    return IssuedKey(key, f"{PREFIX}{key_id}_{secret}")


def revoke(root: Path, key_id: str) -> ReaderKey:
    """Mark a key revoked (idempotent); KeyError for an unknown key id."""
    key = _read(root, key_id)
    if key is None:
        raise KeyError(key_id)
    if key.revoked_at is None:
        key = ReaderKey(key.key_id, key.credential, key.sha256, key.created_at, _now())
        _write(root, key)
    return key


def list_keys(root: Path) -> list[ReaderKey]:
    """Every key, revoked ones included, oldest first."""
    folder = root / READERS_DIR
    keys = [k for k in (_read(root, p.stem) for p in sorted(folder.glob("*.json"))) if k is not None] \
        if folder.is_dir() else []
    return sorted(keys, key=lambda k: (k.created_at, k.key_id))


def admit(root: Path, authorization: str | None) -> str:
    """The credential an ``Authorization: Bearer cfr_…`` header proves; ReaderCredentialUnadmitted else."""
    if not authorization:
        raise ReaderCredentialUnadmitted("the request carries no Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ReaderCredentialUnadmitted("the Authorization header is not 'Bearer <reader key>'")
    match = _TOKEN.fullmatch(token.strip())
    if match is None:
        raise ReaderCredentialUnadmitted("the bearer token is not a reader key (cfr_<key id>_<secret>)")
    key = _read(root, match.group(1))
    presented = _digest(match.group(2))
    if key is None or not hmac.compare_digest(presented, key.sha256):
        raise ReaderCredentialUnadmitted(f"reader key {match.group(1)} is not known here")
    if key.revoked_at is not None:
        raise ReaderCredentialUnadmitted(f"reader key {key.key_id} was revoked at {key.revoked_at}")
    return key.credential


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _path(root: Path, key_id: str) -> Path:
    return root / READERS_DIR / f"{key_id}.json"


def _read(root: Path, key_id: str) -> ReaderKey | None:
    if not _KEY_ID.fullmatch(key_id):
        return None
    try:
        doc = json.loads(_path(root, key_id).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return ReaderKey(**{k: doc.get(k) for k in ("key_id", "credential", "sha256", "created_at", "revoked_at")})


def _write(root: Path, key: ReaderKey) -> None:
    path = _path(root, key.key_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(asdict(key), f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
