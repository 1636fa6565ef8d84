"""A reference delegate: an HTTP service that enriches each row a store-driven job hands it.

docs/jobs.md ("Delegates") walks through it; the delegate tests run it as a real child process on
loopback. It holds no state of its own beyond its request log and a script of answers:

- it admits ``POST`` only with a request signed under ``CONTEXTFUL_WORKER_KEY`` as ``call`` over its
  timestamp and body (``engine.control.worker_key``), answering 401 otherwise;
- it answers ``ok`` with the row enriched for the job's first table: the row's columns, plus
  ``chars`` (the characters of its text values) and ``words`` (their whitespace-separated words),
  signed as ``answer`` bound to the request's ``idempotency_key``.

``--log FILE`` appends one JSON line per request received (its headers of note and its envelope);
``--script FILE`` names a JSON object ``{entity key: [behaviour, ...]}`` (the envelope's
``entity.key``: the item's key, or the ``entity_key`` column its job's ``isolated_items`` names),
each request for that key
taking the next behaviour (then ``ok``): ``ok``, ``transient``, ``permanent``, ``defer:<retry_at>``,
``status:<code>``, ``unsigned``, ``skewed`` (301 s old), ``rebound`` (bound to another
request's key), ``oversize``, ``outcome:<word>``, ``hold:<seconds>``
(answer ok after that long: a delegate slower than its timeout), ``gate:<fifo>`` (hold the call
until a writer opens the named pipe ``<fifo>`` and closes it, then answer ok: a test opening the
pipe learns the call is held, and closing it lets the call return). It prints ``listening <url>``
once it accepts requests, then serves until terminated::

    CONTEXTFUL_WORKER_KEY=... python -m contextful.datasets.enrich_delegate --port 9005
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from contextful.engine.control.worker_key import (
    KEY_VARIABLE,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WorkerKey,
    worker_key,
    worker_key_problem,
)

OVERSIZE_BYTES = (1 << 20) + 1


def enrich(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``chars`` and ``words`` counted over its text values.

    >>> enrich({"doc_id": "d1", "body": "two words"})
    {'doc_id': 'd1', 'body': 'two words', 'chars': 11, 'words': 3}
    """
    texts = [value for value in row.values() if isinstance(value, str)]
    return {**row, "chars": sum(len(t) for t in texts), "words": sum(len(t.split()) for t in texts)}


class Delegate:
    """The service's state: its key, its script of behaviours and its request log."""

    def __init__(self, key: WorkerKey, script: dict[str, list[str]], log: Path | None) -> None:
        self.key, self.script, self.log = key, script, log
        self.lock = threading.Lock()

    def behaviour(self, item: str) -> str:
        with self.lock:
            queue = self.script.get(item) or []
            return queue.pop(0) if queue else "ok"

    def record(self, entry: dict[str, Any]) -> None:
        if self.log is None:
            return
        with self.lock, self.log.open("a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is the --log file."""

    def do_POST(self) -> None:
        delegate = self.server.delegate
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        problem = delegate.key.problem("call", self.headers.get(TIMESTAMP_HEADER), self.headers.get(SIGNATURE_HEADER),
                                       body, now_s=int(time.time()))
        envelope = json.loads(body) if problem is None else None
        delegate.record({"path": self.path, "host": self.headers.get("Host"), "signed": problem is None,
                         "idempotency_key_header": self.headers.get("Idempotency-Key"), "envelope": envelope})
        if envelope is None:
            return self._send(401, b'{"error": "unsigned"}', {})
        behaviour = delegate.behaviour(str(envelope["entity"]["key"]))
        answer: dict[str, Any] = {"outcome": "ok", "rows": {envelope["tables"][0]: [enrich(envelope["row"])]}}
        kind, _, arg = behaviour.partition(":")
        if kind in ("transient", "permanent"):
            answer = {"outcome": kind, "reason": f"scripted {kind}"}
        elif kind == "defer":
            answer = {"outcome": "defer", "retry_at": arg}
        elif kind == "outcome":
            answer = {"outcome": arg}
        elif kind == "hold":
            time.sleep(float(arg))  # the scripted slowness itself: this delegate is slower than its timeout
        elif kind == "gate":
            with open(arg, "rb") as gate:  # opens once the test holds the other end; EOF once it lets go
                gate.read()
        raw = json.dumps(answer).encode()
        if kind == "oversize":
            raw = b" " * OVERSIZE_BYTES + raw
        stamp = int(time.time()) - (301 if kind == "skewed" else 0)
        bound = "0" * 64 if kind == "rebound" else envelope["idempotency_key"]  # rebound: another request's
        headers = {} if kind == "unsigned" else delegate.key.headers("answer", stamp, raw, bound=bound)
        self._send(int(arg) if kind == "status" else 200, raw, headers)

    def _send(self, status: int, raw: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller gave up waiting (its timeout): nothing to answer


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], delegate: Delegate) -> None:
        super().__init__(address, Handler)
        self.delegate = delegate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A reference delegate that enriches rows.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", type=Path)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args(argv)
    key = worker_key()
    if key is None:
        print(f"error: {worker_key_problem(os.environ.get(KEY_VARIABLE))}", file=sys.stderr)
        return 2
    script = json.loads(args.script.read_text()) if args.script else {}
    server = Server((args.host, args.port), Delegate(key, script, args.log))
    print(f"listening http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
