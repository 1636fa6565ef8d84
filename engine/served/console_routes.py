"""The operator console's routes: its page and assets, and the overview it reads (docs/console.md).

Issue 31's console, served by ``contextful pipeline serve --http`` on its shared address wherever an
issuer key is pinned (a console no credential can read is not served):

- ``GET /console/``: the page (``engine/served/console/index.html``); ``GET /console`` redirects there.
- ``GET /console/<asset>``: a file of the package's ``console/`` folder, looked up by its exact name
  in the table read at start (never a path joined from the request, so nothing outside the folder
  can be named), with its content type. The page names each asset with ``?v=<digest>`` of its
  bytes: asked for so, an asset may be cached for a year (``immutable``); the page itself and an
  asset asked for without its digest are revalidated each time (``no-cache``). Every answer carries
  a content security policy allowing only this origin's scripts, styles and requests.
- ``GET /console/api/overview``: what the console shows (``engine.served.console_overview``), for a
  request admitting a ``control`` credential (``Authorization: Bearer <cfc1 credential>``; 401
  ``CredentialUnadmitted`` before anything is read, else): a **reader** (no Admin grant) sees
  status, and the answer's ``holder.admin`` says whether the holder may edit and apply. Never cached.

The console's edits go through the served control routes (``/control/document``, ``/control/draft``,
``/control/apply``; ``engine.served.control``), each mutation signed in the browser by the
operator's console key (``surface.apply.operator-attestation``; ``console/console.js``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.engine.control.admin import AUDIENCE
from contextful.engine.control.credentials import Credential, IssuerKey, admit
from contextful.engine.served.face import Exchange, Route
from contextful.storage.clock import Clock
from contextful.storage.errors import NotFound

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage import Store

ASSETS = Path(__file__).with_name("console")
"""The console's files, shipped as package data (setup.py)."""
INDEX = "index.html"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
                 ".txt": "text/plain; charset=utf-8"}
"""The kinds of file the console serves; a file of any other kind in the folder is not served."""
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
"""The page's content security policy: this origin's files and requests only (no CDN, no inline script)."""
PAGE_HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer"}
REVALIDATE = "no-cache"
IMMUTABLE = "public, max-age=31536000, immutable"
_REFERENCE = re.compile(r'(?P<attr>(?:src|href))="(?P<name>[a-z0-9][a-z0-9.-]*\.(?:js|css|svg|png))"')


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    version: str
    """The first 16 hex digits of the SHA-256 of ``body``: the ``?v=`` the page names it with."""


def load_assets(folder: Path = ASSETS) -> dict[str, Asset]:
    """The servable files of ``folder`` by name, the page's references to them made ``name?v=<version>``."""
    assets: dict[str, Asset] = {}
    for path in sorted(folder.iterdir()):
        kind = CONTENT_TYPES.get(path.suffix)
        if kind is not None and path.is_file():
            body = path.read_bytes()
            assets[path.name] = Asset(body, kind, hashlib.sha256(body).hexdigest()[:16])
    page = assets[INDEX]

    def versioned(found: re.Match[str]) -> str:
        asset = assets.get(found.group("name"))
        suffix = f"?v={asset.version}" if asset is not None else ""
        return f'{found.group("attr")}="{found.group("name")}{suffix}"'

    body = _REFERENCE.sub(versioned, page.body.decode("utf-8")).encode("utf-8")
    assets[INDEX] = Asset(body, page.content_type, hashlib.sha256(body).hexdigest()[:16])
    return assets


class ConsoleService:
    """The console's state: its assets, the pinned issuer keys, the project and its store opener."""

    def __init__(self, manifest: Manifest, open_store: Callable[[], Store], pins: Sequence[IssuerKey], *,
                 clock: Clock | None = None) -> None:
        self.manifest = manifest
        self.open_store = open_store
        self.pins = tuple(pins)
        self.clock = clock
        self.assets = load_assets()

    def admit(self, authorization: str | None) -> Credential:
        """The ``control`` credential the request's ``Authorization`` header proves (Admin or reader)."""
        return admit(authorization, self.pins, AUDIENCE, clock=self.clock)


def console_routes(service: ConsoleService) -> list[Route]:
    """``GET /console``, ``/console/``, ``/console/<asset>`` and ``/console/api/overview``."""
    from contextful.engine.served.console_overview import overview

    def moved(exchange: Exchange, _match: re.Match[str]) -> None:
        exchange.send_bytes(308, b"", "text/plain; charset=utf-8", headers={"Location": "/console/"})

    def asset(exchange: Exchange, match: re.Match[str]) -> None:
        name = match.group("name") or INDEX
        found = service.assets.get(name)
        if found is None:
            raise NotFound(f"no resource GET {exchange.path}")
        cache = IMMUTABLE if name != INDEX and exchange.query.get("v") == found.version else REVALIDATE
        exchange.send_bytes(200, found.body, found.content_type, headers={**PAGE_HEADERS, "Cache-Control": cache})

    def read(exchange: Exchange, _match: re.Match[str]) -> None:
        credential = service.admit(exchange.headers.get("Authorization"))
        exchange.send_json(200, overview(service.manifest, service.open_store, credential),
                           headers=_no_store(PAGE_HEADERS))

    return [Route("GET", re.compile(r"/console"), moved, "GET /console"),
            Route("GET", re.compile(r"/console/api/overview"), read, "GET /console/api/overview"),
            Route("GET", re.compile(r"/console/(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)?"), asset, "GET /console/<asset>")]


def _no_store(headers: Mapping[str, str]) -> dict[str, str]:
    return {**headers, "Cache-Control": "no-store"}
