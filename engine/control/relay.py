"""Serve's side of remote workers: submitting a landing step, and the relay's ``/awake/<token>`` route.

Implements ``surface.dispatch.worker-key`` (:func:`check_workers`: serve listing workers without a
relay or without the worker key refuses at startup), the relay's half of ``callback-skew``,
``callback-rejected`` and ``step-result`` (:meth:`Relay.heartbeat`, :meth:`Relay.callback`,
:func:`parse_step_result`), ``submit-exhausted`` (:meth:`Relay.submit`: each listed worker tried once
in turn; every one refusing fails the step naming the last refusal) and ``heartbeat-lapse``
(:meth:`Relay.reschedule_lapsed`: a step whose worker has not heartbeaten for :data:`LAPSE_S` moves
to another worker under the next attempt, on the relay's injected clock). Docs: docs/control.md,
"Workers".

Each attempt of a step gets its own opaque token; its route is ``<relay>/awake/<token>``. Only the
current attempt's token of an open step is admitted: a superseded attempt's heartbeat or callback,
a replayed callback after the step closed, one signed under another key or outside the skew raises
:class:`DispatchCallbackRejected` (403) and changes no step. A completion callback's body is a step
result (:func:`parse_step_result`); any other body raises :class:`StepResultRefused` and records
nothing, the step staying open for a valid one.

Serve's relay journals each submission in the awakeable store (:mod:`engine.control.attempts`):
its route token is the journal row's, a callback closes the row by one conditional write (so one
callback is admitted once, whichever serve admits it), and a serve started after one that died
re-adopts the open attempts (:meth:`Relay.readopt`; a heartbeat or callback naming one re-adopts
it at once), resuming their units (:meth:`RelayLauncher.readopt`).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from contextful.engine.control.attempts import Attempt, AttemptJournal
from contextful.engine.control.dispatch import ChildLauncher, Launched, Launcher, Outcome
from contextful.engine.control.worker_key import (
    KEY_VARIABLE,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WorkerKey,
    worker_key,
    worker_key_problem,
)
from contextful.engine.served.face import Exchange, Route, ServedFace
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import (
    DispatchCallbackRejected,
    DispatchSubmitRejected,
    ManifestValueInvalid,
    RequestBodyTooLarge,
    StepResultRefused,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import ControlSpec, Manifest
    from contextful.engine.control.fire import ControlPlane
    from contextful.engine.run.units import Unit
    from contextful.storage import Store

log = logging.getLogger(__name__)

MAX_RESULT_BYTES = 1 << 20
"""``surface.dispatch.step-result``: a completion callback's body is JSON of at most 1 MiB."""
LAPSE_S = 60
"""``surface.dispatch.heartbeat-lapse``: a worker silent this long loses its in-flight step."""
RESULT_KEYS = ("pointer", "object_key", "row_id", "error")
"""What a step result names: a pointer, an object-store key, a catalog row id, or the failed step's last error line."""
SUBMIT_TIMEOUT_S = 30.0
KEPT_TOKENS = 10_000
"""How many attempts' routes the relay remembers, so a replay after its step closed names the closure."""
LAPSE_CHECK_S = 1.0
"""How often a unit waiting on a remote step looks for lapsed workers."""


def check_workers(workers: Sequence[str], relay: str | None, environ: Mapping[str, str] | None = None) -> WorkerKey | None:
    """``surface.dispatch.worker-key``: the worker key serve signs and checks with when ``[control]
    workers`` lists any (None: it lists none); ManifestValueInvalid naming what is missing else, before
    serve binds anything."""
    if not workers:
        return None
    if relay is None:
        raise ManifestValueInvalid("[control]", "relay", "unset: [control] workers lists workers, so relay must "
                                   "name the URL whose /awake/<token> route receives their heartbeats and callbacks")
    key = worker_key(environ)
    if key is None:
        import os

        problem = worker_key_problem((os.environ if environ is None else environ).get(KEY_VARIABLE))
        raise ManifestValueInvalid("[control]", "workers", f"{problem}: the workers' submissions, "
                                   "heartbeats and callbacks sign under it")
    return key


def step_result(**named: str) -> bytes:
    """The JSON body of a step result naming one of :data:`RESULT_KEYS` (``pointer=…`` or ``error=…``)."""
    [(name, value)] = named.items()
    if name == "error":  # the failed step's LAST error line, cut to what a result carries
        value = (value.strip().splitlines() or [""])[-1][: MAX_RESULT_BYTES // 2]
    return json.dumps({name: value}).encode()


def parse_step_result(body: bytes) -> dict[str, str]:
    """``surface.dispatch.step-result``: the result ``body`` holds; StepResultRefused else."""
    if len(body) > MAX_RESULT_BYTES:
        raise StepResultRefused(f"its body holds {len(body)} bytes, more than {MAX_RESULT_BYTES} (1 MiB)")
    try:
        doc = json.loads(body)
    except ValueError:
        raise StepResultRefused("its body is not JSON") from None
    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in RESULT_KEYS:
        raise StepResultRefused(f"its body is not one of {{{', '.join(RESULT_KEYS)}}}")
    [(name, value)] = doc.items()
    if not isinstance(value, str) or not value or (name == "error" and "\n" in value):
        raise StepResultRefused(f"its {name} must be a non-empty string" + (" of one line" if name == "error" else ""))
    return {name: value}


@dataclass
class RemoteStep:
    """One landing step submitted to workers: its current attempt, where it runs, and how it ended."""

    run: str
    step: str
    version: int
    attempt: int = 0
    token: str = ""
    worker: str | None = None
    last_beat_us: int = 0
    heartbeats: int = 0
    """Heartbeats admitted for this step, across its attempts."""
    result: dict[str, str] | None = None
    seq: int = 0
    """How many submissions of this step were made, each worker tried under each attempt counting
    (the journal's ``seq``: ``engine.control.attempts``)."""
    refusals: list[str] = field(default_factory=list)
    """Each worker refusal met, in order (``<worker>: <status> <answer>``)."""
    closed: threading.Event = field(default_factory=threading.Event)

    @property
    def ok(self) -> bool:
        return self.result is not None and "error" not in self.result


class Relay:
    """Serve's workers and relay: submits steps, admits heartbeats and callbacks on ``/awake/<token>``."""

    def __init__(self, workers: Sequence[str], relay: str, key: WorkerKey, *, clock: Clock | None = None,
                 attempts: AttemptJournal | None = None) -> None:
        self.workers = tuple(w.rstrip("/") for w in workers)
        self.relay = relay.rstrip("/")
        self.key = key
        self.clock = clock or SystemClock()
        self.attempts = attempts
        """Where each submission is journaled (None: in memory only, lost with this process)."""
        self._lock = threading.Condition()
        """Guards the steps; notified whenever a heartbeat or callback changes one (:meth:`wait_for`)."""
        self._by_token: dict[str, RemoteStep] = {}
        self._open: list[RemoteStep] = []
        self._adopted: list[RemoteStep] = []
        """Steps re-adopted from the journal and not yet claimed by a unit (closed ones included)."""
        self._next = 0

    def now_s(self) -> int:
        return self.clock.now_us() // 1_000_000

    # --- submitting ------------------------------------------------------------------------------

    def submit(self, run: str, step: str, version: int) -> RemoteStep:
        """``surface.dispatch.worker-target`` and ``submit-exhausted``: post ``step`` to the workers in
        turn, each once, under attempt 1; DispatchSubmitRejected naming the last refusal when all refuse."""
        remote = RemoteStep(run, step, version)
        if self.attempts is not None:  # a step submitted again in one run numbers its submissions on
            current = self.attempts.current(run, step)
            remote.seq = current.seq if current is not None else 0
        self._place(remote, exclude=None)
        return remote

    def _place(self, remote: RemoteStep, exclude: str | None) -> None:
        """Submit ``remote`` under its next attempt to each worker but ``exclude`` once, in turn."""
        with self._lock:
            start = self._next
            self._next += 1
        order = [self.workers[(start + i) % len(self.workers)] for i in range(len(self.workers))]
        order = [w for w in order if w != exclude] or order
        previous = remote.token  # the superseded attempt's route (none on a first submission)
        remote.attempt += 1
        for worker in order:
            remote.seq += 1
            token = self._token(remote, worker)
            with self._lock:
                remote.token, remote.worker, remote.last_beat_us = token, worker, self.clock.now_us()
                self._by_token[token] = remote
                if remote not in self._open:
                    self._open.append(remote)
            refusal = self._post_submit(worker, remote, token)
            if refusal is None:
                log.info("step %s/%s attempt %d submitted to %s", remote.run, remote.step, remote.attempt, worker)
                self._close_durably(previous, {"superseded": remote.attempt})
                return
            with self._lock:
                del self._by_token[token]
            remote.refusals.append(f"{worker}: {refusal}")
            self._close_durably(token, {"refused": refusal[:1000]})
        self._close_durably(previous, {"superseded": remote.attempt})
        with self._lock:
            remote.token, remote.worker = "", None
            if remote in self._open:
                self._open.remove(remote)
        remote.result = {"error": f"{remote.step}: every worker refused it; the last: {remote.refusals[-1]}"}
        remote.closed.set()
        raise DispatchSubmitRejected(f"step {remote.step} of run {remote.run}: every listed worker refused it "
                                     f"({len(remote.refusals)} tried, each once); the last refusal: "
                                     f"{remote.refusals[-1]}")

    def _token(self, remote: RemoteStep, worker: str) -> str:
        """The route token of ``remote``'s submission to ``worker``, journaled first when the relay keeps a journal."""
        if self.attempts is None:
            return secrets.token_urlsafe(24)
        return self.attempts.record(remote.run, remote.step, remote.seq, remote.attempt, worker, remote.version,
                                    self.clock.now_us()).token

    def _close_durably(self, token: str, why: dict[str, Any]) -> None:
        """Close a refused or superseded submission in the journal (its late callback then lands nothing)."""
        if self.attempts is not None and token:
            self.attempts.close(token, json.dumps(why).encode(), self.clock.now_us())

    def _post_submit(self, worker: str, remote: RemoteStep, token: str) -> str | None:
        """POST the signed submission to ``worker``; its refusal (None: it admitted the step)."""
        body = json.dumps({"run": remote.run, "step": remote.step, "attempt": remote.attempt,
                           "version": remote.version, "callback": f"{self.relay}/awake/{token}"}).encode()
        headers = self.key.headers("submit", self.now_s(), body) | {"Content-Type": "application/json"}
        request = urllib.request.Request(worker + "/submit", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=SUBMIT_TIMEOUT_S) as answer:
                answer.read()
            return None
        except urllib.error.HTTPError as exc:
            return f"{exc.code} {exc.read()[:1000].decode('utf-8', 'replace')}"
        except OSError as exc:
            return f"unreachable: {exc}"

    # --- heartbeats and callbacks ----------------------------------------------------------------

    def _admit(self, kind: str, token: str, path: str, timestamp: str | None, signature: str | None,
               body: bytes) -> RemoteStep:
        """``surface.dispatch.callback-rejected`` and ``callback-skew``: the open step whose current
        attempt ``token`` names, once the signature verifies within the skew."""
        problem = self.key.problem(kind, timestamp, signature, body, now_s=self.now_s(), bound=path)
        if problem is not None:
            raise DispatchCallbackRejected(problem)
        with self._lock:
            remote = self._by_token.get(token) or self._readopt_token(token)
            if remote is None:
                raise DispatchCallbackRejected("its route names no step submitted to a worker")
            if remote.closed.is_set():
                raise DispatchCallbackRejected(f"step {remote.step} of run {remote.run} has closed")
            if remote.token != token:
                raise DispatchCallbackRejected(f"its route names an attempt of step {remote.step} that is not its "
                                               f"current attempt {remote.attempt}")
            return remote

    def heartbeat(self, token: str, path: str, timestamp: str | None, signature: str | None) -> RemoteStep:
        remote = self._admit("heartbeat", token, path, timestamp, signature, b"")
        with self._lock:
            remote.last_beat_us = self.clock.now_us()
            remote.heartbeats += 1
            self._lock.notify_all()
        return remote

    def callback(self, token: str, path: str, timestamp: str | None, signature: str | None,
                 body: bytes) -> RemoteStep:
        remote = self._admit("callback", token, path, timestamp, signature, body)
        result = parse_step_result(body)
        with self._lock:
            if remote.closed.is_set() or remote.token != token:  # a racing successor closed it first
                raise DispatchCallbackRejected(f"step {remote.step} of run {remote.run} has closed")
            if self.attempts is not None and not self.attempts.close(token, json.dumps(result).encode(),
                                                                     self.clock.now_us()):
                raise DispatchCallbackRejected(f"step {remote.step} of run {remote.run} has closed (its "
                                               "journaled attempt was closed by another admission)")
            remote.result = result
            remote.closed.set()
            self._open.remove(remote)
            self._forget_closed()
            self._lock.notify_all()
        return remote

    def _forget_closed(self) -> None:
        """Keep at most :data:`KEPT_TOKENS` routes: the oldest closed steps' go first (their replays
        are then rejected as naming no step, which changes no step either)."""
        excess = len(self._by_token) - KEPT_TOKENS
        for token in [t for t, r in self._by_token.items() if r.closed.is_set()][:max(excess, 0)]:
            del self._by_token[token]

    # --- re-adoption after a restart -------------------------------------------------------------

    def _readopt_token(self, token: str) -> RemoteStep | None:
        """The step a journaled attempt's ``token`` names, re-adopted when it is its step's current
        open attempt (a serve before this one submitted it); DispatchCallbackRejected when it is
        closed or superseded; None when the journal holds no such attempt. Called under the lock."""
        if self.attempts is None:
            return None
        attempt = self.attempts.find(token)
        if attempt is None:
            return None
        if not attempt.open:
            raise DispatchCallbackRejected(f"step {attempt.step} of run {attempt.run} has closed")
        current = self.attempts.current(attempt.run, attempt.step)
        if current is not None and current.seq != attempt.seq:
            raise DispatchCallbackRejected(f"its route names an attempt of step {attempt.step} that is not its "
                                           f"current attempt {current.attempt}")
        return self._adopt(attempt)

    def _adopt(self, attempt: Attempt) -> RemoteStep:
        """Track a journaled open attempt as this relay's own; its worker gets a full lapse from now."""
        remote = RemoteStep(attempt.run, attempt.step, attempt.version, attempt=attempt.attempt,
                            token=attempt.token, worker=attempt.worker, last_beat_us=self.clock.now_us(),
                            seq=attempt.seq)
        self._by_token[attempt.token] = remote
        self._open.append(remote)
        self._adopted.append(remote)
        log.warning("step %s/%s attempt %d on %s re-adopted from the journal", attempt.run, attempt.step,
                    attempt.attempt, attempt.worker)
        return remote

    def readopt(self) -> list[RemoteStep]:
        """Every open step a previous serve journaled, re-adopted, and those a heartbeat or callback
        re-adopted already (closed ones included: their unit goes on after them), claimed by the
        caller, which resumes their units."""
        if self.attempts is None:
            return []
        with self._lock:
            for attempt in self.attempts.open_attempts():
                if attempt.token not in self._by_token:
                    self._adopt(attempt)
            claimed, self._adopted = self._adopted, []
            return claimed

    def wake(self) -> None:
        """Wake every :meth:`wait_for` to look at its predicate again."""
        with self._lock:
            self._lock.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds after a heartbeat or callback (or ``timeout_s``); whether it holds."""
        with self._lock:
            return self._lock.wait_for(predicate, timeout_s)

    def reschedule_lapsed(self) -> list[RemoteStep]:
        """``surface.dispatch.heartbeat-lapse``: move each open step whose worker has been silent past
        :data:`LAPSE_S` to another worker under the next attempt; the steps moved."""
        now = self.clock.now_us()
        with self._lock:
            lapsed = [r for r in self._open if r.token and now - r.last_beat_us > LAPSE_S * 1_000_000]
            for remote in lapsed:  # claimed here: a concurrent look does not move it a second time
                remote.last_beat_us = now
        moved = []
        for remote in lapsed:
            silent = remote.worker
            log.warning("step %s/%s: worker %s silent past %d s: rescheduling", remote.run, remote.step, silent, LAPSE_S)
            try:
                self._place(remote, exclude=silent)
            except DispatchSubmitRejected as exc:
                log.warning("%s", exc)
            moved.append(remote)
        return moved

    def open_steps(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"run": r.run, "step": r.step, "attempt": r.attempt, "worker": r.worker,
                     "last_heartbeat_us": r.last_beat_us} for r in self._open]


def relay_routes(relay: Relay) -> list[Route]:
    """``GET /awake/<token>`` (a signed heartbeat) and ``POST /awake/<token>`` (a signed callback)."""

    def heartbeat(exchange: Exchange, match: re.Match[str]) -> None:
        remote = relay.heartbeat(match.group("token"), match.group(0), exchange.headers.get(TIMESTAMP_HEADER),
                                 exchange.headers.get(SIGNATURE_HEADER))
        exchange.send_json(200, {"step": remote.step, "attempt": remote.attempt})

    def callback(exchange: Exchange, match: re.Match[str]) -> None:
        try:
            body = exchange.read_body(MAX_RESULT_BYTES + 1, "a step result") if exchange.has_body else b""
        except RequestBodyTooLarge:
            raise StepResultRefused(f"its body holds more than {MAX_RESULT_BYTES} bytes (1 MiB)") from None
        remote = relay.callback(match.group("token"), match.group(0), exchange.headers.get(TIMESTAMP_HEADER),
                                exchange.headers.get(SIGNATURE_HEADER), body)
        exchange.send_json(200, {"step": remote.step, "attempt": remote.attempt, "recorded": remote.result})

    pattern = re.compile(r"/awake/(?P<token>[A-Za-z0-9_-]{16,128})")
    return [Route("GET", pattern, heartbeat, "GET /awake/<token>"),
            Route("POST", pattern, callback, "POST /awake/<token>")]


class RelayLauncher:
    """``surface.dispatch.worker-target``: serve's launcher while ``[control] workers`` lists workers.

    A pipeline unit's landing members (its head and its landing steps) run on workers, driven by a
    thread of serve's: each, in the unit's order, is submitted through the relay under one run id,
    keyed by run, step and attempt, and waited for (rescheduling lapsed workers meanwhile); a member
    following a failed one is not run. Its derive tiers, and the build jobs riding it, then run in
    serve's own unit child (``engine.control.child --landed-on-workers``), told which landing
    members failed, and which no worker ran (``run.select.parent-outcome``: a worker dispatch error
    leaves the tiers reading that member unrun). A unit where a landing step follows a derive tier,
    and a job entry, runs wholly in a child process as without workers (``fallback``)."""

    def __init__(self, relay: Relay, manifest: Manifest, version: int, fallback: ChildLauncher) -> None:
        self.relay = relay
        self.manifest = manifest
        self.version = version
        self.fallback = fallback

    def launch(self, head: str) -> Launched:
        unit = self._unit(head)
        return _RemoteUnit(self, unit) if unit is not None else self.fallback.launch(head)

    def _unit(self, head: str) -> Unit | None:
        """``head``'s unit when its landing members can run on workers (None: it runs wholly in a child)."""
        from contextful.engine.run.units import unit_of

        if head not in {p.id for p in self.manifest.pipelines}:
            return None
        unit = unit_of(self.manifest, head)
        tiers = set(unit.tiers)
        if any(tiers.intersection(self.manifest.pipeline(step).follows) for step in unit.steps):
            return None
        return unit

    def after_workers(self, unit: Unit) -> bool:
        """Whether ``unit`` owes serve's child a run once its landing members ran: tiers or riding builds."""
        from contextful.engine.jobs.after import dependent_builds

        return bool(unit.tiers) or bool(dependent_builds(self.manifest, unit.members))

    def readopt(self) -> list[Launched]:
        """The units a previous serve left waiting on workers, resumed at their open step: each waits
        for that step (its callback, or a lapse moving it), then goes on with the members after it."""
        resumed: list[Launched] = []
        for remote in self.relay.readopt():
            unit = self._unit(remote.run.rsplit("-", 1)[0])  # a run id is <head>-<hex>
            if unit is None or remote.step not in unit.members:  # its callback still lands; nothing follows it
                log.warning("step %s/%s: its unit is not armed in v%d; its outcome is recorded, nothing follows it",
                            remote.run, remote.step, self.version)
                continue
            resumed.append(_RemoteUnit(self, unit, resume=remote))
        return resumed


class _RemoteUnit:
    """One unit whose landing members run on workers (a thread of serve's), then its tiers in a child."""

    def __init__(self, launcher: RelayLauncher, unit: Unit, resume: RemoteStep | None = None) -> None:
        self.head = unit.head
        self._launcher = launcher
        self._unit = unit
        landing = tuple(m for m in unit.members if m not in unit.tiers)
        self._landing = landing[landing.index(resume.step):] if resume is not None else landing
        self._resume = resume
        """The open step a previous serve submitted, re-adopted: the unit resumes there, in its run."""
        self._stop = threading.Event()
        self._child: Launched | None = None
        self._outcome: Outcome | None = None
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"remote unit {unit.head}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        relay, manifest = self._launcher.relay, self._launcher.manifest
        run = self._resume.run if self._resume is not None else f"{self.head}-{secrets.token_hex(6)}"
        failed: set[str] = set()
        unlaunched: set[str] = set()
        failures: list[str] = []
        for member in self._landing:
            upstream = sorted(failed.intersection(manifest.pipeline(member).after))
            if upstream or self._stop.is_set():
                failed.add(member)
                unlaunched.add(member)
                failures.append(f"{member}: UpstreamFailed: not run: pipeline(s) {', '.join(upstream)} it runs "
                                "after failed" if upstream else f"{member}: not run: serve is stopping")
                continue
            try:
                resumed, self._resume = self._resume, None
                remote = resumed or relay.submit(run, member, self._launcher.version)
            except DispatchSubmitRejected as exc:  # surface.dispatch.submit-exhausted: the unit fails by name
                failed.add(member)
                unlaunched.add(member)
                failures.append(f"{member}: {exc}")
                continue
            self._await(remote)
            if not remote.ok:
                failed.add(member)
                if remote.result is None:  # serve stopped waiting: no outcome came back
                    unlaunched.add(member)
                why = remote.result["error"] if remote.result else "serve stopped while it ran on a worker"
                failures.append(why if why.startswith(f"{member}:") else f"{member}: {why}")
        ok = not failed
        if self._launcher.after_workers(self._unit) and not self._stop.is_set():
            after = self._after_workers(failed, unlaunched)
            ok = ok and after.ok
            failures += [line for line in after.failures if line not in failures]
        self._outcome = Outcome(self.head, ok, tuple(failures))
        self._ended.set()

    def _after_workers(self, failed: set[str], unlaunched: set[str]) -> Outcome:
        """The unit's tiers and riding builds, in serve's own unit child; its outcome."""
        extra = ["--landed-on-workers"]
        for member in sorted(failed):
            extra += ["--unlaunched" if member in unlaunched else "--failed", member]
        self._child = child = self._launcher.fallback.launch(self.head, extra)
        outcome = None
        while outcome is None:  # a timed wait: terminate() signals the child meanwhile
            outcome = child.wait(LAPSE_CHECK_S)
        return outcome

    def _await(self, remote: RemoteStep) -> None:
        """Wait for ``remote`` to close (or serve to stop), rescheduling lapsed workers meanwhile."""
        relay = self._launcher.relay
        while not relay.wait_for(lambda: remote.closed.is_set() or self._stop.is_set(), LAPSE_CHECK_S):
            relay.reschedule_lapsed()

    def poll(self) -> Outcome | None:
        return self._outcome if self._ended.is_set() else None

    def wait(self, timeout_s: float | None) -> Outcome | None:
        self._ended.wait(timeout_s)
        return self.poll()

    def terminate(self) -> None:
        """Stop waiting for the workers (they cannot be signalled) and stop the tiers' child: the unit
        ends failed once the child has."""
        self._stop.set()
        self._launcher.relay.wake()
        if self._child is not None:
            self._child.terminate()

    def kill(self) -> None:
        self._stop.set()
        self._launcher.relay.wake()
        if self._child is not None:
            self._child.kill()


def serve_relay(control: ControlSpec, key: WorkerKey, store: Store, clock: Clock | None = None) -> tuple[Relay, ServedFace]:
    """Serve's relay for ``[control] workers``, its ``/awake/<token>`` route bound on ``[control] relay``'s
    address, journaling its attempts in ``store``'s awakeable store (``engine.control.attempts``)."""
    from contextful.engine.served.face import bind_face

    assert control.relay is not None
    parts = urlsplit(control.relay)
    relay = Relay(control.workers, control.relay, key, clock=clock, attempts=AttemptJournal(store.awakeables))
    face = bind_face(f"{parts.hostname}:{parts.port or 80}", "[control] relay").serve(relay_routes(relay))
    return relay, face


def relay_launcher(relay: Relay | None, plane: Callable[[], ControlPlane]) -> Callable[[int], Launcher] | None:
    """The launcher factory a :class:`~engine.control.fire.ControlPlane` takes when ``relay`` serves
    workers (None: no workers, the plane's own children)."""
    if relay is None:
        return None

    def launcher(version: int) -> Launcher:
        current = plane()
        assert current.manifest is not None  # a plane builds its launcher once a version is armed
        return RelayLauncher(relay, current.manifest, version, current.child_launcher(version))

    return launcher
