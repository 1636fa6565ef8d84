"""The receive HTTP face and the flow of one pushed batch.

Implements ``run.land.receive-spool`` and ``run.land.receive-key-expired`` at the door, and drives
``group`` for ``run.land.receive-group`` and ``run.land.receive-batch-key``. One batch, in order:

1. its key is looked up (the first attempt recorded now if it is new). Past ``key_retention_secs``
   since the first attempt the receiver raises ``ReceiveBatchKeyExpired`` (410) before reading a
   byte of the body, and nothing lands. A key that committed replays its recorded answer
   (``"replayed": true``) and lands nothing;
2. the body is streamed to a file and decoded alone in a bounded decoder child, typed and checked
   against the table's schema, so a malformed body answers alone (400) and touches nothing else;
3. the batch is spooled, synced, to the pipeline's queue;
4. the receiver waits for the pipeline's land lock; holding it, it lands spooled groups (its own
   member among them, and everything spooled before it) unless another holder already did, then
   answers from the key index. A 2xx answer means the batch's run committed: a receiver killed
   at any point loses no acknowledged batch, and a retry under the same key lands it once.

HTTP::

    POST /pipelines/<id>/batches     Contextful-Batch-Key: <key>   (body: ndjson, or a JSON array)
      200 {"pipeline", "key", "replayed", "tables": [{"table", "run_id", "commit_seq", "rows", "group"}]}
      4xx/5xx {"error": <ErrorName>, "detail": <what it concerns>}
    GET /healthz                     200 {"ok": true, "pipelines": [...]}

Errors answer with the error's ``http_status``, except a malformed body (``InputMalformed``), which
answers 400. ``Content-Encoding: gzip`` or ``zstd`` bodies are decoded as such. A request with
``Expect: 100-continue`` gets its ``100 Continue`` only once the receiver wants the body, so a
refused key costs the sender no upload. An answer given without reading the body closes the
connection.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import pyarrow as pa

from engine.config.manifest import Manifest, PipelineSpec
from engine.land.decode import Decoder
from engine.land.receive.config import ReceiveConfig
from engine.land.receive.group import PushHook, TableAnswer, committed_answer, drain, land_pending
from engine.land.receive.spool import LANDED, Member, Queue, key_digest
from engine.land.sink import prepare_batch
from engine.land.typed import read_types
from storage import Store
from storage import errors as catalogue
from storage.clock import Clock, SystemClock
from storage.errors import (
    ContextfulError,
    InputMalformed,
    InputUnreadable,
    ManifestValueInvalid,
    NotFound,
    ParseCrashed,
    ReceiveBatchKeyExpired,
    SpecInvalid,
)
from storage.manifest import schema_from_text
from storage.reconcile import conform, reconcile
from storage.reserved import check_modality

log = logging.getLogger(__name__)

KEY_HEADER = "Contextful-Batch-Key"
MAX_KEY_CHARS = 256
ENCODINGS = {"gzip": ".gz", "x-gzip": ".gz", "zstd": ".zst"}
SHUTDOWN_GRACE_S = 30.0
_COPY_BYTES = 1 << 20
_BATCHES = re.compile(r"/pipelines/([^/]+)/batches/?")

BodyWriter = Callable[[BinaryIO], None]
"""Writes the request body into the file it is given (the receiver calls it at most once)."""


@dataclass(frozen=True)
class Answer:
    """The answer to one batch: where its key landed, and whether this request replayed it."""

    pipeline: str
    key: str
    replayed: bool
    tables: list[TableAnswer] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "key": self.key, "replayed": self.replayed,
                "tables": [t.to_json() for t in self.tables]}


class Receiver:
    """Receives the batches of one ``receive`` pipeline (thread-safe; one per pipeline and process)."""

    def __init__(self, store: Store, spec: PipelineSpec, *, queue_root: str | Path, decoder: Decoder,
                 clock: Clock | None = None, push: PushHook | None = None) -> None:
        if spec.normalize != "nested":
            raise ManifestValueInvalid(f"[[pipeline]] {spec.id!r}", "normalize",
                                       f"{spec.normalize!r} normalization is not available in this version; use 'nested'")
        self.store = store
        self.spec = spec
        self.config = ReceiveConfig.from_config(spec.source.config, f"[[pipeline]] {spec.id!r} source.config")
        self.types = read_types(spec.types)
        self.queue = Queue(queue_root, spec.id)
        self.decoder = decoder
        self.clock = clock or SystemClock()
        self.push = push

    def receive(self, key: str | None, body: BodyWriter, *, encoding: str | None = None) -> Answer:
        """Land (or replay) one batch; raise its error. ``body`` is called only once the key is live."""
        key = self._check_key(key)
        digest = key_digest(self.spec.id, key)
        now = self.clock.now_us()
        record = self.queue.index.touch(digest, key, now)
        age_s = (now - record.first_attempt_us) / 1_000_000
        if age_s > self.config.key_retention_secs:
            raise ReceiveBatchKeyExpired(self.spec.id, key, age_s, self.config.key_retention_secs)
        if record.state == LANDED:
            return Answer(self.spec.id, key, True, [TableAnswer.from_json(t) for t in record.tables])
        stored = committed_answer(self.store, self.spec, digest)
        if stored is not None:  # committed by a leader that died before the index learnt it
            return Answer(self.spec.id, key, True, stored)
        suffix = self._suffix(key, encoding)
        member = self._spool(key, digest, body, suffix, now)
        with self.queue.land_lock():
            land_pending(self.store, self.spec, self.queue, self.config, clock=self.clock, until=member.id,
                         push=self.push)
        return self._answer(member)

    def recover(self) -> None:
        """Land every spooled member, a dead receiver's included (a server does this on start)."""
        self.queue.sweep()
        drain(self.store, self.spec, self.queue, self.config, clock=self.clock, push=self.push)

    def close(self) -> None:
        self.queue.close()

    # --- one batch ------------------------------------------------------------------------------

    def _check_key(self, key: str | None) -> str:
        if key is None or not key.strip():
            raise SpecInvalid(f"pipeline {self.spec.id!r}: a batch needs a {KEY_HEADER} header naming its key")
        if len(key) > MAX_KEY_CHARS or not key.isprintable():
            raise SpecInvalid(f"pipeline {self.spec.id!r}: a batch key is at most {MAX_KEY_CHARS} printable "
                              f"characters, not {key[:40]!r}…")
        return key

    def _suffix(self, key: str, encoding: str | None) -> str:
        coding = (encoding or "identity").strip().lower()
        if coding == "identity":
            return ""
        if coding not in ENCODINGS:
            raise InputUnreadable(f"batch {key!r}", f"Content-Encoding {coding!r} is not one of identity, "
                                                    f"{', '.join(ENCODINGS)}")
        return ENCODINGS[coding]

    def _spool(self, key: str, digest: str, body: BodyWriter, suffix: str, now: int) -> Member:
        path = self.queue.body_path(suffix)
        try:
            with open(path, "wb") as f:
                body(f)
            with open(path, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            size = path.stat().st_size
            data = self._decode(key, path)
        finally:
            path.unlink(missing_ok=True)
        return self.queue.spool(key, digest, data, received_us=now, body_bytes=size,
                                body_sha256=sha)

    def _decode(self, key: str, path: Path) -> dict[str, pa.Table]:
        """The body as the tables it lands in — typed, guarded, normalized — each validated against
        its table's schema alone."""
        where = f"batch {key!r} of pipeline {self.spec.id!r}"
        try:
            batches = list(self.decoder.decode(str(path), self.config.format))
        except InputMalformed as exc:
            raise InputMalformed(where, exc.line, exc.reason) from exc
        except InputUnreadable as exc:
            raise InputUnreadable(where, exc.fields["reason"]) from exc
        except ParseCrashed as exc:
            raise ParseCrashed(where, exc.bound, exc.reason) from exc
        table = self.spec.table
        if not batches:
            data = pa.table({})
        else:
            schema = batches[-1].schema  # a later block may have widened it: earlier batches conform
            data = pa.concat_tables([conform(pa.Table.from_batches([b]), schema, table) for b in batches])
        tables, _masked = prepare_batch(self.spec, data, key_digest(self.spec.id, key), types=self.types,
                                        pull=f"batch {key!r}")
        for name, frame in tables.items():
            check_modality(name, frame)
            head = self.store.catalog.load_head(name)
            reconcile(name, schema_from_text(head.schema) if head is not None and head.schema else None, frame.schema)
        return tables

    def _answer(self, member: Member) -> Answer:
        record = self.queue.index.get(member.digest)
        if record is not None and record.state == LANDED:
            return Answer(self.spec.id, member.key, record.member != member.id,
                          [TableAnswer.from_json(t) for t in record.tables])
        failure = self.queue.index.failure(member.id)
        if failure is not None:
            raise _revive(failure)
        raise RuntimeError(f"batch {member.key!r} left the queue neither landed nor failed")


def _revive(failure: dict[str, Any]) -> ContextfulError:
    """The catalogue error a leader recorded for a member (it may have been another process)."""
    cls = getattr(catalogue, failure["name"], None)
    if not (isinstance(cls, type) and issubclass(cls, ContextfulError)):
        cls = catalogue.Incompatible
    error = cls.__new__(cls)
    ContextfulError.__init__(error, failure["detail"], **failure.get("fields", {}))
    return error


# --- HTTP --------------------------------------------------------------------------------------


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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], receivers: dict[str, Receiver]) -> None:
        self.receivers = receivers
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
        # ``Expect: 100-continue`` is answered only when the body is wanted: an expired key, an
        # unknown pipeline or a refused encoding answers before the sender uploads a byte.
        self.continue_pending = True
        return True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, doc: dict[str, Any], *, close: bool = False) -> None:
        payload = json.dumps(doc).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if close:
                self.close_connection = True
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the sender left; a retry replays its key
            self.close_connection = True
            log.info("receive: %s left before its %d answer", self.address_string(), status)

    def _error(self, exc: ContextfulError, *, close: bool) -> None:
        status = 400 if isinstance(exc, InputMalformed) else exc.http_status
        self._send(status, {"error": exc.name, "detail": exc.detail}, close=close)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/healthz":
            self._send(200, {"ok": True, "pipelines": sorted(self.server.receivers)})
        else:
            self._error(NotFound(f"no resource {self.path}; POST /pipelines/<id>/batches"), close=False)

    def do_POST(self) -> None:
        length_header = self.headers.get("Content-Length")
        match = _BATCHES.fullmatch(urlsplit(self.path).path)
        receiver = self.server.receivers.get(match.group(1)) if match else None
        if receiver is None:
            known = ", ".join(sorted(self.server.receivers)) or "none"
            self._error(NotFound(f"no receive pipeline at {self.path} (receiving: {known})"), close=True)
            return
        if length_header is None or not length_header.strip().isdigit():
            error = SpecInvalid(f"a batch needs a Content-Length header, not {length_header!r}")
            self._send(411 if length_header is None else 400, {"error": error.name, "detail": error.detail},
                       close=True)
            return
        length = int(length_header)
        read = 0

        def body(out: BinaryIO) -> None:
            nonlocal read
            if self.continue_pending:
                self.continue_pending = False
                self.send_response_only(100)
                self.end_headers()
            while read < length:
                chunk = self.rfile.read(min(_COPY_BYTES, length - read))
                if not chunk:
                    raise InputUnreadable(f"batch {self.headers.get(KEY_HEADER)!r}",
                                          f"the body ended after {read} of {length} bytes")
                out.write(chunk)
                read += len(chunk)

        try:
            answer = receiver.receive(self.headers.get(KEY_HEADER), body,
                                      encoding=self.headers.get("Content-Encoding"))
        except ContextfulError as exc:
            self._error(exc, close=read < length)
            return
        except Exception as exc:
            log.exception("receive %s: batch failed", receiver.spec.id)
            self._send(500, {"error": type(exc).__name__, "detail": str(exc)}, close=True)
            return
        self._send(200, answer.to_json(), close=read < length)


class ReceiveServer:
    """A running receive server: ``url``, ``address``, ``shutdown()``."""

    def __init__(self, httpd: _HTTPServer, store: Store, receivers: dict[str, Receiver]) -> None:
        self._httpd = httpd
        self._store = store
        self.receivers = receivers
        host, port = str(httpd.server_address[0]), int(httpd.server_address[1])
        self.address: tuple[str, int] = (host, port)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{port}"
        self._serving = threading.Thread(target=httpd.serve_forever, name="receive-http", daemon=True)
        self._recovering = [threading.Thread(target=self._recover, args=(r,), name=f"receive-recover-{r.spec.id}",
                                             daemon=True) for r in receivers.values()]

    def _start(self) -> None:
        self._serving.start()
        for thread in self._recovering:
            thread.start()

    @staticmethod
    def _recover(receiver: Receiver) -> None:
        try:
            receiver.recover()
        except Exception as exc:  # noqa: BLE001 - the next batch's leader lands what is left
            log.warning("receive %s: landing the spooled members at start failed: %s", receiver.spec.id, exc)

    def recovered(self, timeout: float | None = None) -> bool:
        """Wait until the members spooled before the start have landed; whether they have."""
        for thread in self._recovering:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._recovering)

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting; give batches in flight ``grace_s`` to answer; close what is idle.

        A batch still in flight after the grace stays spooled (unacknowledged) for the next leader.
        """
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._httpd.idle:
            idle = self._httpd.idle.wait_for(lambda: self._httpd.active == 0, timeout=grace_s)
        for thread in self._recovering:
            thread.join(timeout=grace_s)
        if idle and not any(t.is_alive() for t in self._recovering):
            for receiver in self.receivers.values():
                receiver.close()
            self._store.close()


def serve_receivers(store_factory: Callable[[], Store], manifest: Manifest, address: str | tuple[str, int], *,
                    queue_root: str | Path, decoder: Decoder, clock: Clock | None = None,
                    push: PushHook | None = None) -> ReceiveServer:
    """Serve every ``receive`` pipeline of ``manifest`` on ``address`` (port 0 picks one).

    Opens one store (``store_factory()``), owned and closed by the server; ``decoder`` stays the
    caller's. Spooled members found at start are landed in the background.
    """
    specs = [p for p in manifest.pipelines if p.source.kind == "receive"]
    if not specs:
        raise SpecInvalid("no [[pipeline]] of the manifest has a source of kind 'receive'")
    host, port = parse_address(address)
    store = store_factory()
    receivers: dict[str, Receiver] = {}
    try:
        for spec in specs:
            receivers[spec.id] = Receiver(store, spec, queue_root=queue_root, decoder=decoder, clock=clock, push=push)
        server_class = _HTTP6Server if ":" in host else _HTTPServer
        httpd = server_class((host, port), receivers)
    except BaseException:
        for receiver in receivers.values():
            receiver.close()
        store.close()
        raise
    server = ReceiveServer(httpd, store, receivers)
    server._start()
    return server
