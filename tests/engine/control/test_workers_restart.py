"""The relay across a serve restart: its attempts are journaled in the awakeable store
(``engine.control.attempts``), so a serve killed while a step runs on a worker loses nothing.

The process test kills ``contextful pipeline serve`` (SIGKILL) while a worker holds a landing step
and lets the worker finish while no serve runs: its callback, sent again until a relay answers,
lands in the serve started next, the unit goes on with its next step in the same run, and the
rows land once. The relay tests restart the relay
alone (a new :class:`Relay` over the same journal, on the port the workers call back) with real
worker processes, to move a re-adopted step on a lapse by an injected clock and to replay a
captured callback against the restarted relay.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from contextful.engine.control.attempts import AttemptJournal
from contextful.engine.control.relay import Relay, relay_routes
from contextful.engine.control.worker_key import WorkerKey
from contextful.engine.project import open_project_store
from contextful.engine.served.face import ServedFace, bind_face
from contextful.storage import Store
from contextful.storage.clock import ManualClock

from tests.engine.control.scenario import ControlProject, Gates, Serve, http_pipeline
from tests.engine.control.test_control_source import _closed_port
from tests.engine.control.test_workers import KEY, Worker, _post
from tests.support.recording_proxy import RecordingProxy


@pytest.mark.clause("surface.dispatch.callback-rejected", "surface.dispatch.worker-target")
def test_a_step_in_flight_when_serve_is_killed_lands_once_through_the_restarted_serve(tmp_path: Path) -> None:
    gates = Gates().start()
    project = ControlProject(tmp_path / "p")
    relay = f'relay = "http://127.0.0.1:{_closed_port()}"'
    blocks = (http_pipeline("a", gates.gate("held")),
              http_pipeline("s", gates.gate("s", open_=True), schedule=None, after="a"))
    project.write(*blocks, control=relay)
    worker = Worker(project.root)
    serves: list[Serve] = []
    try:
        project.write(*blocks, control=f'{relay}\nworkers = ["{worker.url}"]')
        project.imported()
        env = {"CONTEXTFUL_WORKER_KEY": KEY}
        serves.append(Serve(project, env=env))
        admitted = worker.wait_log("/a/1: admitted")
        run = admitted.split()[1].split("/")[0]
        gates.wait_arrived(1)  # the worker's pull of a is held open: the step is in flight
        serves[0].stop(signal.SIGKILL)
        gates.open("held")  # a lands while no serve runs: its callback finds no relay, and is sent again
        worker.wait_log(f"callback of step {run}/a/1 did not reach the relay")
        serves.append(Serve(project, env=env))
        serves[1].wait_line("re-adopted a")
        serves[1].wait_line("a: ok (a, s)", timeout=180)
        # the worker's callback of a landed in the new serve; s followed in the same run
        assert "pointer" in worker.wait_log(f"step {run}/a/1: {{")
        assert worker.wait_log(f"step {run}/s/1: admitted")
        assert not any("DispatchCallbackRejected" in line for line in worker.log), worker.log  # none refused
        assert (project.count("a"), project.count("s")) == (1, 1)
    finally:
        for serve in serves:
            if serve.proc.poll() is None:
                serve.stop(signal.SIGKILL)
        worker.stop()
        gates.stop()


@contextmanager
def _relay_on(port: int, store: Store, workers: list[str], url: str, clock: ManualClock) -> Iterator[Relay]:
    """A relay on ``127.0.0.1:<port>`` journaling in ``store``: what serve binds, started again as it would be."""
    face: ServedFace = bind_face(f"127.0.0.1:{port}")
    relay = Relay(workers, url, WorkerKey(KEY.encode()), clock=clock, attempts=AttemptJournal(store.awakeables))
    face.serve(relay_routes(relay))
    try:
        yield relay
    finally:
        face.shutdown(5)


@pytest.mark.clause("surface.dispatch.heartbeat-lapse", "surface.dispatch.callback-rejected")
def test_a_restarted_relay_readopts_open_steps_moves_a_lapsed_one_and_admits_a_callback_once(
        tmp_path: Path) -> None:
    gates = Gates().start()
    port = _closed_port()
    proxy = RecordingProxy(f"http://127.0.0.1:{port}").start()  # the workers' relay: it records their calls
    project = ControlProject(tmp_path / "p")
    held, kept = gates.gate("held"), gates.gate("kept")
    project.write(http_pipeline("a", gates.gate("ready", open_=True)), http_pipeline("s", held, schedule=None),
                  http_pipeline("t", kept, schedule=None), control=f'relay = "{proxy.url}"\nworkers = []')
    project.imported()
    clock = ManualClock(int(time.time() * 1_000_000))
    workers = [Worker(project.root), Worker(project.root)]
    urls = [w.url for w in workers]
    store = open_project_store(project.root, create=True)
    try:
        with _relay_on(port, store, urls, proxy.url, clock) as first:
            s, t = first.submit("r1", "s", 1), first.submit("r1", "t", 1)
            assert first.wait_for(lambda: s.heartbeats >= 1 and t.heartbeats >= 1, 60)
        # serve is gone; the workers hold both steps. s's worker dies too.
        [dead] = [w for w in workers if w.url == s.worker]
        dead.proc.send_signal(signal.SIGKILL)
        dead.proc.wait(30)
        with _relay_on(port, store, urls, proxy.url, clock) as second:
            adopted = {r.step: r for r in second.readopt()}
            assert {(r.step, r.attempt, r.token, r.worker) for r in adopted.values()} == {
                ("s", 1, s.token, s.worker), ("t", 1, t.token, t.worker)}
            assert second.readopt() == []  # claimed once
            clock.advance(61)
            # t's worker heartbeats on (every 15 s of real time): its heartbeat keeps t
            beat = len(proxy.captured)
            assert proxy.wait_until(lambda seen: any(c.method == "GET" and c.path == f"/awake/{t.token}"
                                                     and c.status == 200 for c in seen[beat:]), 60)
            assert second.reschedule_lapsed() == [adopted["s"]]  # s's worker is silent: s moves, t stays
            moved = adopted["s"]
            assert moved.attempt == 2 and moved.worker != s.worker and moved.token != s.token
            assert adopted["t"].attempt == 1
            gates.open("held", "kept")
            assert second.wait_for(lambda: moved.closed.is_set() and adopted["t"].closed.is_set(), 180)
            assert moved.ok and adopted["t"].ok, (moved.result, adopted["t"].result)
            # t's callback, captured on the wire, replayed: admitted once, refused after
            captured = proxy.wait_for("POST", f"/awake/{t.token}")
            assert captured.status == 200
            status, answer = _post(f"http://127.0.0.1:{port}/awake/{t.token}", captured.body, captured.headers)
            assert (status, answer["error"]) == (403, "DispatchCallbackRejected") and "closed" in answer["detail"]
        # a third relay finds nothing open, and refuses the replay and s's superseded attempt by the journal
        with _relay_on(port, store, urls, proxy.url, clock) as third:
            assert third.readopt() == []
            status, answer = _post(f"http://127.0.0.1:{port}/awake/{t.token}", captured.body, captured.headers)
            assert (status, answer["error"]) == (403, "DispatchCallbackRejected") and "closed" in answer["detail"]
            key, path = WorkerKey(KEY.encode()), f"/awake/{s.token}"
            late = json.dumps({"pointer": "s@1"}).encode()
            status, answer = _post(f"http://127.0.0.1:{port}{path}", late,
                                   key.headers("callback", int(time.time()), late, bound=path))
            assert (status, answer["error"]) == (403, "DispatchCallbackRejected")
        assert (project.count("s"), project.count("t")) == (1, 1)
    finally:
        gates.open("held", "kept")
        for worker in workers:
            worker.stop()
        store.close()
        proxy.stop()
        gates.stop()

