"""The worker process: ``contextful worker serve --http ADDR`` and its ``POST /submit`` route.

Implements the worker's half of ``surface.dispatch.submit-signed``, ``heartbeat-beat`` and
``step-result`` (decision "workers reach the orchestrator"; docs/control.md, "Workers"):

- ``POST /submit`` admits a submission only when it carries an HMAC under the worker key
  (``engine.control.worker_key``, kind ``submit``) over its timestamp and body, within the skew, and
  its body names a callback under this worker's own ``[control] relay`` (``<relay>/awake/<token>``);
  anything else raises :class:`DispatchSubmitRejected` (403) and starts nothing. The body is the
  JSON object ``{"run", "step", "attempt", "version", "callback"}``: the landing step (a pipeline
  id) of applied version ``version``, keyed by run, step and attempt. An admitted submission answers
  202 and runs in a thread of this process.
- The step lands alone, as a unit child lands a member (``engine.run.units.run_landing_step`` over
  the applied version, on the store the project names, the one serve shares); its derive tiers run
  afterwards in serve's unit child (``engine.control.relay``). While it runs the worker
  heartbeats every :data:`HEARTBEAT_S` with a signed ``GET`` on the callback (kind ``heartbeat``,
  bound to the route's path), the first one at once; then it posts the outcome with a signed
  ``POST`` (kind ``callback``): ``{"pointer": "<table>@<commit_seq>"}`` for the commit it made (the
  table's head when it landed nothing new), or ``{"error": "<last error line>"}``, always within
  ``engine.control.relay.MAX_RESULT_BYTES``.
- A worker on a machine of its own shares no disk with serve: it learns the applied versions from
  its own control source, as any node does (``engine.control.reconcile``): a submission naming a
  version its snapshot directory lacks polls that source once (its ``[sync]`` bucket, or its
  ``[control] url``) and adopts the head, verified, before the step lands; a version still missing
  fails the step naming it. Rows reach serve through the shared store (the container profile's
  bucket and catalog); only the step result crosses the wire.
- ``GET /steps`` answers what the worker holds in flight, unauthenticated data only (run, step,
  attempt, when it started, its last heartbeat): what ``contextful worker list`` reads.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from contextful.engine.control.worker_key import SIGNATURE_HEADER, TIMESTAMP_HEADER, WorkerKey
from contextful.engine.served.face import Exchange, Route
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import DispatchSubmitRejected

if TYPE_CHECKING:
    from contextful.storage import Store

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
"""``surface.dispatch.heartbeat-beat``: how often a worker heartbeats its step's route."""
MAX_SUBMISSION_BYTES = 64 * 1024
"""A submission names a step; it never carries data."""
CALL_TIMEOUT_S = 30.0
"""How long one heartbeat or callback request to the relay may take."""
CALLBACK_RETRY_S = 300.0
"""How long a callback the relay did not answer (unreachable, or a 5xx: serve restarting) is sent
again; a callback the relay refused (4xx) is never sent again."""
CALLBACK_RETRY_EVERY_S = 2.0
_TOKEN = re.compile(r"/awake/([A-Za-z0-9_-]{16,128})")


@dataclass(frozen=True)
class Submission:
    """One admitted ``POST /submit``: a landing step keyed by run, step and attempt."""

    run: str
    step: str
    attempt: int
    version: int
    callback: str

    @property
    def key(self) -> str:
        return f"{self.run}/{self.step}/{self.attempt}"


@dataclass
class _InFlight:
    submission: Submission
    started_s: float
    beat_s: float | None = None


def parse_submission(body: bytes, relay: str) -> Submission:
    """The submission ``body`` holds, its callback under ``relay``; DispatchSubmitRejected else."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise DispatchSubmitRejected("its body is not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"run", "step", "attempt", "version", "callback"}:
        raise DispatchSubmitRejected("its body is not {run, step, attempt, version, callback}")
    run, step, attempt, version, callback = (doc[k] for k in ("run", "step", "attempt", "version", "callback"))
    if not (isinstance(run, str) and run and isinstance(step, str) and step):
        raise DispatchSubmitRejected("its run and step must be non-empty strings")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (attempt, version)):
        raise DispatchSubmitRejected("its attempt and version must be positive integers")
    if not isinstance(callback, str) or not callback_under(callback, relay):
        raise DispatchSubmitRejected(f"its callback {str(callback)[:200]!r} is not a /awake/<token> route under "
                                     f"this worker's relay {relay}")
    return Submission(run, step, attempt, version, callback)


def callback_under(callback: str, relay: str) -> bool:
    """Whether ``callback`` is ``<relay>/awake/<token>`` exactly (same scheme, host, port and path prefix)."""
    if not callback.startswith(relay + "/awake/"):
        return False
    parts, base = urlsplit(callback), urlsplit(relay)
    if (parts.scheme, parts.netloc) != (base.scheme, base.netloc) or parts.query or parts.fragment:
        return False
    return _TOKEN.fullmatch(parts.path[len(base.path):]) is not None


class WorkerService:
    """The worker's state: its key, relay, project and store, and the steps it holds in flight."""

    def __init__(self, root: Path, store_url: str | None, relay: str, key: WorkerKey, *,
                 clock: Clock | None = None, heartbeat_s: float = HEARTBEAT_S,
                 say: Callable[[str], None] | None = None) -> None:
        self.root = root
        self.store_url = store_url
        self.relay = relay.rstrip("/")
        self.key = key
        self.clock = clock or SystemClock()
        self.heartbeat_s = heartbeat_s
        self.say = say or log.info
        """Where a line per admitted step and per outcome goes (the CLI: stderr)."""
        self._lock = threading.Lock()
        self._in_flight: dict[str, _InFlight] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        from contextful.engine.control.reconcile import node_reconciler

        self._learning = threading.Lock()
        """One poll of the control source at a time (two steps naming one new version adopt it once)."""
        self._reconciler = node_reconciler(root, store=store_url, clock=self.clock, say=self.say)

    def now_s(self) -> int:
        return self.clock.now_us() // 1_000_000

    def admit(self, timestamp: str | None, signature: str | None, body: bytes) -> Submission:
        """``surface.dispatch.submit-signed``: the submission, once its HMAC, timestamp and callback hold."""
        problem = self.key.problem("submit", timestamp, signature, body, now_s=self.now_s())
        if problem is not None:
            raise DispatchSubmitRejected(problem)
        submission = parse_submission(body, self.relay)
        with self._lock:
            if submission.key in self._in_flight:
                raise DispatchSubmitRejected(f"step {submission.key} is already in flight here")
            self._in_flight[submission.key] = _InFlight(submission, time.time())
        self.say(f"step {submission.key}: admitted (version {submission.version})")
        return submission

    def start(self, submission: Submission) -> None:
        thread = threading.Thread(target=self._run, args=(submission,), name=f"step {submission.key}", daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def in_flight(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"run": f.submission.run, "step": f.submission.step, "attempt": f.submission.attempt,
                     "started": f.started_s, "last_heartbeat": f.beat_s} for f in self._in_flight.values()]

    def _run(self, submission: Submission) -> None:
        done = threading.Event()
        beating = threading.Thread(target=self._beat, args=(submission, done), daemon=True)
        beating.start()
        try:
            self.learn(submission.version)
            result = run_step(self.root, self.store_url, submission)
        finally:
            done.set()
            beating.join()
        self.say(f"step {submission.key}: {result.decode()[:500]}")
        deadline = time.monotonic() + CALLBACK_RETRY_S
        while self._call(submission, "POST", result) is None and time.monotonic() < deadline:
            self._stopping.wait(CALLBACK_RETRY_EVERY_S)  # the relay is away (serve restarting): send it again
        with self._lock:
            self._in_flight.pop(submission.key, None)

    def learn(self, version: int) -> None:
        """Adopt the control source's head when this node's snapshot directory lacks ``version``."""
        from contextful.engine.control.apply import snapshot_dir

        if self._reconciler is None:
            return
        with self._learning:
            if snapshot_dir(self.root).file(version).is_file():
                return
            self._reconciler.poll()  # a failed poll is logged; the step then fails naming the version

    def _beat(self, submission: Submission, done: threading.Event) -> None:
        """``surface.dispatch.heartbeat-beat``: a signed GET now and every ``heartbeat_s`` until the step ends."""
        while not done.is_set():
            if self._call(submission, "GET", b""):
                with self._lock:
                    if submission.key in self._in_flight:
                        self._in_flight[submission.key].beat_s = time.time()
            done.wait(self.heartbeat_s)

    def _call(self, submission: Submission, method: str, body: bytes) -> bool | None:
        """One signed heartbeat (GET) or callback (POST) to the step's route; whether the relay admitted
        it (None: no answer from the relay, or a 5xx)."""
        path = urlsplit(submission.callback).path
        kind = "heartbeat" if method == "GET" else "callback"
        headers = self.key.headers(kind, self.now_s(), body, bound=path)
        if method == "POST":
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(submission.callback, data=body if method == "POST" else None,
                                         headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as answer:
                answer.read()
            return True
        except urllib.error.HTTPError as exc:
            log.warning("%s %s of step %s refused: %s %s", kind, method, submission.key, exc.code,
                        exc.read()[:500].decode("utf-8", "replace"))
            return None if exc.code >= 500 else False
        except OSError as exc:
            log.warning("%s of step %s did not reach the relay: %s", kind, submission.key, exc)
            return None


def run_step(root: Path, store_url: str | None, submission: Submission) -> bytes:
    """Land ``submission``'s step as a unit child runs it; the step result the callback carries."""
    from contextful.engine.control.relay import step_result

    try:
        from contextful.engine.control.arming import load_armable
        from contextful.engine.project import open_project_store
        from contextful.engine.run.units import run_landing_step

        manifest, _refused = load_armable(root, submission.version)
        spec = manifest.pipeline(submission.step)
        store = open_project_store(manifest.root, store_url, project=manifest.project, create=True)
        try:
            result = run_landing_step(store, manifest, spec.id)
            if not result.ok:
                last = result.failures[-1]
                return step_result(error=f"{submission.step}: {last.error}: {last.detail}")
            landed = [seq for table in result.tables for seq in table.commit_seqs]
            return step_result(pointer=f"{spec.table}@{landed[-1] if landed else _head_seq(store, spec.table)}")
        finally:
            store.close()
    except Exception as exc:  # noqa: BLE001 - the step fails by name; the relay records its last line
        from contextful.storage.errors import ContextfulError

        line = str(exc) if isinstance(exc, ContextfulError) else f"{type(exc).__name__}: {exc}"
        return step_result(error=f"{submission.step}: {line}")


def _head_seq(store: Store, table: str) -> int:
    """The table's head commit_seq (0: no commit yet): what a step that landed nothing new left current."""
    head = store.catalog.load_head(table)
    return head.commit_seq if head is not None else 0


def worker_routes(service: WorkerService) -> list[Route]:
    """``POST /submit`` and ``GET /steps`` (the module docstring says what they answer)."""

    def submit(exchange: Exchange, _match: re.Match[str]) -> None:
        body = exchange.read_body(MAX_SUBMISSION_BYTES, "a submission")
        submission = service.admit(exchange.headers.get(TIMESTAMP_HEADER), exchange.headers.get(SIGNATURE_HEADER),
                                   body)
        service.start(submission)
        exchange.send_json(202, {"accepted": submission.key})

    def steps(exchange: Exchange, _match: re.Match[str]) -> None:
        exchange.send_json(200, {"in_flight": service.in_flight()})

    return [Route("POST", re.compile(r"/submit"), submit, "POST /submit"),
            Route("GET", re.compile(r"/steps"), steps, "GET /steps")]
