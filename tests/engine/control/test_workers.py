"""Remote workers: ``contextful worker serve`` as a real child process, serve's relay on a real loopback face.

Every worker here is ``contextful worker serve --http 127.0.0.1:0`` started as a user starts it; the
relay is serve's own ``engine.control.relay`` on a served face bound on loopback; steps are http
pipelines over :class:`Gates`, so a test decides when a step's pull answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.control.relay import MAX_RESULT_BYTES, Relay, relay_routes
from contextful.engine.control.worker_key import WorkerKey
from contextful.engine.served.face import ServedFace, bind_face
from contextful.storage.clock import ManualClock, SystemClock

from tests.engine.control.scenario import ControlProject, Gates, http_pipeline
from tests.engine.control.test_control_source import _closed_port
from tests.support.cli import contextful_in
from tests.support.recording_proxy import RecordingProxy

KEY = "k" * 40
OTHER_KEY = "o" * 40


def _env(key: str = KEY) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | {"CONTEXTFUL_WORKER_KEY": key}


class Worker:
    """``contextful worker serve --http 127.0.0.1:0`` for a project: its URL once it listens."""

    def __init__(self, root: Path, *, key: str = KEY, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(root),
                                      "worker", "serve", "--http", "127.0.0.1:0"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env if env is not None else _env(key))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it listens, or ends at its exit
        if not line.startswith("listening on "):
            self.proc.wait(30)
            raise AssertionError(f"worker did not start: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}")
        # its log is read as it comes, so a chatty worker never blocks on a full pipe
        self.url = line.split()[-1]
        self.log: list[str] = []
        self._logged = threading.Condition()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._logged:
                self.log.append(line)
                self._logged.notify_all()

    def wait_log(self, needle: str, timeout: float = 120) -> str:
        """The first stderr line holding ``needle``, once the worker wrote it."""
        with self._logged:
            if not self._logged.wait_for(lambda: any(needle in line for line in self.log), timeout):
                raise AssertionError(f"no {needle!r} in the worker's log: {self.log}")
            return next(line for line in self.log if needle in line)

    def steps(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.url + "/steps", timeout=30) as answer:
            return list(json.loads(answer.read())["in_flight"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


@dataclass
class Deployment:
    project: ControlProject
    gates: Gates
    face: ServedFace
    """The relay's own face."""
    proxy: RecordingProxy
    """The workers' ``[control] relay``: forwards to :attr:`face`, recording each heartbeat and callback."""
    relay: Relay
    workers: list[Worker]

    def table_exists(self, table: str) -> bool:
        from contextful.engine.project import open_project_store
        from contextful.storage.errors import StoreNotFound

        try:
            with open_project_store(self.project.root) as store:
                return table in store.table_names()
        except StoreNotFound:  # nothing ever landed
            return False


def _deploy(tmp_path: Path, *, workers: int = 1, clock: Any = None) -> Iterator[Deployment]:
    gates = Gates().start()
    face = bind_face("127.0.0.1:0")
    proxy = RecordingProxy(face.url).start()
    project = ControlProject(tmp_path / "p")
    held, ready = gates.gate("held"), gates.gate("ready", open_=True)
    project.write(http_pipeline("a", ready), http_pipeline("s", held, schedule=None, after="a"),
                  http_pipeline("t", ready, schedule=None, after="a"),
                  control=f'relay = "{proxy.url}"\nworkers = []')
    project.imported()
    started: list[Worker] = []
    try:
        started = [Worker(project.root) for _ in range(workers)]
        relay = Relay([w.url for w in started], proxy.url, WorkerKey(KEY.encode()), clock=clock or SystemClock())
        face.serve(relay_routes(relay))
        yield Deployment(project, gates, face, proxy, relay, started)
    finally:
        gates.open("held")
        for worker in started:
            worker.stop()
        proxy.stop()
        face.shutdown(5)
        gates.stop()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    yield from _deploy(tmp_path)


def _post(url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body if method == "POST" else None, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _submission(relay_url: str, step: str = "t", token: str = "T" * 32) -> bytes:
    return json.dumps({"run": "r1", "step": step, "attempt": 1, "version": 1,
                       "callback": f"{relay_url}/awake/{token}"}).encode()


@pytest.mark.clause("surface.dispatch.submit-signed")
def test_a_worker_admits_only_signed_submissions_in_skew_naming_its_relay(deployment: Deployment) -> None:
    worker, key, now = deployment.workers[0], WorkerKey(KEY.encode()), int(time.time())
    body = _submission(deployment.proxy.url)
    refusals = {
        "unsigned": (body, {}),
        "other key": (body, WorkerKey(OTHER_KEY.encode()).headers("submit", now, body)),
        "skewed 301 s": (body, key.headers("submit", now - 301, body)),
        "signed as a heartbeat": (body, key.headers("heartbeat", now, body)),
        "body changed after signing": (_submission(deployment.proxy.url, "a"), key.headers("submit", now, body)),
        "callback off its relay": (_submission("http://127.0.0.1:9"),
                                   key.headers("submit", now, _submission("http://127.0.0.1:9"))),
    }
    for why, (sent, headers) in refusals.items():
        status, answer = _post(worker.url + "/submit", sent, headers)
        assert (status, answer["error"]) == (403, "DispatchSubmitRejected"), why
        assert "nothing started" in answer["detail"], why
    assert "callback" in answer["detail"] and deployment.proxy.url in answer["detail"]
    assert worker.steps() == [] and not deployment.table_exists("t")  # nothing started, nothing landed
    # the same submission, signed under the key now, is admitted and its step lands
    remote = deployment.relay.submit("r1", "t", 1)
    assert deployment.relay.wait_for(remote.closed.is_set, 120)
    assert remote.result is not None and remote.result["pointer"].startswith("t@"), remote.result
    assert deployment.project.count("t") == 1


@pytest.mark.clause("surface.dispatch.heartbeat-beat", "surface.dispatch.step-result")
def test_a_worker_heartbeats_every_15_s_and_posts_a_pointer(deployment: Deployment) -> None:
    relay = deployment.relay
    remote = relay.submit("r2", "s", 1)
    assert relay.wait_for(lambda: remote.heartbeats >= 1, 60)  # the first beat comes at once
    first = time.monotonic()
    assert relay.wait_for(lambda: remote.heartbeats >= 2, 60)
    assert 14.0 <= time.monotonic() - first <= 30.0  # the next one 15 s later
    assert deployment.workers[0].steps()[0]["step"] == "s"
    deployment.gates.open("held")
    assert relay.wait_for(remote.closed.is_set, 120)
    commit = int(remote.result["pointer"].split("@")[1]) if remote.result else -1
    from contextful.engine.project import open_project_store

    with open_project_store(deployment.project.root) as store:
        head = store.catalog.load_head("s")
        assert head is not None and head.commit_seq == commit  # the pointer names the commit it made
    assert deployment.workers[0].steps() == []


def _wait_open(relay: Relay, count: int) -> None:
    assert relay.wait_for(lambda: len(relay.open_steps()) >= count, 60)


@pytest.mark.clause("surface.dispatch.callback-rejected", "surface.dispatch.callback-skew",
                    "surface.dispatch.step-result")
def test_the_relay_rejects_forged_skewed_oversized_and_replayed_callbacks(tmp_path: Path) -> None:
    # the relay's clock stands still, so 299 and 301 s from it stay exactly that however long a send
    # takes on a loaded machine (the worker signs with its own system clock, well within the skew)
    clock = ManualClock(int(time.time()) * 1_000_000)
    with contextmanager(_deploy)(tmp_path, clock=clock) as deployment:
        _check_rejected_callbacks(deployment, clock.now_us() // 1_000_000)


def _check_rejected_callbacks(deployment: Deployment, now: int) -> None:
    relay, key = deployment.relay, WorkerKey(KEY.encode())
    remote = relay.submit("r3", "s", 1)
    assert relay.wait_for(lambda: remote.heartbeats >= 1, 60)
    path = f"/awake/{remote.token}"
    url = deployment.face.url + path

    def send(body: bytes, headers: dict[str, str], method: str = "POST") -> tuple[int, dict[str, Any]]:
        return _post(url, body, headers, method)

    ok = json.dumps({"pointer": "s@99"}).encode()
    # within 300 s of the relay's clock is admitted, 301 s is not
    assert send(b"", key.headers("heartbeat", now - 299, b"", bound=path), "GET")[0] == 200
    rejected = {
        "skewed": (ok, key.headers("callback", now - 301, ok, bound=path)),
        "skewed ahead": (ok, key.headers("callback", now + 301, ok, bound=path)),
        "other key": (ok, WorkerKey(OTHER_KEY.encode()).headers("callback", now, ok, bound=path)),
        "bound to another route": (ok, key.headers("callback", now, ok, bound="/awake/" + "x" * 32)),
        "unsigned": (ok, {}),
    }
    for why, (body, headers) in rejected.items():
        status, answer = send(body, headers)
        assert (status, answer["error"]) == (403, "DispatchCallbackRejected"), why
        assert "no step changed" in answer["detail"]
    # a result that is not a pointer, key, row id or one error line, or past 1 MiB, records nothing
    for body in (b"not json", json.dumps({"pointer": "a", "error": "b"}).encode(),
                 json.dumps({"bulk": [1, 2]}).encode(),
                 json.dumps({"error": "x" * (MAX_RESULT_BYTES - 12)}).encode()):
        assert len(body) <= MAX_RESULT_BYTES + 1
        status, answer = send(body, key.headers("callback", now, body, bound=path))
        assert answer["error"] == "StepResultRefused", body[:40]
    assert len(json.dumps({"error": "x" * (MAX_RESULT_BYTES - 12)}).encode()) == MAX_RESULT_BYTES + 1
    assert not remote.closed.is_set() and remote.result is None  # nothing recorded: the step is open
    # the worker's own callback closes the step; a replay of it, captured on the wire (its very bytes
    # and headers, still within the skew), changes nothing, nor does a replay of its heartbeat
    deployment.gates.open("held")
    assert relay.wait_for(remote.closed.is_set, 120)
    recorded = dict(remote.result or {})
    captured = deployment.proxy.wait_for("POST", path)
    assert captured.status == 200 and json.loads(captured.body) == recorded
    beat = deployment.proxy.wait_for("GET", path)
    for replayed in (captured, beat):
        status, answer = send(replayed.body, replayed.headers, replayed.method)
        assert (status, answer["error"]) == (403, "DispatchCallbackRejected") and "closed" in answer["detail"]
    assert remote.result == recorded and recorded["pointer"] != "s@99"


@pytest.mark.clause("surface.dispatch.submit-exhausted")
def test_a_step_every_worker_refuses_fails_naming_the_last_refusal(tmp_path: Path) -> None:
    from contextful.storage.errors import DispatchSubmitRejected

    with contextmanager(_deploy)(tmp_path, workers=2) as deployment:
        # a relay the workers' [control] relay does not name: each refuses the callback it is handed
        elsewhere = Relay([w.url for w in deployment.workers], "http://127.0.0.1:9", WorkerKey(KEY.encode()))
        with pytest.raises(DispatchSubmitRejected) as refused:
            elsewhere.submit("r4", "t", 1)
        detail = refused.value.detail
        assert "2 tried, each once" in detail
        last = [w.url for w in deployment.workers][1]  # the rotation starts at the first worker
        assert f"the last refusal: {last}: 403" in detail and "DispatchSubmitRejected" in detail
        assert all(w.steps() == [] for w in deployment.workers) and not deployment.table_exists("t")


@pytest.mark.clause("surface.dispatch.heartbeat-lapse")
def test_a_lapsed_worker_s_step_moves_to_another_under_the_next_attempt(tmp_path: Path) -> None:
    clock = ManualClock(int(time.time() * 1_000_000))
    with contextmanager(_deploy)(tmp_path, workers=2, clock=clock) as deployment:
        relay = deployment.relay
        remote = relay.submit("r5", "s", 1)
        assert relay.wait_for(lambda: remote.heartbeats >= 1, 60)
        first, stale = remote.worker, remote.token
        [dead] = [w for w in deployment.workers if w.url == first]
        dead.proc.send_signal(signal.SIGKILL)  # mid-step: its pull is held open
        dead.proc.wait(30)
        clock.advance(60)
        assert relay.reschedule_lapsed() == []  # 60 s is no lapse yet
        clock.advance(1)
        assert relay.reschedule_lapsed() == [remote]
        assert remote.attempt == 2 and remote.worker != first and remote.token != stale
        assert relay.wait_for(lambda: remote.heartbeats >= 2, 60)  # the successor beats on its own route
        # the first worker's route is its superseded attempt: whatever it posts changes nothing
        key, path = WorkerKey(KEY.encode()), f"/awake/{stale}"
        late = json.dumps({"pointer": "s@1"}).encode()
        status, answer = _post(deployment.face.url + path, late, key.headers("callback", int(time.time()), late,
                                                                             bound=path))
        assert (status, answer["error"]) == (403, "DispatchCallbackRejected") and "current attempt 2" in answer["detail"]
        deployment.gates.open("held")
        assert relay.wait_for(remote.closed.is_set, 120)
        assert remote.ok and remote.attempt == 2, remote.result
        assert deployment.project.count("s") == 1  # landed once, by the successor


@pytest.mark.clause("surface.dispatch.worker-key")
def test_serve_listing_workers_without_relay_or_key_refuses_and_binds_nothing(tmp_path: Path) -> None:
    for n, (control, env, named) in enumerate( (('workers = ["http://127.0.0.1:9"]', _env(), "[control].relay"),
                                ('workers = ["http://127.0.0.1:9"]\nrelay = "http://127.0.0.1:8"',
                                 {k: v for k, v in _env().items() if k != "CONTEXTFUL_WORKER_KEY"},
                                 "CONTEXTFUL_WORKER_KEY"),
                                ('workers = ["http://127.0.0.1:9"]\nrelay = "http://127.0.0.1:8"', _env("short"),
                                 "CONTEXTFUL_WORKER_KEY"))):
        project = ControlProject(tmp_path / f"p{n}")
        project.write(http_pipeline("a", "http://127.0.0.1:9/a"), control=control)
        project.imported()
        proc = contextful_in(None, "--project", str(project.root), "pipeline", "serve", "--http", "127.0.0.1:0",
                             env={k: v for k, v in env.items() if k.startswith("CONTEXTFUL_")}, check=False,
                             timeout=120)
        assert proc.returncode != 0 and "listening on" not in proc.stdout, (control, proc.stdout)
        assert "error: ManifestValueInvalid" in proc.stderr and named in proc.stderr, proc.stderr


@pytest.mark.clause("surface.dispatch.worker-key")
def test_a_worker_without_the_key_refuses_to_start(tmp_path: Path) -> None:
    project = ControlProject(tmp_path / "p")
    project.write(control='relay = "http://127.0.0.1:8"')
    proc = contextful_in(None, "--project", str(project.root), "worker", "serve", "--http", "127.0.0.1:0",
                         check=False, timeout=120)
    assert proc.returncode != 0 and "listening on" not in proc.stdout
    assert "CONTEXTFUL_WORKER_KEY" in proc.stderr


def test_worker_list_shows_in_flight_steps_and_heartbeats(deployment: Deployment) -> None:
    remote = deployment.relay.submit("r6", "s", 1)
    assert deployment.relay.wait_for(lambda: remote.heartbeats >= 1, 60)
    worker = deployment.workers[0]
    proc = contextful_in(None, "--project", str(deployment.project.root), "--json", "worker", "list",
                         "--worker", worker.url, timeout=120)
    [row] = json.loads(proc.stdout)["workers"]
    [step] = row["in_flight"]
    assert (step["run"], step["step"], step["attempt"]) == ("r6", "s", 1) and step["last_heartbeat"] is not None
    threading.Thread(target=deployment.gates.open, args=("held",)).start()
    assert deployment.relay.wait_for(remote.closed.is_set, 120)


@pytest.mark.clause("surface.dispatch.heartbeat-lapse", "surface.dispatch.callback-rejected")
def test_a_stopped_worker_resumed_after_its_step_moved_changes_nothing(tmp_path: Path) -> None:
    """Fault: SIGSTOP a worker mid-step (its heartbeats stop), move its step, SIGCONT it: its late
    callback is rejected, the successor's outcome stays, and the step's rows land once."""
    clock = ManualClock(int(time.time() * 1_000_000))
    with contextmanager(_deploy)(tmp_path, workers=2, clock=clock) as deployment:
        relay = deployment.relay
        remote = relay.submit("r7", "s", 1)
        assert relay.wait_for(lambda: remote.heartbeats >= 1, 60)
        [stopped] = [w for w in deployment.workers if w.url == remote.worker]
        stopped.proc.send_signal(signal.SIGSTOP)
        try:
            clock.advance(61)
            assert relay.reschedule_lapsed() == [remote] and remote.attempt == 2
            deployment.gates.open("held")
            assert relay.wait_for(remote.closed.is_set, 180)  # the successor answered
            successor = dict(remote.result or {})
        finally:
            stopped.proc.send_signal(signal.SIGCONT)
        refused = stopped.wait_log("callback POST of step r7/s/1 refused: 403")
        assert "DispatchCallbackRejected" in refused
        assert remote.result == successor and remote.attempt == 2  # no late answer overwrote it
        # whichever worker's run owned the pipeline landed its rows; the other landed nothing
        assert "ExecutionHeld" in successor.get("error", "") or successor.get("pointer", "").startswith("s@")
        assert deployment.project.count("s") == 1


@pytest.mark.clause("surface.dispatch.worker-target")
def test_serve_lands_each_landing_step_on_a_worker_through_its_relay(tmp_path: Path) -> None:
    from tests.engine.control.scenario import files_pipeline

    project = ControlProject(tmp_path / "p")
    relay = f'relay = "http://127.0.0.1:{_closed_port()}"'
    blocks = (files_pipeline("a"), files_pipeline("s", schedule=None, after="a"))
    project.rows("a", 3)
    project.rows("s", 2)
    project.write(*blocks, control=relay)
    worker = Worker(project.root)
    try:
        project.write(*blocks, control=f'{relay}\nworkers = ["{worker.url}"]')
        project.imported()
        proc = contextful_in(None, "--project", str(project.root), "--json", "pipeline", "serve", "--cycle",
                             env={"CONTEXTFUL_WORKER_KEY": KEY}, check=False, timeout=300)
        answer = json.loads(proc.stdout)
        assert proc.returncode == 0 and answer["fired"] == ["a", "s"], (proc.stdout, proc.stderr)
        # each landing member went to the worker's POST /submit, keyed by run, step and attempt 1
        admitted = [worker.wait_log(f"/{member}/1: admitted") for member in ("a", "s")]
        run = admitted[0].split()[1].split("/")[0]
        assert run.startswith("a-") and f"step {run}/s/1" in admitted[1]
        assert "pointer" in worker.wait_log(f"step {run}/s/1: {{")
        assert (project.count("a"), project.count("s")) == (3, 2)
    finally:
        worker.stop()


@pytest.mark.clause("surface.dispatch.submit-exhausted")
def test_serve_fails_a_unit_every_worker_refuses_naming_the_last_refusal(tmp_path: Path) -> None:
    from tests.engine.control.scenario import files_pipeline

    project = ControlProject(tmp_path / "p")
    blocks = (files_pipeline("a"),)
    project.rows("a", 3)
    project.write(*blocks, control='relay = "http://127.0.0.1:9"')  # the workers' relay is not serve's
    workers = [Worker(project.root), Worker(project.root)]
    try:
        listed = ", ".join(f'"{w.url}"' for w in workers)
        project.write(*blocks, control=f'relay = "http://127.0.0.1:{_closed_port()}"\nworkers = [{listed}]')
        project.imported()
        proc = contextful_in(None, "--project", str(project.root), "--json", "pipeline", "serve", "--cycle",
                             env={"CONTEXTFUL_WORKER_KEY": KEY}, check=False, timeout=300)
        answer = json.loads(proc.stdout)
        assert proc.returncode == 1 and answer["failed"] == ["a"], (proc.stdout, proc.stderr)
        [failure] = answer["failures"]
        assert "DispatchSubmitRejected" in failure and "2 tried, each once" in failure
        assert f"the last refusal: {workers[1].url}: 403" in failure or f"the last refusal: {workers[0].url}: 403" in failure
        assert not any("admitted" in line for w in workers for line in w.log)
    finally:
        for w in workers:
            w.stop()


def test_control_workers_and_relay_must_be_http_urls(tmp_path: Path) -> None:
    project = ControlProject(tmp_path / "p")
    project.write(http_pipeline("a", "http://127.0.0.1:9/a"), control='workers = ["ftp://w"]\nrelay = 7')
    proc = project.cli("pipeline", "validate", check=False)
    assert proc.returncode != 0
    assert "ManifestValueInvalid" in proc.stderr + proc.stdout
    assert "workers" in proc.stderr + proc.stdout and "relay" in proc.stderr + proc.stdout
