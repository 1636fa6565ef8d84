"""A loopback TCP proxy in front of the real PostgreSQL that cuts a connection at a COMMIT.

It forwards the wire protocol message by message in both directions (clients must connect with
``sslmode=disable`` so every message after the startup packet is framed as type byte + length).
Armed with ``cut_at``:

- ``"reply"``: when the server's CommandComplete for ``COMMIT`` arrives, neither it nor anything
  after it is forwarded and both sockets close — the server committed, the client never hears it;
- ``"request"``: when the client's ``COMMIT`` arrives it is not forwarded and both sockets close —
  the server never commits.

Each arming cuts one connection and sets ``cut``. ``refuse`` closes new connections at once (the
catalog unreachable); ``arm(..., then_refuse=True)`` sets it at the moment of the cut.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator


class PgCutProxy:
    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.cut_at: str | None = None
        self.refuse = False
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._then_refuse = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, cut_at: str, *, then_refuse: bool = False) -> None:
        """Cut the next COMMIT at ``cut_at``; with ``then_refuse``, refuse every connection after it."""
        self.cut.clear()
        self._then_refuse = then_refuse
        self.cut_at = cut_at

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            server = socket.create_connection(self._upstream)
            pair = (client, server)
            threading.Thread(target=self._pump, args=(client, server, pair, "request", True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, pair, "reply", False), daemon=True).start()

    def _take(self, side: str) -> bool:
        """Whether this COMMIT is the one to cut at (each arming cuts once)."""
        with self._lock:
            if self.cut_at != side:
                return False
            self.cut_at = None
            self.refuse = self.refuse or self._then_refuse
            return True

    def _pump(self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket],
              side: str, startup: bool) -> None:
        try:
            for message in _messages(src, startup):
                if _is_commit(message, side) and self._take(side):
                    self.cut.set()
                    break
                dst.sendall(message)
        except OSError:
            pass
        for s in pair:  # shutdown, not just close: it wakes the other pump and sends both peers a FIN
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def _is_commit(message: bytes, side: str) -> bool:
    kind, body = message[:1], message[5:]
    if side == "reply":
        return kind == b"C" and body.startswith(b"COMMIT\0")
    # A simple Query, or the Parse of the extended protocol, carrying COMMIT.
    return kind in (b"Q", b"P") and b"COMMIT" in body.upper()


def _messages(src: socket.socket, startup: bool) -> Iterator[bytes]:
    """The protocol messages read from ``src``: the untyped startup packet first on the client side."""
    buffer = b""
    while True:
        header = 4 if startup else 5
        while len(buffer) >= header:
            length = struct.unpack("!I", buffer[header - 4:header])[0]
            size = length if startup else length + 1
            if len(buffer) < size:
                break
            yield buffer[:size]
            buffer = buffer[size:]
            startup = False
            header = 5
        chunk = src.recv(65536)
        if not chunk:
            return
        buffer += chunk
