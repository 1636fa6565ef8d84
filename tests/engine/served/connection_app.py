"""What the connection-route tests share: an application calling the routes over real HTTP with
connection write credentials its issuer signs (docs/served.md, "Connections")."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextful.engine.control.credentials import issue
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.engine.served.control_face import request

TEMPLATE = """
[[pipeline]]
id = "events"
table = "drive_files"
primary_key = ["id"]
source = { kind = "http", config = { url = "http://127.0.0.1:9/files", headers = { Authorization = "Bearer ${secret:DRIVE_TOKEN}" } } }
"""
"""The pipeline connections instantiate: an http source whose headers reference one secret (no
schedule of its own: it runs as its connections)."""


def write_template_project(root: Path, manifest: str) -> None:
    """``manifest`` as the project's ``contextful.toml``, with the operator's own value of the
    template's secret in the secrets file (validate resolves every reference)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text(manifest)
    (root / ".contextful").mkdir(exist_ok=True)
    (root / ".contextful" / "secrets.toml").write_text('DRIVE_TOKEN = "operator-own-token"\n')

DECLARATION: dict[str, Any] = {"id": "acme-drive", "tenant": "acme", "principal": "ana", "pipeline": "events",
                               "selection": {"folders": ["f-1", "f-2"]}, "secret": "ACME_DRIVE_TOKEN",
                               "schedule": "every 15m"}


def declaration(**changes: Any) -> dict[str, Any]:
    return {**DECLARATION, **changes}


@dataclass
class App:
    """An application embedding Contextful: its issuer signs its tenants' write credentials."""

    issuer: Ed25519PrivateKey
    url: str
    clock: Any = None

    def token(self, tenant: str | None = "acme", principal: str | None = "ana", *, audience: str = "connections") -> str:
        claims = {k: v for k, v in (("tenant", tenant), ("principal", principal)) if v is not None}
        return issue(self.issuer, "app", audience, 600, claims=claims, clock=self.clock)

    def call(self, method: str, path: str, doc: Any = None, *, token: str | None = None,
             raw: bytes | None = None) -> tuple[int, dict[str, Any]]:
        body = raw if raw is not None else (json.dumps(doc).encode() if doc is not None else None)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token or self.token()}"}
        return request(self.url, method, path, body, headers)

    def create(self, doc: Any = None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", "/connections", DECLARATION if doc is None else doc, **kwargs)

    def pause(self, connection: str = "acme-drive", doc: Any = None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", f"/connections/{connection}/pause", {} if doc is None else doc, **kwargs)

    def delete(self, connection: str = "acme-drive", doc: Any = None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        return self.call("DELETE", f"/connections/{connection}", {} if doc is None else doc, **kwargs)


def error(answer: tuple[int, dict[str, Any]]) -> tuple[int, str]:
    return answer[0], answer[1]["error"]


def claims_of(token: str) -> dict[str, Any]:
    """A cfc1 credential's claims, as its second segment holds them."""
    part = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))
