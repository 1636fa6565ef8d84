"""The built-in ``link_preview`` task's real engine: a page's title, description, image and links.

The ``fetch`` driver (decision "derive-engine-machine": ``link_preview`` binds ``driver = "fetch"``
with an ``endpoint_host``) calls :func:`fetch_preview` for each unit's URL and lands what it
returns, the engine output protocol as dicts (decision "passage-s-modality"):

- a ``text`` passage: the page's title (``<title>``, else ``og:title``) and description
  (``<meta name="description">``, else ``og:description``), separated by a blank line;
- an ``image`` passage when the page advertises ``og:image``: ``uri`` is that address resolved
  against the page (and its ``<base href>``), ``text`` its ``og:image:alt``, else the title;
- one ``structured`` passage whose ``text`` is the JSON object ``{"links": [...]}``: every
  ``<a href>`` resolved to an absolute http(s) URL, fragment dropped, deduplicated, in page order;
- ``{"status": "empty"}`` for a page with none of these (or a body that is not HTML);
- ``{"status": "unavailable", "reason": ...}`` for HTTP 404 or 410 (the page is gone).

Other failures raise: ``DeriveHostNotAllowed`` for a URL, or a redirect, to a host other than
``endpoint_host`` and ``allow_hosts`` (or a scheme other than http/https); ``SourceUnavailable``
for a 5xx, 408 or 429 answer, a connection error, a timeout, the deadline passing or a body cut
short of its ``Content-Length`` (transient: a later run may succeed); ``SourceRequestRefused`` for
any other 4xx. At most ``cap_bytes`` of the body are read (the preview comes from the page's
start, where its head is). One deadline covers the fetch: it is checked between reads, and no
single wait on the socket outlasts ``deadline_s``.
No proxy is consulted: the request goes to the named host or nowhere.

    >>> parse_page("<title>A &amp; B</title><a href='/x'>x</a>", "http://h/p")  # doctest: +NORMALIZE_WHITESPACE
    [{'text': 'A & B', 'modality': 'text'},
     {'text': '{"links": ["http://h/x"]}', 'modality': 'structured'}]
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from html.parser import HTMLParser
from http.client import HTTPException, HTTPMessage
from typing import Any
from urllib.parse import urldefrag, urljoin, urlsplit

from contextful.storage.errors import DeriveHostNotAllowed, SourceRequestRefused, SourceUnavailable

GONE = frozenset({404, 410})
RETRYABLE_4XX = frozenset({408, 429})
CHUNK = 64 * 1024
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


class PageParser(HTMLParser):
    """Collects a page's title, ``<meta>`` name/property values, ``<base href>`` and link targets."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)  # entities arrive decoded, in text and in attributes
        self.title: list[str] | None = None  # the first <title>'s text while or after reading it
        self.in_title = False
        self.meta: dict[str, str] = {}
        self.base: str | None = None
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value for name, value in attrs if value is not None}
        if tag == "title" and self.title is None:
            self.title, self.in_title = [], True
        elif tag == "meta":
            key = (values.get("property") or values.get("name") or "").strip().lower()
            if key and "content" in values:
                self.meta.setdefault(key, values["content"].strip())  # the first one stands
        elif tag == "base" and self.base is None and values.get("href"):
            self.base = values["href"].strip()
        elif tag == "a" and values.get("href"):
            self.hrefs.append(values["href"].strip())

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False

    def handle_data(self, data: str) -> None:
        if self.in_title and self.title is not None:
            self.title.append(data)


def collapse(text: str | None) -> str:
    return " ".join((text or "").split())


def parse_page(html: str, page_url: str) -> list[dict[str, Any]]:
    """The protocol lines for one HTML page fetched from ``page_url`` (see the module docstring)."""
    parser = PageParser()
    parser.feed(html)
    parser.close()
    base = urljoin(page_url, parser.base) if parser.base else page_url
    title = collapse("".join(parser.title or ())) or collapse(parser.meta.get("og:title"))
    description = collapse(parser.meta.get("description")) or collapse(parser.meta.get("og:description"))
    lines: list[dict[str, Any]] = []
    if title or description:
        lines.append({"text": "\n\n".join(part for part in (title, description) if part), "modality": "text"})
    image = parser.meta.get("og:image") or parser.meta.get("og:image:url")
    if image:
        lines.append({"text": collapse(parser.meta.get("og:image:alt")) or title, "modality": "image",
                      "uri": urljoin(base, image)})
    links = list(dict.fromkeys(  # ordered dedup; a page's anchors are bounded by cap_bytes
        target for target in (urldefrag(urljoin(base, href)).url for href in parser.hrefs)
        if urlsplit(target).scheme in ("http", "https")))
    if links:
        lines.append({"text": json.dumps({"links": links}, ensure_ascii=False), "modality": "structured"})
    return lines or [{"status": "empty"}]


class HostCheck(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host (urllib itself follows any)."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.allowed = allowed

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: HTTPMessage,
                         newurl: str) -> urllib.request.Request | None:
        check_host(urljoin(req.full_url, newurl), self.allowed)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def check_host(url: str, allowed: tuple[str, ...]) -> None:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or host not in allowed:
        raise DeriveHostNotAllowed(url, host or parts.scheme, allowed)


def fetch_preview(url: str, *, endpoint_host: str, allow_hosts: Sequence[str] = (), deadline_s: float = 30.0,
                  cap_bytes: int = 1024 * 1024) -> list[dict[str, Any]]:
    """Fetches ``url`` (only from ``endpoint_host`` or ``allow_hosts``) and returns its preview's protocol lines."""
    allowed = tuple(dict.fromkeys(h.lower() for h in (endpoint_host, *allow_hosts)))
    check_host(url, allowed)
    deadline = time.monotonic() + deadline_s
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), HostCheck(allowed))
    request = urllib.request.Request(url, headers={"Accept": "text/html, application/xhtml+xml;q=0.9"})
    try:
        with opener.open(request, timeout=deadline_s) as response:
            body = bytearray()
            while len(body) < cap_bytes:
                if time.monotonic() > deadline:
                    raise SourceUnavailable(url, f"the {deadline_s:g} s deadline passed while reading the page")
                chunk = response.read(min(CHUNK, cap_bytes - len(body)))
                if not chunk:
                    break
                body += chunk
            headers, final_url = response.headers, response.geturl()
            declared = headers.get("Content-Length", "")
            if declared.isdigit() and len(body) < min(int(declared), cap_bytes):  # urllib returns a cut body quietly
                raise SourceUnavailable(url, f"the body ended after {len(body)} of its {declared} bytes")
    except urllib.error.HTTPError as exc:
        reason = f"HTTP {exc.code} {exc.reason}"
        if exc.code in GONE:
            return [{"status": "unavailable", "reason": reason}]
        if exc.code >= 500 or exc.code in RETRYABLE_4XX:
            raise SourceUnavailable(url, reason, exc.code) from exc
        raise SourceRequestRefused(url, exc.code, str(exc.reason)) from exc
    except urllib.error.URLError as exc:  # refused, unresolvable, timed out connecting
        raise SourceUnavailable(url, str(exc.reason)) from exc
    except (OSError, HTTPException) as exc:  # reset, timed out or cut short mid-body
        raise SourceUnavailable(url, str(exc) or type(exc).__name__) from exc
    if headers.get_content_type() not in HTML_TYPES:
        return [{"status": "empty"}]
    try:
        html = bytes(body).decode(headers.get_content_charset() or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know: read it as UTF-8
        html = bytes(body).decode("utf-8", errors="replace")
    return parse_page(html, final_url)
