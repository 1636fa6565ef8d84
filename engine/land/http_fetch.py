"""One page of a JSON API, fetched and parsed inside a connector child.

Runs in a child forked by the decoder's server (``engine.land.decode_child``), so a page gets the
connector bounds of decision "bound-hit-rides": the call deadline and the linear-memory bound of
that child (``run.retry.bound-hit-is-transient``). The parent (``engine.land.http``) reads the
page's rows as Arrow batches and its trailer: the status, the next page's URL (from the body or an
RFC 8288 ``Link: <…>; rel="next"`` header), the next page's token and, when asked, one content
digest per record (``engine.land.position`` keeps those of the rows at the last instant).

The request is plain ``urllib`` with proxies disabled: a connector talks to the address it was
given and nothing else. A non-2xx answer, an unreachable server or a body that is not JSON raises
:class:`FetchFailed` with the fields the parent maps to the error catalogue.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin

import pyarrow as pa
import xxhash

DEFAULT_RECORD_KEYS = ("data", "items", "results", "records")
_LINK = re.compile(r"<([^>]*)>\s*((?:;\s*[^;,]+)*)")
_REL_NEXT = re.compile(r';\s*rel\s*=\s*"?([^";]*)"?', re.IGNORECASE)
_SNIPPET = 300


@dataclass
class FetchFailed(Exception):
    kind: str
    """``http`` (a non-2xx status), ``unreachable`` or ``malformed``."""
    reason: str
    status: int | None = None
    retry_after_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def trailer(self) -> dict[str, Any]:
        if self.kind == "malformed":
            return {"error": "malformed", "line": None, "reason": self.reason}
        return {"error": self.kind, "reason": self.reason, "status": self.status, "retry_after_s": self.retry_after_s}


def fetch_page(request: dict[str, Any],
               parse_ndjson: Callable[[bytes], Iterator[pa.Table]]) -> tuple[dict[str, Any], Iterator[pa.Table]]:
    """GET ``request["url"]``; the page's meta and its records as tables (parsed by ``parse_ndjson``,
    the decoder's NDJSON path, so a page infers types exactly as a file does)."""
    url = request["url"]
    status, headers, body = _get(url, request.get("headers") or {}, float(request["timeout_s"]))
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise FetchFailed("malformed", f"the body is not JSON: {exc}") from None
    records = _records(document, request.get("records"), url)
    meta = {
        "status": status,
        "records": len(records),
        "bytes": len(body),
        "next_url": _next_url(document, headers, request.get("next_key"), url),
        "next_token": _lookup(document, request["token_key"]) if request.get("token_key") else None,
    }
    if meta["next_token"] is not None and not isinstance(meta["next_token"], (str, int)):
        raise FetchFailed("malformed", f"the next page token is {type(meta['next_token']).__name__}, "
                                       "not text or a number")
    for n, record in enumerate(records):
        if not isinstance(record, dict):
            raise FetchFailed("malformed", f"record {n} is {type(record).__name__}, not an object")
    if request.get("digests"):
        meta["digests"] = [record_digest(r) for r in records]
    data = b"\n".join(json.dumps(r, ensure_ascii=False).encode() for r in records)
    return meta, (parse_ndjson(data) if records else iter(()))


def record_digest(record: dict[str, Any]) -> str:
    """What identifies a record's content across pages and runs: xxh3-128 of its canonical JSON."""
    return xxhash.xxh3_128_hexdigest(json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


def _get(url: str, headers: dict[str, str], timeout_s: float) -> tuple[int, Any, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers={"Accept": "application/json", **headers}, method="GET")
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()[:_SNIPPET].decode("utf-8", "replace").strip()
        reason = f"{exc.code} {exc.reason}" + (f": {body}" if body else "")
        raise FetchFailed("http", reason, exc.code, _retry_after(exc.headers.get("Retry-After"))) from None
    except (urllib.error.URLError, OSError) as exc:
        cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise FetchFailed("unreachable", str(cause)) from None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from datetime import datetime

        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def _lookup(document: Any, path: str) -> Any:
    node = document
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _records(document: Any, path: str | None, url: str) -> list[Any]:
    if path:
        found = _lookup(document, path)
        if not isinstance(found, list):
            what = "missing" if found is None else f"a {type(found).__name__}"
            raise FetchFailed("malformed", f"records path {path!r} is {what}, not a list")
        return found
    if isinstance(document, list):
        return document
    if isinstance(document, dict):
        for key in DEFAULT_RECORD_KEYS:
            if isinstance(document.get(key), list):
                return list(document[key])
    raise FetchFailed("malformed", "the body holds no records list (set records = \"<path>\")")


def _next_url(document: Any, headers: Any, next_key: str | None, url: str) -> str | None:
    for value in headers.get_all("Link") or ():
        for target, params in _LINK.findall(value):
            rel = _REL_NEXT.search(params)
            if rel and "next" in rel.group(1).lower().split():
                return urljoin(url, target)
    if next_key:
        found = _lookup(document, next_key)
        if isinstance(found, str) and found:
            return urljoin(url, found)
    return None
