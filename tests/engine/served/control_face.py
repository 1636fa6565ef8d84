"""What the control-route tests share: a project pinning an issuer key, its console's signing key,
signed Admin credentials, attested requests over real HTTP, and reads of what the store holds.

The console's side is built here as the browser builds it (docs/served.md, "Control routes"): an
Ed25519 key whose public half the Admin credential's ``console_key`` claim names, and the
``Contextful-Attestation`` header over the operator, the route and the body.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextful.engine.control.admin import admin_claims
from contextful.engine.control.credentials import b64url_encode, issue, issuer_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PIPELINE = """
[[pipeline]]
id = "events"
source = { kind = "files", config = { paths = ["raw/*.ndjson"] } }
schedule = "every 10m"
"""

EXTERNAL = """
[[external]]
id = "crm"
table = "crm_accounts"
description = "nightly CRM export"
"""


def manifest_text(pin: str | None, body: str = PIPELINE) -> str:
    pins = f'issuer_keys = ["{pin}"]\n' if pin else ""
    return f'[project]\nname = "shop"\n{pins}{body}'


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """One request on its own connection: the status and the JSON answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def attestation(console: Ed25519PrivateKey, operator: str, method: str, path: str, body: bytes, *,
                iat: int | None = None, nonce: str | None = None) -> str:
    """The ``Contextful-Attestation`` header a console sends (the worked example of docs/served.md)."""
    nonce = nonce or secrets.token_hex(16)
    iat = int(time.time()) if iat is None else iat
    message = (f"contextful-console-v1\n{operator}\n{method} {path}\n{hashlib.sha256(body).hexdigest()}\n"
               f"{nonce}\n{iat}\n").encode()
    return f"v1;nonce={nonce};iat={iat};sig={b64url_encode(console.sign(message))}"


@dataclass
class Console:
    """An operator at the console: the issuer that signs their credential, their browser's key."""

    issuer: Ed25519PrivateKey
    url: str
    operator: str = "dana"
    token: str = ""
    """The Admin credential requests carry unless told otherwise."""
    console: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    now_s: Any = None
    """A callable giving the server's clock in seconds (None: this machine's)."""

    def credential(self, *, admin: bool = True, console_key: bool = True, extra: dict[str, Any] | None = None,
                   clock: Any = None) -> str:
        claims = admin_claims(issuer_key(self.console.public_key()).text if console_key else None) if admin else {}
        return issue(self.issuer, "console", "control", 600, on_behalf_of=self.operator,
                     claims={**claims, **(extra or {})}, clock=clock)

    def iat(self) -> int:
        return int(self.now_s()) if self.now_s is not None else int(time.time())

    def post(self, path: str, doc: Any, *, token: str | None = None, attest: bool = True,
             raw: bytes | None = None, headers: dict[str, str] | None = None, **signing: Any) -> tuple[int, dict]:
        body = raw if raw is not None else json.dumps(doc).encode()
        sent = {"Content-Type": "application/json", "Authorization": f"Bearer {token or self.token}"}
        if attest:
            signing.setdefault("iat", self.iat())
            sent["Contextful-Attestation"] = attestation(self.console, self.operator, "POST", path, body, **signing)
        return request(self.url, "POST", path, body, {**sent, **(headers or {})})

    def get(self, token: str | None = None) -> tuple[int, dict]:
        return request(self.url, "GET", "/control/document", headers={"Authorization": f"Bearer {token or self.token}"})



def pointer(project: Path) -> str:
    return (project / ".contextful" / "control" / "shop" / "manifest@current").read_text()


def version_text(project: Path, version: int) -> str:
    return (project / ".contextful" / "control" / "shop" / f"manifest@v{version}.toml").read_text()
