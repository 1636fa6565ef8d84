"""A PostgreSQL wire-protocol proxy on loopback that drops connections at chosen moments.

Fault injection for the catalog's commit protocol against a real server: clients connect to the
proxy's DSN and everything is forwarded both ways, byte for byte, until an armed fault fires:

- ``cut_before(trigger)``: the next client message holding ``trigger`` (e.g. the commit-log
  ``INSERT``) is not forwarded; both sockets close. The server never sees a ``COMMIT`` for that
  transaction and rolls it back.
- ``cut_after_commit(trigger)``: a transaction in which the client sent ``trigger`` (``b""``: any
  transaction) commits on the server; the proxy swallows the server's ``CommandComplete COMMIT`` and closes both sockets, so
  the client never hears the outcome (the committed-then-dropped case).
- ``refuse()``: new connections are closed at once (an unreachable server) until ``heal()``.

Each fault fires once (``fired`` is set when it did). Server messages are parsed by their framing
(a type byte and a 4-byte length); the proxy asks libpq not to negotiate SSL or GSS encryption.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType
from typing import Self


def _dsn_parts(dsn: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in dsn.split())


class PgProxy:
    def __init__(self, server_dsn: str) -> None:
        parts = _dsn_parts(server_dsn)
        self._upstream = (parts.get("host", "127.0.0.1"), int(parts.get("port", "5432")))
        self._rest = {k: v for k, v in parts.items() if k not in ("host", "port")}
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode: str | None = None
        self._trigger = b""
        self._refusing = False
        self._then_refuse = False
        self.fired = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True, name="pg-proxy")

    # --- faults ---------------------------------------------------------------------------------

    def dsn(self, application_name: str = "contextful-test") -> str:
        rest = " ".join(f"{k}={v}" for k, v in self._rest.items())
        return (f"host=127.0.0.1 port={self.port} {rest} sslmode=disable gssencmode=disable"
                f" application_name={application_name}")

    def cut_before(self, trigger: bytes, then_refuse: bool = False) -> None:
        self._then_refuse = then_refuse
        self._arm("before", trigger)

    def cut_after_commit(self, trigger: bytes, then_refuse: bool = False) -> None:
        """``then_refuse``: from the cut on, refuse new connections too (the outcome cannot be
        learned until :meth:`heal`)."""
        self._then_refuse = then_refuse
        self._arm("after-commit", trigger)

    def refuse(self) -> None:
        """Close every new connection at once, and every open one now."""
        with self._lock:
            self._refusing = True
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def heal(self) -> None:
        with self._lock:
            self._refusing = self._then_refuse = False
            self._mode = None

    def _arm(self, mode: str, trigger: bytes) -> None:
        with self._lock:
            self._mode, self._trigger = mode, trigger
            self.fired.clear()

    # --- plumbing -------------------------------------------------------------------------------

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closed = True
        _close(self._listener)
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _close(sock)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                _close(client)
                continue
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                _close(client)
                continue
            for sock in (client, server):  # no Nagle delay on the many small protocol messages
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = _Pair(self, client, server)
            with self._lock:
                self._sockets.update((client, server))
            threading.Thread(target=pair.client_to_server, daemon=True).start()
            threading.Thread(target=pair.server_to_client, daemon=True).start()

    def _take(self, mode: str) -> bytes | None:
        """The trigger when ``mode`` is armed (and disarm it when it fires)."""
        with self._lock:
            return self._trigger if self._mode == mode else None

    def _fire(self) -> None:
        with self._lock:
            self._mode = None
            if self._then_refuse:
                self._refusing = True
        self.fired.set()


class _Pair:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: PgProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.in_armed_txn = False
        self._tail = b""

    def cut(self) -> None:
        _close(self.client)
        _close(self.server)

    def client_to_server(self) -> None:
        try:
            while True:
                data = self.client.recv(65536)
                if not data:
                    break
                tail, self._tail = self._tail, (self._tail + data)[-256:]
                trigger = self.proxy._take("before")
                if trigger is not None and _holds(tail, data, trigger):
                    self.proxy._fire()
                    self.cut()
                    return
                trigger = self.proxy._take("after-commit")
                if trigger is not None and _holds(tail, data, trigger):
                    self.in_armed_txn = True
                self.server.sendall(data)
        except OSError:
            pass
        self.cut()

    def server_to_client(self) -> None:
        buffer = b""
        try:
            while True:
                data = self.server.recv(65536)
                if not data:
                    break
                buffer += data
                forward = b""
                while len(buffer) >= 5:  # a type byte and a length that counts itself
                    length = struct.unpack("!I", buffer[1:5])[0]
                    if len(buffer) < 1 + length:
                        break
                    message, buffer = buffer[: 1 + length], buffer[1 + length :]
                    if (message[:1] == b"C" and message[5:].rstrip(b"\0") == b"COMMIT" and self.in_armed_txn
                            and self.proxy._take("after-commit") is not None):
                        self.client.sendall(forward)
                        self.proxy._fire()
                        self.cut()  # the server committed; the client never hears it
                        return
                    forward += message
                if forward:
                    self.client.sendall(forward)
        except OSError:
            pass
        self.cut()


def _holds(tail: bytes, data: bytes, trigger: bytes) -> bool:
    """Whether ``data`` holds ``trigger``, or completes one begun at the end of ``tail`` (bytes
    already forwarded); an empty trigger matches any message."""
    return trigger in tail[len(tail) - len(trigger) + 1 :] + data if trigger else True


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
