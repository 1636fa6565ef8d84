"""Writer keys: how a sender proves it may push batches to the receive pipelines a key names.

``contextful pipeline key issue clicks views`` mints a key for those pipelines and prints it once::

    cfw_<key id>_<secret>

Only the SHA-256 of the secret is kept, one JSON file per key under ``<project>/.contextful/
writers/<key id>.json`` (mode 0600): ``{key_id, pipelines, sha256, created_at, revoked_at}``; the
mechanics are ``engine.served.keys``, shared with reader keys. :func:`admit` checks a request's
``Authorization: Bearer`` key for one pipeline: ``WriterCredentialUnadmitted`` (401) for a
missing, malformed, unknown or revoked key (a reader key is malformed here), and
``WriterPipelineRefused`` (403) for a live key that does not name the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextful.engine.served import keys
from contextful.storage.errors import WriterCredentialUnadmitted, WriterPipelineRefused

WRITERS_DIR = Path(".contextful") / "writers"
KIND = keys.KeyKind("cfw", WRITERS_DIR, "pipelines", "writer key", WriterCredentialUnadmitted)


@dataclass(frozen=True)
class WriterKey:
    key_id: str
    pipelines: tuple[str, ...]
    sha256: str
    """SHA-256 (hex) of the secret; the secret itself is never stored."""
    created_at: str
    revoked_at: str | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> WriterKey:
        return cls(record["key_id"], tuple(record["pipelines"] or ()), record["sha256"], record["created_at"],
                   record["revoked_at"])

    def public(self) -> dict[str, Any]:
        """What a listing shows: everything but the digest."""
        return {"key_id": self.key_id, "pipelines": list(self.pipelines), "created_at": self.created_at,
                "revoked_at": self.revoked_at}


@dataclass(frozen=True)
class IssuedKey:
    key: WriterKey
    token: str
    """The whole key, ``cfw_<key id>_<secret>``: shown once, never stored."""


def issue(root: Path, pipelines: list[str]) -> IssuedKey:
    """Mint a key admitting batches to ``pipelines`` under project ``root``."""
    record, token = keys.issue(root, KIND, sorted(set(pipelines)))
    return IssuedKey(WriterKey.from_record(record), token)


def revoke(root: Path, key_id: str) -> WriterKey:
    """Mark a key revoked (idempotent); KeyError for an unknown key id."""
    return WriterKey.from_record(keys.revoke(root, KIND, key_id))


def list_keys(root: Path) -> list[WriterKey]:
    """Every writer key, revoked ones included, oldest first."""
    return [WriterKey.from_record(r) for r in keys.list_records(root, KIND)]


def admit(root: Path, authorization: str | None, pipeline: str) -> WriterKey:
    """The writer key an ``Authorization`` header proves, if it names ``pipeline``."""
    key = WriterKey.from_record(keys.admit(root, KIND, authorization))
    if pipeline not in key.pipelines:
        raise WriterPipelineRefused(key.key_id, pipeline)
    return key
