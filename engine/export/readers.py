"""Reader keys: how a reader proves the credential (audience key) an export publishes for.

The manifest names a credential (``credential = "analysts"``), never key material. ``contextful
export key issue analysts`` mints a key for it and prints it once::

    cfr_<key id>_<secret>

Only the SHA-256 of the secret is kept, one JSON file per key under ``<project>/.contextful/
readers/<key id>.json`` (mode 0600, written whole then renamed): ``{key_id, credential, sha256,
created_at, revoked_at}``. :func:`admit` answers the credential a presented key proves, or raises
``ReaderCredentialUnadmitted`` (HTTP 401) for a missing, malformed, unknown or revoked key — a
writer key (``cfw_…``) included. Keys are compared in constant time. Revoking keeps the record
(``revoked_at``) so a listing shows it. The mechanics are ``engine.served.keys``, shared with
writer keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextful.engine.served import keys
from contextful.storage.errors import ReaderCredentialUnadmitted

READERS_DIR = Path(".contextful") / "readers"
KIND = keys.KeyKind("cfr", READERS_DIR, "credential", "reader key", ReaderCredentialUnadmitted)


@dataclass(frozen=True)
class ReaderKey:
    key_id: str
    credential: str
    sha256: str
    """SHA-256 (hex) of the secret; the secret itself is never stored."""
    created_at: str
    revoked_at: str | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ReaderKey:
        return cls(record["key_id"], record["credential"], record["sha256"], record["created_at"],
                   record["revoked_at"])

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
    record, token = keys.issue(root, KIND, credential)
    return IssuedKey(ReaderKey.from_record(record), token)


def revoke(root: Path, key_id: str) -> ReaderKey:
    """Mark a key revoked (idempotent); KeyError for an unknown key id."""
    return ReaderKey.from_record(keys.revoke(root, KIND, key_id))


def list_keys(root: Path) -> list[ReaderKey]:
    """Every key, revoked ones included, oldest first."""
    return [ReaderKey.from_record(r) for r in keys.list_records(root, KIND)]


def admit(root: Path, authorization: str | None) -> str:
    """The credential an ``Authorization: Bearer cfr_…`` header proves; ReaderCredentialUnadmitted else."""
    credential: str = keys.admit(root, KIND, authorization)["credential"]
    return credential
