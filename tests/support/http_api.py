"""A real, scriptable JSON API server on loopback for tests of HTTP sources.

A :class:`JsonApi` is a ``ThreadingHTTPServer`` on ``127.0.0.1`` (port 0), served from a daemon
thread. It records every request (``api.requests``), so a test can assert what the server saw, or
that it saw nothing. Routes map an exact path to a handler ``(Request) -> Reply``; unknown paths
answer 404. The canned handlers below compose (``rate_limited(2, 1.0, next_url_pages(...))``) and
read their records list at request time, so a test appends to it (``api.records``) and runs again::

    with JsonApi() as api:
        api.records.extend({"id": i} for i in range(5))
        api.route("/items", next_url_pages(api.records, page_size=2))
        ...  # GET f"{api.url}/items" -> {"data": [{"id": 0}, {"id": 1}], "next": ".../items?page=2"}

A handler that raises answers 500 and lands in ``api.errors``, so a test can assert it is empty.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit


@dataclass(frozen=True)
class Request:
    """One request as the server received it."""

    method: str
    path: str
    """The path without the query string."""
    query: dict[str, str]
    """Query parameters; a repeated name keeps its last value."""
    headers: dict[str, str]
    """Request headers, names lower-cased."""
    body: bytes
    server_url: str = ""
    """``http://127.0.0.1:PORT`` of the server that received it (for absolute next-page links)."""
    pairs: tuple[tuple[str, str], ...] = ()
    """Every query parameter in order, a repeated name once per value."""

    def url_for(self, **query: Any) -> str:
        """The absolute URL of this request's path with its query updated by ``query``."""
        merged = {**self.query, **{k: str(v) for k, v in query.items()}}
        return f"{self.server_url}{self.path}?{urlencode(merged)}"


@dataclass
class Reply:
    status: int = 200
    body: bytes | list[Any] | dict[str, Any] | None = None
    """A list or dict is JSON-encoded; bytes go out as they are."""
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Reply]


class JsonApi:
    """The server. ``start()``/``stop()``, or ``with JsonApi() as api:``; ``api.url`` once started."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.records: list[dict[str, Any]] = []
        self.errors: list[BaseException] = []
        self._routes: dict[str, Handler] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def route(self, path: str, handler: Handler) -> Self:
        self._routes[path] = handler
        return self

    def url_for(self, path: str, **query: Any) -> str:
        return f"{self.url}{path}" + (f"?{urlencode(query)}" if query else "")

    def requests_to(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    def start(self) -> Self:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_class(self))
        # A slow handler's thread must not hold up stop(); its client is gone by then.
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"json-api-{server.server_address[1]}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _answer(self, request: Request) -> Reply:
        self.requests.append(request)
        handler = self._routes.get(request.path)
        if handler is None:
            return Reply(404, {"error": "no route", "path": request.path})
        try:
            return handler(request)
        except Exception as exc:  # noqa: BLE001 - any handler bug: the test reads api.errors, the client a 500
            self.errors.append(exc)
            return Reply(500, {"error": f"{type(exc).__name__}: {exc}"})


def _handler_class(api: JsonApi) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            request = Request(self.command, parts.path, dict(parse_qsl(parts.query, keep_blank_values=True)),
                              {k.lower(): v for k, v in self.headers.items()}, body, api.url,
                              tuple(parse_qsl(parts.query, keep_blank_values=True)))
            reply = api._answer(request)
            payload = _encode(reply.body)
            headers = {k.lower(): v for k, v in reply.headers.items()}
            try:
                self.send_response(reply.status)
                if "content-type" not in headers and payload:
                    self.send_header("Content-Type", "application/json")
                for name, value in reply.headers.items():
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (a deadline test); nothing to say

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return _Handler


def _encode(body: bytes | list[Any] | dict[str, Any] | None) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return json.dumps(body).encode()


def _page_number(request: Request, param: str = "page") -> int | None:
    raw = request.query.get(param, "1")
    return int(raw) if raw.isdigit() and int(raw) >= 1 else None


def _bad_request(reason: str) -> Reply:
    return Reply(400, {"error": reason})


# --- canned handlers -------------------------------------------------------------------------


def next_url_pages(records: list[dict[str, Any]], page_size: int, *, style: str = "body",
                   records_key: str = "data", next_key: str = "next") -> Handler:
    """Pages of ``records`` chosen by the ``page`` query parameter (1-based, default 1).

    ``style="body"`` answers ``{"data": [...], "next": "<absolute url>" | null}``; ``style="link"``
    answers a JSON list and a ``Link: <url>; rel="next"`` header, absent on the last page. The last
    page is the one holding the last record (an empty list answers one empty page).
    """
    if style not in ("body", "link"):
        raise ValueError(f"style is 'body' or 'link', not {style!r}")

    def handler(request: Request) -> Reply:
        page = _page_number(request)
        if page is None:
            return _bad_request(f"page must be a positive integer, not {request.query['page']!r}")
        current = list(records)  # one consistent view per request while a test appends
        start = (page - 1) * page_size
        rows = current[start:start + page_size]
        next_url = request.url_for(page=page + 1) if start + page_size < len(current) else None
        if style == "link":
            return Reply(200, rows, {"Link": f'<{next_url}>; rel="next"'} if next_url else {})
        return Reply(200, {records_key: rows, next_key: next_url})

    return handler


def watermark_pages(records: list[dict[str, Any]], field: str, page_size: int, *, since_param: str = "since",
                    token_param: str = "page_token", records_key: str = "data",
                    token_key: str = "next_page_token", order: Callable[[Any], Any] | None = None) -> Handler:
    """Records whose ``field`` is strictly above ``since`` (absent: all), ordered by ``field`` then
    position, in pages of ``page_size``: ``{"data": [...], "next_page_token": "<token>" | null}``.

    ``since`` is compared as the records' values are typed (int, float, else str), or, given
    ``order``, as ``order`` maps both (``instant`` compares ISO-8601 text as instants). The token is
    opaque (base64 of the offset and the ``since`` it belongs to); a token sent with another
    ``since``, or one that does not decode, answers 400.
    """

    def handler(request: Request) -> Reply:
        since = request.query.get(since_param)
        offset = 0
        token = request.query.get(token_param)
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                offset, token_since = int(state["offset"]), state["since"]
            except (ValueError, KeyError, TypeError, binascii.Error):
                return _bad_request(f"{token_param} {token!r} is not a token this server issued")
            if token_since != since:
                return _bad_request(f"{token_param} belongs to {since_param}={token_since!r}, not {since!r}")
        current = list(records)
        key = order or (lambda value: value)
        try:
            matching = [(key(r[field]), i, r) for i, r in enumerate(current)
                        if since is None or key(r[field]) > key(since if order else _like(since, r[field]))]
        except (KeyError, ValueError) as exc:
            return _bad_request(f"{since_param}={since!r} does not compare with {field}: {exc}")
        matching.sort(key=lambda t: (t[0], t[1]))
        rows = [r for _, _, r in matching[offset:offset + page_size]]
        more = offset + page_size < len(matching)
        next_token = (base64.urlsafe_b64encode(json.dumps({"offset": offset + page_size, "since": since}).encode())
                      .decode() if more else None)
        return Reply(200, {records_key: rows, token_key: next_token})

    return handler


def instant(text: str) -> datetime:
    """An ISO-8601 stamp as an aware instant (a ``Z`` or an offset; none reads as UTC)."""
    stamp = datetime.fromisoformat(text)
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def _like(raw: str, value: Any) -> Any:
    """``raw`` (a query string) as the type of ``value``, so 10 > "9" compares as numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return raw
    if isinstance(value, int):
        try:
            return int(raw)
        except ValueError:
            return float(raw)
    return float(raw)


class _Countdown:
    """Answers True the first ``times`` calls, thread-safely (the server handles requests in threads)."""

    def __init__(self, times: int) -> None:
        self._left = times
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True


def rate_limited(times: int, retry_after_s: float, then: Handler) -> Handler:
    """Answers 429 with ``Retry-After: <seconds>`` to the first ``times`` requests, then ``then``.

    A whole number of seconds is sent as HTTP spells it (``2``); a fraction as a decimal (``0.25``).
    """
    countdown = _Countdown(times)
    header = str(int(retry_after_s)) if float(retry_after_s).is_integer() else f"{retry_after_s:g}"

    def handler(request: Request) -> Reply:
        if countdown.take():
            return Reply(429, {"error": "rate limited"}, {"Retry-After": header})
        return then(request)

    return handler


def server_errors(times: int, then: Handler, status: int = 503) -> Handler:
    """Answers ``status`` to the first ``times`` requests, then ``then``."""
    countdown = _Countdown(times)

    def handler(request: Request) -> Reply:
        if countdown.take():
            return Reply(status, {"error": f"server error {status}"})
        return then(request)

    return handler


TRUNCATED_JSON = b'{"data": [{"id": 1}, {"id": '


def malformed_json(then: Handler | None = None, *, times: int = 1) -> Handler:
    """Answers 200 with a truncated JSON body: always when ``then`` is None, else ``times`` times first."""
    countdown = _Countdown(times)

    def handler(request: Request) -> Reply:
        if then is None or countdown.take():
            return Reply(200, TRUNCATED_JSON, {"Content-Type": "application/json"})
        return then(request)

    return handler


def endless_pages(records_per_page: int, *, records_key: str = "data", next_key: str = "next") -> Handler:
    """Every page holds ``records_per_page`` records ``{"id": n}`` and a next URL, forever."""

    def handler(request: Request) -> Reply:
        page = _page_number(request)
        if page is None:
            return _bad_request(f"page must be a positive integer, not {request.query['page']!r}")
        first = (page - 1) * records_per_page
        rows = [{"id": first + i} for i in range(records_per_page)]
        return Reply(200, {records_key: rows, next_key: request.url_for(page=page + 1)})

    return handler


def json_body(body: list[Any] | dict[str, Any], status: int = 200) -> Handler:
    """Answers ``body`` to every request."""
    return lambda request: Reply(status, body)
