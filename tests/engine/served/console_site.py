"""A project the console tests read: two files pipelines that have run, one on a schedule, an issuer
key pinned, and ``contextful pipeline serve --http`` serving it in a child process.

Everything is made as an operator makes it: the issuer key with ``contextful key generate``, each
credential with ``contextful key issue`` (``--admin --console-key`` for an Admin), the versions with
``pipeline import``/``apply``, the runs with ``pipeline run``.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.engine.control.scenario import ControlProject, Serve, files_pipeline, serving
from tests.support.cli import contextful_in

PROJECT = "shop"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    """Header names lowercased."""
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("content-type") == "application/json", self.headers
        return json.loads(self.body)


def request(method: str, url: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> Answer:
    """One request on its own connection (the path sent as written: nothing normalizes it)."""
    host, port = urlsplit(url).netloc.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        conn.close()


def get(url: str, path: str, token: str | None = None) -> Answer:
    return request("GET", url, path, headers={"Authorization": f"Bearer {token}"} if token else {})


def post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    """POST ``body`` to the whole ``url`` (the address and the path)."""
    return request("POST", url, urlsplit(url).path, body, headers)


class Site:
    """The project, its issuer key file (outside it) and the credentials issued under that key."""

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.key_file = base / "keys" / "issuer.pem"
        self.pin = contextful_in(base, "key", "generate", "--out", str(self.key_file)).stdout.strip()
        self.project = ControlProject(base / "project", PROJECT)

    def write(self, *blocks: str) -> None:
        text = f'[project]\nname = "{PROJECT}"\nissuer_keys = ["{self.pin}"]\n'
        (self.project.root / "contextful.toml").write_text(text + "".join(blocks))

    def credential(self, subject: str, *, audience: str = "control", operator: str | None = None,
                   admin: bool = False, console_key: str | None = None) -> str:
        """``contextful key issue``: a reader's credential, or with ``admin`` an Admin's."""
        args = ["key", "issue", "--subject", subject, "--audience", audience, "--ttl", "1h", "--key",
                str(self.key_file)]
        if operator is not None:
            args += ["--on-behalf-of", operator]
        if admin:
            args.append("--admin")
        if console_key is not None:
            args += ["--console-key", console_key]
        return contextful_in(self.base, *args).stdout.strip()


MODEL_AND_EXPORT = """
[[model]]
name = "order_count"
sql = "SELECT count(*) AS n FROM orders"

[[export]]
name = "order_count"
source = "order_count"
namespace = "bi"
credential = "analysts"
"""
"""A model over ``orders`` and its Iceberg export."""


def landed_site(base: Path) -> Site:
    """``orders`` (every 1h; two runs of 5 and 7 rows), ``customers`` (no schedule; 3 rows) and a model
    over ``orders`` exported to Iceberg, applied as v1; the model built and exported after the first
    ``orders`` run, so the second leaves it stale."""
    site = Site(base)
    site.write(files_pipeline("orders", schedule="every 1h"), files_pipeline("customers", schedule=None),
               MODEL_AND_EXPORT)
    site.project.rows("orders", 5, file="a")
    site.project.rows("customers", 3)
    site.project.imported()
    site.project.cli("pipeline", "run")
    site.project.cli("build", "run")
    site.project.cli("export", "run")
    site.project.rows("orders", 7, file="b")
    site.project.cli("pipeline", "run", "orders")
    return site


@contextmanager
def console_served(site: Site) -> Iterator[Serve]:
    """``contextful pipeline serve --http 127.0.0.1:0`` over the site's project, stopped at the end."""
    with serving(site.project, "--http", "127.0.0.1:0") as serve:
        serve.url  # noqa: B018 - waits for "listening on": the face is bound and serving
        yield serve
        assert serve.stop() == 0, serve.lines
