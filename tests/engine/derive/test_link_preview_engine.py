"""The built-in link_preview engine against a real HTTP server on loopback serving real HTML pages."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from contextful.engine.derive.engines.link_preview import fetch_preview
from contextful.storage.errors import DeriveHostNotAllowed, SourceRequestRefused, SourceUnavailable

ARTICLE = """<!doctype html>
<html><head>
  <meta charset="utf-8">
  <title>Caf&eacute; &amp; Bar &mdash;
     <b>opening</b> hours</title>
  <meta name="description" content="Open &quot;late&quot; on Fridays &lt;3">
  <meta property="og:description" content="not this one: the plain description wins">
  <meta property="og:image" content="img/front.png">
  <meta property="og:image:alt" content="The caf&eacute;'s front">
  <script>var a = "<a href='/not-a-link'>x</a>";</script>
</head><body>
  <div><p>See <a href="menu.html#drinks"><span>the <em>menu</em></span></a>,
  <a href="/about">about us</a>, <a href="menu.html">the menu again</a>,
  <a href="https://example.org/x?q=1&amp;r=2">a partner</a>, <a href="mailto:bar@example.org">mail</a>,
  <a href="javascript:void(0)">nothing</a>, <a href="#top">top</a> and <a>no href</a>.</p></div>
</body></html>"""
UNTITLED = """<html><head><meta property="og:description" content="Only an   og
 description"></head>
<body><base href="/docs/"><a href="guide">guide</a><a href="../home">home</a></body></html>"""
LATIN1 = '<title>R\xe9sum\xe9</title><meta name="description" content="na\xefve">'.encode("latin-1")
BIG = "<title>Long list</title>" + "".join(f'<a href="/item/{i}">{i}</a>' for i in range(5_000))

PAGES: dict[str, tuple[int, str, bytes, dict[str, str]]] = {
    "/article": (200, "text/html; charset=utf-8", ARTICLE.encode(), {}),
    "/untitled": (200, "text/html", UNTITLED.encode(), {}),
    "/latin1": (200, "text/html; charset=iso-8859-1", LATIN1, {}),
    "/nothing": (200, "text/html", b"<html><head></head><body><p>just text</p></body></html>", {}),
    "/picture.png": (200, "image/png", b"\x89PNG\r\n\x1a\n", {}),
    "/big": (200, "text/html", BIG.encode(), {}),
    "/gone": (404, "text/html", b"<title>Not here</title>", {}),
    "/removed": (410, "text/html", b"", {}),
    "/broken": (503, "text/html", b"down", {}),
    "/private": (403, "text/html", b"no", {}),
    "/moved": (302, "text/html", b"", {"Location": "/article"}),
}


class Site(ThreadingHTTPServer):
    daemon_threads = True
    requested: list[str]
    release: threading.Event  # a stalled page's handler waits on it


class Handler(BaseHTTPRequestHandler):
    server: Site

    def do_GET(self) -> None:
        self.server.requested.append(f"{self.headers['Host'].split(':')[0]}{self.path}")
        status, ctype, body, extra = PAGES.get(self.path, (404, "text/plain", b"", {}))
        if self.path in ("/stall", "/short"):  # promise 1000 bytes, send 10, then stall or hang up
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"<title>Sl")
            self.wfile.flush()
            if self.path == "/stall":
                self.server.release.wait()
            self.close_connection = True
            return
        if self.path.startswith("/away"):  # a redirect to another host name of this same server
            status, extra = 302, {"Location": f"http://localhost:{self.server.server_port}/article"}
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    server = Site(("127.0.0.1", 0), Handler)
    server.requested, server.release = [], threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()
    thread.join()


def preview(site: Site, path: str, **kwargs: Any) -> list[dict[str, Any]]:
    return fetch_preview(f"http://127.0.0.1:{site.server_port}{path}", endpoint_host="127.0.0.1", **kwargs)


def test_a_page_gives_its_title_description_image_and_links(site: Site) -> None:
    text, image, links = preview(site, "/article")
    assert text == {"text": "Café & Bar — opening hours\n\nOpen \"late\" on Fridays <3", "modality": "text"}
    page = f"http://127.0.0.1:{site.server_port}"
    assert image == {"text": "The café's front", "modality": "image", "uri": f"{page}/img/front.png"}
    assert links["modality"] == "structured"
    assert json.loads(links["text"]) == {"links": [f"{page}/menu.html", f"{page}/about",
                                                   "https://example.org/x?q=1&r=2", f"{page}/article"]}


def test_a_page_without_a_title_gives_its_description_and_links_under_its_base(site: Site) -> None:
    page = f"http://127.0.0.1:{site.server_port}"
    assert preview(site, "/untitled") == [
        {"text": "Only an og description", "modality": "text"},
        {"text": json.dumps({"links": [f"{page}/docs/guide", f"{page}/home"]}), "modality": "structured"}]


def test_the_declared_charset_decodes_the_page(site: Site) -> None:
    assert preview(site, "/latin1") == [{"text": "Résumé\n\nnaïve", "modality": "text"}]


def test_a_page_with_nothing_to_preview_or_not_html_is_empty(site: Site) -> None:
    assert preview(site, "/nothing") == [{"status": "empty"}]
    assert preview(site, "/picture.png") == [{"status": "empty"}]


def test_a_gone_page_is_unavailable_with_its_reason(site: Site) -> None:
    assert preview(site, "/gone") == [{"status": "unavailable", "reason": "HTTP 404 Not Found"}]
    assert preview(site, "/removed") == [{"status": "unavailable", "reason": "HTTP 410 Gone"}]


def test_server_errors_and_refusals_raise_the_catalogue_errors(site: Site) -> None:
    with pytest.raises(SourceUnavailable) as unavailable:
        preview(site, "/broken")
    assert unavailable.value.status == 503
    with pytest.raises(SourceRequestRefused) as refused:
        preview(site, "/private")
    assert refused.value.status == 403
    with socket.socket() as probe:  # a loopback port nothing listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(SourceUnavailable):
        fetch_preview(f"http://127.0.0.1:{port}/", endpoint_host="127.0.0.1")


def test_a_host_not_allowed_is_refused_before_any_request(site: Site) -> None:
    before = len(site.requested)
    url = f"http://localhost:{site.server_port}/article"
    with pytest.raises(DeriveHostNotAllowed) as refused:
        fetch_preview(url, endpoint_host="127.0.0.1", allow_hosts=["10.0.0.1"])
    assert (refused.value.host, refused.value.allowed) == ("localhost", ("127.0.0.1", "10.0.0.1"))
    with pytest.raises(DeriveHostNotAllowed):
        fetch_preview("file:///etc/passwd", endpoint_host="127.0.0.1")
    assert len(site.requested) == before
    assert fetch_preview(url, endpoint_host="127.0.0.1", allow_hosts=["LOCALHOST"])[0]["modality"] == "text"


def test_redirects_are_followed_only_to_allowed_hosts(site: Site) -> None:
    assert preview(site, "/moved") == preview(site, "/article")
    before = len(site.requested)
    with pytest.raises(DeriveHostNotAllowed) as refused:
        preview(site, "/away")
    assert refused.value.host == "localhost"
    assert site.requested[before:] == ["127.0.0.1/away"]  # the other host was never asked


def test_at_most_cap_bytes_of_the_body_are_read(site: Site) -> None:
    text, links = preview(site, "/big", cap_bytes=1000)
    assert text == {"text": "Long list", "modality": "text"}
    assert 0 < len(json.loads(links["text"])["links"]) < 50
    assert len(json.loads(preview(site, "/big")[1]["text"])["links"]) == 5_000


def test_a_stalled_or_cut_short_body_is_unavailable_within_the_deadline(site: Site) -> None:
    with pytest.raises(SourceUnavailable):
        preview(site, "/stall", deadline_s=0.5)
    with pytest.raises(SourceUnavailable):
        preview(site, "/short")
