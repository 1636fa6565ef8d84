"""The served face: one threaded HTTP server hosting the routes of every service ``serve`` runs.

``contextful pipeline serve --http`` hosts the receive source (``engine.land.receive``) and the
Iceberg query gateway (``engine.export.gateway``) on one address; later the control plane's
routes join them. A service contributes :class:`Route` objects; a route's handler gets an
:class:`Exchange` (headers, a streamed body, JSON or streamed answers). Every answer to a
:class:`~storage.errors.ContextfulError` is ``{"error": <ErrorName>, "detail": <what it concerns>}``
with the error's ``http_status``. ``GET /healthz`` answers ``{"ok": true, <each service's health>}``.

:func:`serve_face` binds (port 0 picks one) and serves in a daemon thread; :meth:`ServedFace.shutdown`
stops accepting and gives requests in flight a grace period to answer.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

from storage.errors import ContextfulError, InputUnreadable, NotFound, SpecInvalid

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 30.0
_COPY_BYTES = 1 << 20


@dataclass(frozen=True)
class Route:
    """``method`` requests whose path fully matches ``pattern`` go to ``handle(exchange, match)``."""

    method: str
    pattern: re.Pattern[str]
    handle: Callable[[Exchange, re.Match[str]], None]
    describe: str
    """How the route is spelled in a "no resource" answer, e.g. ``POST /pipelines/<id>/batches``."""


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; an empty host listens on every interface) as a pair.

    >>> parse_address("127.0.0.1:0"), parse_address("[::1]:8080")
    (('127.0.0.1', 0), ('::1', 8080))
    """
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SpecInvalid(f"--http {address!r}: give HOST:PORT (port 0 picks a free one)")
    return host.strip("[]"), int(port)


class Exchange:
    """One request and its answer, as a route handler sees them."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
        parts = urlsplit(handler.path)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.headers = handler.headers
        self._read = 0
        raw = self.headers.get("Content-Length")
        self._length: int | None = int(raw) if raw is not None and raw.strip().isdigit() else None

    @property
    def body_pending(self) -> bool:
        """Whether the request declared body bytes the handler has not read."""
        return self._length is not None and self._read < self._length

    def content_length(self) -> int | None:
        """The declared body length (None without a header); a malformed header is SpecInvalid."""
        raw = self.headers.get("Content-Length")
        if raw is None:
            return None
        if not raw.strip().isdigit():
            raise SpecInvalid(f"Content-Length {raw!r} is not a byte count")
        self._length = int(raw)
        return self._length

    def copy_body(self, out: BinaryIO, what: str) -> None:
        """Stream the declared body into ``out``, sending ``100 Continue`` first if it was asked for."""
        length = self.content_length() or 0
        handler = self._handler
        if handler.continue_pending:
            handler.continue_pending = False
            handler.send_response_only(100)
            handler.end_headers()
        while self._read < length:
            chunk = handler.rfile.read(min(_COPY_BYTES, length - self._read))
            if not chunk:
                raise InputUnreadable(what, f"the body ended after {self._read} of {length} bytes")
            out.write(chunk)
            self._read += len(chunk)

    def read_body(self, limit: int, what: str) -> bytes:
        """The whole (small) body; SpecInvalid past ``limit`` bytes, before reading any."""
        length = self.content_length() or 0
        if length > limit:
            raise SpecInvalid(f"{what}: a body of {length} bytes is over the {limit}-byte limit")

        class _Buffer(list[bytes]):
            def write(self, chunk: bytes) -> None:
                self.append(chunk)

        buffer = _Buffer()
        self.copy_body(buffer, what)  # type: ignore[arg-type]
        return b"".join(buffer)

    def send_json(self, status: int, doc: Any, *, close: bool = False) -> None:
        self.send_bytes(status, json.dumps(doc, default=str).encode(), "application/json", close=close)

    def send_error(self, exc: ContextfulError, *, status: int | None = None, close: bool | None = None) -> None:
        """``{"error", "detail"}`` at the error's HTTP status; closes when body bytes stay unread."""
        self.send_json(status or exc.http_status, {"error": exc.name, "detail": exc.detail},
                       close=self.body_pending if close is None else close)

    def send_bytes(self, status: int, payload: bytes, content_type: str, *, close: bool = False) -> None:
        handler = self._handler
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(payload)))
            if close:
                handler.close_connection = True
                handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            log.info("served: %s left before its %d answer", handler.address_string(), status)

    def send_stream(self, status: int, chunks: Iterable[bytes], content_type: str) -> None:
        """A chunked answer (``Transfer-Encoding: chunked``), written as ``chunks`` yields."""
        handler = self._handler
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for chunk in chunks:
                if chunk:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            log.info("served: %s left during its %d answer", handler.address_string(), status)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], routes: list[Route], health: Callable[[], dict[str, Any]]) -> None:
        self.routes = routes
        self.health = health
        self.active = 0
        self.idle = threading.Condition()
        super().__init__(address, _Handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self.idle:
            self.active += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.idle:
                self.active -= 1
                self.idle.notify_all()


class _HTTP6Server(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    continue_pending = False
    timeout = 120  # seconds a client may stall while sending a body

    def handle_expect_100(self) -> bool:
        # ``Expect: 100-continue`` is answered only when a handler wants the body: a refused
        # request answers before the sender uploads a byte.
        self.continue_pending = True
        return True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        exchange = Exchange(self)
        if method == "GET" and exchange.path == "/healthz":
            exchange.send_json(200, {"ok": True, **self.server.health()})
            return
        for route in self.server.routes:
            match = route.pattern.fullmatch(exchange.path) if route.method == method else None
            if match is None:
                continue
            try:
                route.handle(exchange, match)
            except ContextfulError as exc:
                exchange.send_error(exc)
            except Exception as exc:
                log.exception("served: %s %s failed", method, exchange.path)
                exchange.send_json(500, {"error": type(exc).__name__, "detail": str(exc)}, close=True)
            return
        known = "; ".join(r.describe for r in self.server.routes) or "none"
        has_body = self.headers.get("Content-Length", "0").strip() not in ("", "0")
        exchange.send_error(NotFound(f"no resource {method} {exchange.path} (served: {known})"), close=has_body)


class ServedFace:
    """A running served face: ``url``, ``address``, ``shutdown()``."""

    def __init__(self, httpd: _HTTPServer) -> None:
        self._httpd = httpd
        host, port = str(httpd.server_address[0]), int(httpd.server_address[1])
        self.address: tuple[str, int] = (host, port)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self._serving = threading.Thread(target=httpd.serve_forever, name="served-http", daemon=True)
        self._serving.start()

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> bool:
        """Stop accepting; wait up to ``grace_s`` for requests in flight; whether all answered."""
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._httpd.idle:
            return self._httpd.idle.wait_for(lambda: self._httpd.active == 0, timeout=grace_s)


def serve_face(address: str | tuple[str, int], routes: list[Route],
               health: Callable[[], dict[str, Any]] | None = None) -> ServedFace:
    """Bind ``address`` and serve ``routes`` in a daemon thread."""
    host, port = parse_address(address)
    server_class = _HTTP6Server if ":" in host else _HTTPServer
    return ServedFace(server_class((host, port), routes, health or dict))
