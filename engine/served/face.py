"""The served face: one threaded HTTP server hosting the routes of every service ``serve`` runs.

``contextful pipeline serve --http`` hosts the receive source (``engine.land.receive``) and the
Iceberg query gateway (``engine.export.gateway``) on one address; later the control plane's
routes join them. A service contributes :class:`Route` objects; a route's handler gets an
:class:`Exchange` (headers, a streamed body, JSON or streamed answers). Every answer to a
:class:`~storage.errors.ContextfulError` is ``{"error": <ErrorName>, "detail": <what it concerns>}``
with the error's ``http_status`` and its detail masked by the secret guard. ``GET /healthz``
answers ``{"ok": true}`` and a path no route serves ``404 NotFound``: neither names a route or a
pipeline to a caller that proved nothing. Request bodies are framed by ``Content-Length`` or
chunked transfer coding (:class:`Exchange`); an answer leaving body bytes unread closes the
connection, so no body is ever parsed as the next request.

:func:`bind_face` binds (port 0 picks one) and :meth:`ServedFace.serve` serves in a daemon thread
(:func:`serve_face` does both); :meth:`ServedFace.shutdown` stops accepting and gives requests in
flight a grace period to answer. An address that cannot be bound is a catalogue error naming the
option it came from: ``ArgumentInvalid`` when it is malformed or not this machine's to listen on,
``AddressInUse`` (transient) when another socket holds it.

Every log line the face writes (request lines at DEBUG, refused request lines, a failed route's
trace, a client that left) passes through :func:`mask_log`: credentials masked by the secret guard,
and a secret carried in a path (the resume route's ``/awake/<token>``) cut to its first characters,
so a log never holds a bearer secret whole.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import socket
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

from contextful.engine.guard import mask_message
from contextful.storage.errors import (
    AddressInUse,
    ArgumentInvalid,
    ContextfulError,
    InputUnreadable,
    NotFound,
    RequestBodyTooLarge,
    SpecInvalid,
    first_line,
)

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 30.0
_COPY_BYTES = 1 << 20
_MAX_LINE = 4096
_MAX_TRAILERS = 64
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() admits '²', which int() refuses
SECRET_PATH_PREFIXES = ("/awake/",)
"""Path literals a bearer secret follows: the resume route's ``/awake/<token>`` (engine.served.awake).
Masked in the log of every face, whatever it serves (a token sent to the wrong address is no less
secret), and found case-blind."""
SECRET_SHOWN = 6
"""Characters of a path secret a log line keeps: as the awakeable errors' token hints
(storage.errors), enough to tell tokens apart, too few to resolve one."""
_SECRET_SEGMENT = re.compile(f"({'|'.join(map(re.escape, SECRET_PATH_PREFIXES))})([^\\s/?#\"']+)", re.IGNORECASE)


@dataclass(frozen=True)
class Route:
    """``method`` requests whose path fully matches ``pattern`` go to ``handle(exchange, match)``."""

    method: str
    pattern: re.Pattern[str]
    handle: Callable[[Exchange, re.Match[str]], None]
    describe: str
    """How the route is spelled in a "no resource" answer, e.g. ``POST /pipelines/<id>/batches``."""


def mask_log(text: str, request_line: str = "") -> str:
    """A log line of the face as it may be written: credentials masked by the secret guard, and the
    path segment after each of :data:`SECRET_PATH_PREFIXES` cut to its first :data:`SECRET_SHOWN`
    characters wherever the line holds it (a request line, a refused request line's repr, a trace);
    a secret of ``request_line`` (the request being served) is cut wherever it appears, with or
    without its prefix (an exception's message naming the token).

    >>> mask_log('"GET /awake/Tvlyu7oPWzkPJOPsDpl4ZYID?x=1 HTTP/1.1" 200 -')
    '"GET /awake/Tvlyu7…?x=1 HTTP/1.1" 200 -'
    >>> mask_log("no awakeable Tvlyu7oPWzkPJOPsDpl4ZYID", "POST /awake/Tvlyu7oPWzkPJOPsDpl4ZYID HTTP/1.1")
    'no awakeable Tvlyu7…'
    """
    text = mask_message(text)
    for found in _SECRET_SEGMENT.finditer(request_line):
        secret = found.group(2)
        if len(secret) > SECRET_SHOWN:
            text = text.replace(secret, _hint(secret))
    return _SECRET_SEGMENT.sub(lambda found: found.group(1) + _hint(found.group(2)), text)


def _hint(secret: str) -> str:
    return secret if len(secret) <= SECRET_SHOWN else f"{secret[:SECRET_SHOWN]}…"


def parse_address(address: str | tuple[str, int], argument: str = "address") -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; an empty host listens on every interface) as a pair;
    ArgumentInvalid naming ``argument`` (the option it came from) when it is not one.

    >>> parse_address("127.0.0.1:0"), parse_address("[::1]:8080")
    (('127.0.0.1', 0), ('::1', 8080))
    """
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not _DIGITS.fullmatch(port) or int(port) > 65535:
        raise ArgumentInvalid(argument, address, "give HOST:PORT with a port from 0 to 65535 (0 picks a free one; "
                                                 "[::1]:PORT for IPv6)")
    return host.strip("[]"), int(port)


def _framing(headers: Message) -> tuple[ContextfulError, int] | None:
    """Why a request's body framing is refused (and the status), or None when the face reads it.

    Only ``Transfer-Encoding: chunked`` alone is read (411 for any other coding); a request with
    both framings, or with several or malformed ``Content-Length`` values, is refused (400): either
    could make the body's end, and so the next request, ambiguous.
    """
    codings = [c.strip().lower() for v in headers.get_all("Transfer-Encoding") or () for c in v.split(",")]
    lengths = headers.get_all("Content-Length") or []
    if codings and codings != ["chunked"]:
        return SpecInvalid(f"Transfer-Encoding {', '.join(codings)!r} is not read; send Content-Length or "
                           f"'chunked'"), 411
    if codings and lengths:
        return SpecInvalid("a request carries both Transfer-Encoding and Content-Length"), 400
    if len(lengths) > 1 or (lengths and not _DIGITS.fullmatch(lengths[0].strip())):
        return SpecInvalid(f"Content-Length {', '.join(lengths)!r} is not one byte count"), 400
    return None


class Exchange:
    """One request and its answer, as a route handler sees them.

    A body is framed by ``Content-Length`` or by ``Transfer-Encoding: chunked`` (decoded here, chunk
    extensions and trailers read and dropped); :attr:`framing` holds why any other framing is
    refused. An answer given while body bytes stay unread closes the connection, so they are never
    parsed as the next request.
    """

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
        parts = urlsplit(handler.path)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.headers = handler.headers
        self._read = 0
        self._done = False
        self.framing = _framing(handler.headers)
        """Why the body's framing is refused, with the status to answer; None when it reads."""
        self.chunked = self.framing is None and "Transfer-Encoding" in self.headers
        raw = self.headers.get("Content-Length")
        self._length: int | None = int(raw) if raw is not None and _DIGITS.fullmatch(raw.strip()) else None

    @property
    def body_pending(self) -> bool:
        """Whether the request has body bytes the handler has not read."""
        if self.chunked:
            return not self._done
        return self._length is not None and self._read < self._length

    @property
    def has_body(self) -> bool:
        """Whether the request is framed with a body (chunked, or a Content-Length above zero)."""
        return self.chunked or bool(self._length)

    def content_length(self) -> int | None:
        """The declared body length (None without a header); a malformed header is SpecInvalid."""
        raw = self.headers.get("Content-Length")
        if raw is None:
            return None
        if not _DIGITS.fullmatch(raw.strip()):
            raise SpecInvalid(f"Content-Length {raw!r} is not a byte count")
        self._length = int(raw)
        return self._length

    def check_length(self, limit: int, what: str) -> None:
        """RequestBodyTooLarge when the declared length is past ``limit`` (before a byte is read)."""
        length = None if self.chunked else self.content_length()
        if length is not None and length > limit:
            raise RequestBodyTooLarge(what, limit, declared=length)

    def copy_body(self, out: BinaryIO, what: str, limit: int | None = None) -> None:
        """Stream the body into ``out``, sending ``100 Continue`` first if it was asked for.

        Past ``limit`` bytes (declared, or counted while a chunked body streams) it raises
        RequestBodyTooLarge; what was written to ``out`` is the caller's to discard.
        """
        if self.framing is not None:
            raise self.framing[0]
        if limit is not None:
            self.check_length(limit, what)
        handler = self._handler
        if handler.continue_pending:
            handler.continue_pending = False
            handler.send_response_only(100)
            handler.end_headers()
        for chunk in (self._chunked(what) if self.chunked else self._sized(what)):
            self._read += len(chunk)
            if limit is not None and self._read > limit:
                raise RequestBodyTooLarge(what, limit)
            out.write(chunk)

    def _sized(self, what: str) -> Iterator[bytes]:
        length = self.content_length() or 0
        read = 0
        while read < length:
            chunk = self._handler.rfile.read(min(_COPY_BYTES, length - read))
            if not chunk:
                raise InputUnreadable(what, f"the body ended after {read} of {length} bytes")
            read += len(chunk)
            yield chunk

    def _chunked(self, what: str) -> Iterator[bytes]:
        """The data of a chunked body (RFC 9112 7.1): size lines in hex, data, CRLF, ..., 0, trailers."""
        rfile = self._handler.rfile
        while True:
            size_line = self._line(what)
            size_text = size_line.split(b";", 1)[0].strip()
            if not _CHUNK_SIZE.fullmatch(size_text):
                raise SpecInvalid(f"{what}: a chunked body has a malformed chunk size {size_text[:20]!r}")
            left = int(size_text, 16)
            if left == 0:
                for _ in range(_MAX_TRAILERS):  # trailer fields, dropped; a bounded count
                    if self._line(what) in (b"\r\n", b"\n"):
                        self._done = True
                        return
                raise SpecInvalid(f"{what}: a chunked body has more than {_MAX_TRAILERS} trailer lines")
            while left:
                data = rfile.read(min(_COPY_BYTES, left))
                if not data:
                    raise InputUnreadable(what, f"the chunked body ended inside a chunk after {self._read} bytes")
                left -= len(data)
                yield data
            if rfile.read(2) != b"\r\n":
                raise SpecInvalid(f"{what}: a chunk of a chunked body does not end with CRLF")

    def _line(self, what: str) -> bytes:
        line: bytes = self._handler.rfile.readline(_MAX_LINE + 1)
        if not line.endswith(b"\n"):
            if len(line) > _MAX_LINE:
                raise SpecInvalid(f"{what}: a chunked body has a line over {_MAX_LINE} bytes")
            raise InputUnreadable(what, f"the chunked body ended after {self._read} bytes")
        return line

    def read_body(self, limit: int, what: str) -> bytes:
        """The whole (small) body; RequestBodyTooLarge past ``limit`` bytes."""

        class _Buffer(list[bytes]):
            def write(self, chunk: bytes) -> None:
                self.append(chunk)

        buffer = _Buffer()
        self.copy_body(buffer, what, limit)  # type: ignore[arg-type]
        return b"".join(buffer)

    def send_json(self, status: int, doc: Any, *, close: bool = False, headers: Mapping[str, str] | None = None) -> None:
        self.send_bytes(status, json.dumps(doc, default=str).encode(), "application/json", close=close,
                        headers=headers)

    def send_error(self, exc: ContextfulError, *, status: int | None = None, close: bool = False) -> None:
        """``{"error", "detail"}`` at the error's HTTP status, the detail masked by the secret guard."""
        self.send_json(status or exc.http_status, {"error": exc.name, "detail": mask_message(exc.detail)},
                       close=close)

    def send_bytes(self, status: int, payload: bytes, content_type: str, *, close: bool = False,
                   headers: Mapping[str, str] | None = None) -> None:
        """One answer (with ``headers`` besides its type and length: caching, a page's security policy);
        it closes the connection when asked to or when body bytes stay unread."""
        handler = self._handler
        close = close or self.body_pending
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            if close:
                handler.close_connection = True
                handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            handler.log_masked(logging.INFO, f"served: {handler.address_string()} left before its {status} answer")

    def send_stream(self, status: int, chunks: Iterable[bytes], content_type: str) -> None:
        """A chunked answer (``Transfer-Encoding: chunked``), written as ``chunks`` yields."""
        handler = self._handler
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Transfer-Encoding", "chunked")
            if self.body_pending:
                handler.close_connection = True
                handler.send_header("Connection", "close")
            handler.end_headers()
            for chunk in chunks:
                if chunk:
                    handler.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            handler.log_masked(logging.INFO, f"served: {handler.address_string()} left during its {status} answer")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], routes: list[Route]) -> None:
        self.routes = routes
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
        # http.server's request lines (log_request) and refusals of malformed ones (log_error): the
        # raw request line holds the path, and the path may hold a bearer secret.
        self.log_masked(logging.DEBUG, f"{self.address_string()} {format % args}")

    def log_masked(self, level: int, message: str, *, trace: bool = False) -> None:
        """Log ``message`` (and the trace of the exception being handled, when ``trace``) through
        :func:`mask_log`: the one way the face writes a log line."""
        if trace:  # the trace is masked too: an exception's message or a frame's line may hold the path
            message = f"{message}\n{traceback.format_exc().rstrip()}"
        log.log(level, "%s", mask_log(message, getattr(self, "requestline", "")))

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        exchange = Exchange(self)
        if exchange.framing is not None:
            error, status = exchange.framing
            exchange.send_error(error, status=status, close=True)
            return
        if method == "GET" and exchange.path == "/healthz":
            exchange.send_json(200, {"ok": True})
            return
        for route in self.server.routes:
            match = route.pattern.fullmatch(exchange.path) if route.method == method else None
            if match is None:
                continue
            try:
                route.handle(exchange, match)
            except ContextfulError as exc:
                exchange.send_error(exc)
            except Exception:  # noqa: BLE001 - answered 500 and logged with its trace (masked)
                self.log_masked(logging.ERROR, f"served: {method} {exchange.path} failed", trace=True)
                exchange.send_json(500, {"error": "InternalError", "detail": "the server failed; see its log"},
                                   close=True)
            return
        exchange.send_error(NotFound(f"no resource {method} {exchange.path}"))


class ServedFace:
    """A bound served face: ``url``, ``address``; :meth:`serve` starts it, :meth:`shutdown` stops it."""

    def __init__(self, httpd: _HTTPServer) -> None:
        self._httpd = httpd
        host, port = str(httpd.server_address[0]), int(httpd.server_address[1])
        self.address: tuple[str, int] = (host, port)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self._serving: threading.Thread | None = None

    def serve(self, routes: list[Route]) -> ServedFace:
        """Serve ``routes`` in a daemon thread."""
        self._httpd.routes = routes
        self._serving = threading.Thread(target=self._httpd.serve_forever, name="served-http", daemon=True)
        self._serving.start()
        return self

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> bool:
        """Stop accepting; wait up to ``grace_s`` for requests in flight; whether all answered."""
        if self._serving is not None:  # shutdown() waits for serve_forever, which a face never served never runs
            self._httpd.shutdown()
        self._httpd.server_close()
        with self._httpd.idle:
            return self._httpd.idle.wait_for(lambda: self._httpd.active == 0, timeout=grace_s)


def bind_face(address: str | tuple[str, int], argument: str = "address") -> ServedFace:
    """Bind ``address`` (not serving yet). A socket holding it is AddressInUse (transient: it may free
    up); an address this machine cannot listen on (not its own, a name that does not resolve, a port
    it may not take) is ArgumentInvalid; both name ``argument``, the option the address came from."""
    host, port = parse_address(address, argument)
    server_class = _HTTP6Server if ":" in host else _HTTPServer
    try:
        return ServedFace(server_class((host, port), []))
    except OSError as exc:
        reason = exc.strerror or first_line(exc)
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(argument, f"{host}:{port}" if isinstance(address, tuple) else address, reason) from exc
        raise ArgumentInvalid(argument, address, f"cannot listen there: {reason}") from exc


def serve_face(address: str | tuple[str, int], routes: list[Route]) -> ServedFace:
    """Bind ``address`` and serve ``routes`` in a daemon thread."""
    return bind_face(address).serve(routes)
