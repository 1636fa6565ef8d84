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

    POST /pipelines/<id>/batches     Authorization: Bearer cfw_…  Contextful-Batch-Key: <key>
                                     (body: ndjson, or a JSON array; Content-Length or chunked)
      200 {"pipeline", "key", "replayed", "tables": [{"table", "run_id", "commit_seq", "rows", "group"}]}
      4xx/5xx {"error": <ErrorName>, "detail": <what it concerns>}
    GET /healthz                     200 {"ok": true}

A request first proves a writer key naming the pipeline (``writers``: 401, 403); a body declared
past ``max_body_bytes`` answers 413 before a byte is read, a chunked one the moment it passes.
Errors answer with the error's ``http_status``, except a malformed body (``InputMalformed``), which
answers 400. ``Content-Encoding: gzip`` or ``zstd`` bodies are decoded within ``max_decoded_bytes``
(``body``). A request with ``Expect: 100-continue`` gets its ``100 Continue`` only once the
receiver wants the body, so a refused key costs the sender no upload. An answer given without
reading the body closes the connection.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
from contextful.engine.config.manifest import Manifest, PipelineSpec
from contextful.engine.guard import mask_message
from contextful.engine.land.decode import Decoder
from contextful.engine.land.names import LandedNames
from contextful.engine.land.receive import writers
from contextful.engine.land.receive.body import CODECS, decode_body, private_file
from contextful.engine.land.receive.config import ReceiveConfig
from contextful.engine.land.receive.group import PushHook, TableAnswer, committed_answer, drain, land_pending
from contextful.engine.land.receive.spool import LANDED, Member, Queue, key_digest
from contextful.engine.land.sink import prepare_batch, table_merge
from contextful.engine.land.typed import read_types
from contextful.engine.served.face import SHUTDOWN_GRACE_S, Exchange, Route, ServedFace, serve_face
from contextful.storage import Store
from contextful.storage import errors as catalogue
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import (
    ContextfulError,
    InputMalformed,
    InputUnreadable,
    NotFound,
    ParseCrashed,
    ReceiveBatchKeyExpired,
    SpecInvalid,
)
from contextful.storage.manifest import schema_from_text
from contextful.storage.reconcile import conform, reconcile
from contextful.storage.reserved import check_modality

log = logging.getLogger(__name__)

KEY_HEADER = "Contextful-Batch-Key"
MAX_KEY_CHARS = 256
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
        self.store = store
        self.spec = spec
        self.config = ReceiveConfig.from_config(spec.source.config, f"[[pipeline]] {spec.id!r} source.config")
        self.types = read_types(spec.types)
        self.queue = Queue(queue_root, spec.id)
        self.decoder = decoder
        self.clock = clock or SystemClock()
        self.push = push

    def receive(self, key: str | None, body: BodyWriter, *, encoding: str | None = None) -> Answer:
        """Land (or replay) one batch; raise its error. ``body`` is called only once the key is live.

        ``body`` writes the body as sent; bounding it by ``max_body_bytes`` is the writer's part (the
        HTTP route's writer raises RequestBodyTooLarge past it).
        """
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
        codec = self._codec(key, encoding)
        member = self._spool(key, digest, body, codec, now)
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

    def _codec(self, key: str, encoding: str | None) -> str | None:
        coding = (encoding or "identity").strip().lower()
        if coding == "identity":
            return None
        if coding not in CODECS:
            raise InputUnreadable(f"batch {key!r}", f"Content-Encoding {coding!r} is not one of identity, "
                                                    f"{', '.join(CODECS)}")
        return CODECS[coding]

    def _spool(self, key: str, digest: str, body: BodyWriter, codec: str | None, now: int) -> Member:
        """Write the body (owner-only), decode it within its bound, spool the member; the body files go."""
        raw = self.queue.body_path(f".{codec}" if codec else "")
        plain = self.queue.body_path() if codec else raw
        try:
            with private_file(raw) as f:
                body(f)
            with open(raw, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            size = raw.stat().st_size
            if codec is not None:
                decode_body(raw, codec, plain, self.config.max_decoded_bytes, f"batch {key!r} of pipeline "
                                                                             f"{self.spec.id!r}")
            data = self._decode(key, plain)
        finally:
            raw.unlink(missing_ok=True)
            plain.unlink(missing_ok=True)
        return self.queue.spool(key, digest, data, received_us=now, body_bytes=size,
                                body_sha256=sha)

    def _decode(self, key: str, path: Path) -> dict[str, pa.Table]:
        """The body as the tables it lands in — typed, guarded, normalized — each validated against
        its table's schema alone."""
        where = f"batch {key!r} of pipeline {self.spec.id!r}"
        try:
            batches = list(self.decoder.decode(str(path), self.config.format, declared=self.types))
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
            landed = schema_from_text(head.schema) if head is not None and head.schema else None
            LandedNames(name, landed).admit(frame.schema, where)
            merge_key, order_by = (head.primary_key, head.order_by) if head is not None \
                else table_merge(self.spec, name)
            reconcile(name, landed, frame.schema, merge_key, order_by if merge_key else None)
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


def receive_routes(receivers: dict[str, Receiver], root: Path) -> list[Route]:
    """The served face's ``POST /pipelines/<id>/batches`` route over ``receivers``.

    A request first proves a writer key of project ``root`` naming the pipeline (401
    WriterCredentialUnadmitted, 403 WriterPipelineRefused), so nothing about the pipelines is told
    to a caller that proved nothing; then a declared body past ``max_body_bytes`` answers 413.
    """

    def batches(exchange: Exchange, match: re.Match[str]) -> None:
        pipeline = match.group(1)
        writers.admit(root, exchange.headers.get("Authorization"), pipeline)
        receiver = receivers.get(pipeline)
        if receiver is None:
            raise NotFound(f"no receive pipeline {pipeline!r} is served here")
        if not exchange.has_body and exchange.headers.get("Content-Length") is None:
            error = SpecInvalid("a batch needs a Content-Length header or a chunked body")
            exchange.send_error(error, status=411, close=True)
            return
        key = exchange.headers.get(KEY_HEADER)
        what = (f"batch {key!r} of pipeline {pipeline!r}" if key is not None
                else f"a batch without a {KEY_HEADER} header to pipeline {pipeline!r}")
        limit = receiver.config.max_body_bytes
        exchange.check_length(limit, what)
        try:
            answer = receiver.receive(key, lambda out: exchange.copy_body(out, what, limit),
                                      encoding=exchange.headers.get("Content-Encoding"))
        except InputMalformed as exc:
            exchange.send_error(exc, status=400)
            return
        exchange.send_json(200, answer.to_json())

    return [Route("POST", _BATCHES, batches, "POST /pipelines/<id>/batches")]


class ReceiveServer:
    """The receive service: its receivers, their start-up recovery, and (alone) a served face.

    ``serve_receivers`` starts one with a face of its own (``url``, ``address``); ``contextful
    pipeline serve`` shares one face among services (``routes()``, ``start()``, ``close()``).
    """

    def __init__(self, store: Store, receivers: dict[str, Receiver], root: Path) -> None:
        self._store = store
        self.receivers = receivers
        self.root = root
        """The project root: its writer keys admit batches."""
        self.face: ServedFace | None = None
        self._recovering = [threading.Thread(target=self._recover, args=(r,), name=f"receive-recover-{r.spec.id}",
                                             daemon=True) for r in receivers.values()]

    @property
    def url(self) -> str:
        assert self.face is not None, "serve_receivers starts a face; a shared face has its own url"
        return self.face.url

    @property
    def address(self) -> tuple[str, int]:
        assert self.face is not None
        return self.face.address

    def routes(self) -> list[Route]:
        return receive_routes(self.receivers, self.root)

    def start(self) -> None:
        """Land, in the background, what earlier receivers spooled but did not land."""
        for thread in self._recovering:
            thread.start()

    @staticmethod
    def _recover(receiver: Receiver) -> None:
        try:
            receiver.recover()
        except Exception as exc:  # noqa: BLE001 - the next batch's leader lands what is left
            log.warning("receive %s: landing the spooled members at start failed: %s", receiver.spec.id,
                        mask_message(str(exc)))

    def recovered(self, timeout: float | None = None) -> bool:
        """Wait until the members spooled before the start have landed; whether they have."""
        for thread in self._recovering:
            thread.join(timeout)
        return not any(t.is_alive() for t in self._recovering)

    def close(self, grace_s: float = SHUTDOWN_GRACE_S, *, idle: bool = True) -> None:
        """Wait for the start-up recovery; close the receivers and the store once nothing is in flight.

        A batch still in flight after the grace stays spooled (unacknowledged) for the next leader.
        """
        for thread in self._recovering:
            if thread.ident is not None:  # never started (closed before start()): nothing to wait for
                thread.join(timeout=grace_s)
        if idle and not any(t.is_alive() for t in self._recovering):
            for receiver in self.receivers.values():
                receiver.close()
            self._store.close()

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop this server's own face; give batches in flight ``grace_s`` to answer; close what is idle."""
        idle = self.face.shutdown(grace_s) if self.face is not None else True
        self.close(grace_s, idle=idle)


def open_receivers(store_factory: Callable[[], Store], manifest: Manifest, *, queue_root: str | Path,
                   decoder: Decoder, clock: Clock | None = None, push: PushHook | None = None) -> ReceiveServer:
    """The receive service for every ``receive`` pipeline of ``manifest`` (not started, no face).

    Opens one store (``store_factory()``), owned and closed by the service; ``decoder`` stays the
    caller's.
    """
    specs = [p for p in manifest.pipelines if p.source.kind == "receive"]
    if not specs:
        raise SpecInvalid("no [[pipeline]] of the manifest has a source of kind 'receive'")
    store = store_factory()
    receivers: dict[str, Receiver] = {}
    try:
        for spec in specs:
            receivers[spec.id] = Receiver(store, spec, queue_root=queue_root, decoder=decoder, clock=clock, push=push)
    except BaseException:
        for receiver in receivers.values():
            receiver.close()
        store.close()
        raise
    return ReceiveServer(store, receivers, manifest.root)


def serve_receivers(store_factory: Callable[[], Store], manifest: Manifest, address: str | tuple[str, int], *,
                    queue_root: str | Path, decoder: Decoder, clock: Clock | None = None,
                    push: PushHook | None = None) -> ReceiveServer:
    """Serve every ``receive`` pipeline of ``manifest`` alone on ``address`` (port 0 picks one).

    Spooled members found at start are landed in the background.
    """
    service = open_receivers(store_factory, manifest, queue_root=queue_root, decoder=decoder, clock=clock, push=push)
    try:
        service.face = serve_face(address, service.routes())
    except BaseException:
        service.close(0)
        raise
    service.start()
    return service
