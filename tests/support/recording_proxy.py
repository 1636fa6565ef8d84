"""An HTTP proxy on loopback that forwards every request (unchanged, or without the headers it is
told to drop) and records it as it went by.

It stands between a client and a server a test does not control the wire of (a worker and serve's
relay): each request's method, path, headers and body bytes are kept exactly as sent, with the
status the upstream answered, so a test can replay a captured request byte for byte. A request
``unanswered`` picks is forwarded and recorded, but its answer is dropped: the proxy closes the
connection instead (a write that landed whose answer never arrived).
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host"}


@dataclass(frozen=True)
class Captured:
    """One request as the client sent it, and the status the upstream answered."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int


class RecordingProxy:
    """``http://127.0.0.1:<port>`` forwarding to ``upstream``; :attr:`captured` in arrival order."""

    def __init__(self, upstream: str, *, drop: frozenset[str] = frozenset(),
                 unanswered: Callable[[Captured], bool] | None = None) -> None:
        """``drop``: request headers (lower case) not forwarded; ``unanswered``: whether to drop the
        answer to a request (called once per request, after the upstream answered it)."""
        target = urlsplit(upstream)
        host, port = target.hostname or "127.0.0.1", target.port or 80
        self.captured: list[Captured] = []
        self._seen = threading.Condition()
        proxy = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | drop}
                conn = http.client.HTTPConnection(host, port, timeout=60)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                finally:
                    conn.close()
                captured = Captured(self.command, self.path, headers, body, answer.status)
                with proxy._seen:
                    proxy.captured.append(captured)
                    proxy._seen.notify_all()
                if unanswered is not None and unanswered(captured):
                    self.close_connection = True  # the upstream acted; its answer never reaches the client
                    return
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> RecordingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_until(self, predicate: Callable[[list[Captured]], bool], timeout: float = 120) -> bool:
        """Wait until ``predicate(captured)`` holds (or ``timeout``); whether it holds."""
        with self._seen:
            return self._seen.wait_for(lambda: predicate(self.captured), timeout)

    def wait_for(self, method: str, path: str, timeout: float = 120) -> Captured:
        """The first request of ``method`` on ``path`` forwarded, once it went by."""
        def hits(captured: list[Captured]) -> list[Captured]:
            return [c for c in captured if c.method == method and c.path == path]

        if not self.wait_until(lambda captured: bool(hits(captured)), timeout):
            raise AssertionError(f"no {method} {path} went through the proxy: {self.captured}")
        return hits(self.captured)[0]
