"""Serve and ``contextful export group`` over one publication: the export holds it, serve's units writing
its inputs hold it shared (``surface.dispatch.export-quiesced``, ``export-deferred-slot``,
``export-claim``, ``export-claim-unread``).

Everything runs as a user runs it: ``contextful pipeline serve`` (a daemon, or ``--cycle``) and
``contextful export group`` as child processes, the receiver as its own process (``python -m contextful.engine.export.receiver``)
behind a loopback forwarder that can hold a delivery open, and the unit's source a loopback API that
can hold its answer (so the unit stays in flight until the test lets it go). The project is the
publication tests' (``tests.engine.export.publication_project``) with ``orders`` pulled over HTTP on a
schedule, the build ``build_reports`` riding its unit, and an unrelated pipeline ``other`` beside it
in a pool of one. Oracles: the cycle's JSON answer and log, the daemon's log, the catalog's dispatch
records read through the store, ``pipeline status``, the receiver's active group.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.export.receiver import rows
from contextful.engine.project import open_project_store

from tests.engine.control.scenario import serving
from tests.engine.export import conftest as export_fixtures
from tests.engine.export.publication_project import MANIFEST, PUBLICATION, Project, ReceiverProcess, post
from tests.support.http_api import JsonApi, Reply, Request

FILES_ORDERS = MANIFEST[MANIFEST.index("[[pipeline]]"):MANIFEST.index("[[model]]")]
"""The publication project's ``orders``: a files pipeline without a schedule."""

receiver = export_fixtures.receiver
"""The export tests' receiver process fixture."""


class Feed(JsonApi):
    """``GET /orders``: the order rows set by the test; while :attr:`shut`, each answer waits for it to open."""

    def __init__(self) -> None:
        super().__init__()
        self.ids = [1, 2]
        self.open = threading.Event()
        self.open.set()
        self._arrived = threading.Condition()
        self.pulls = 0
        self.route("/orders", self._answer_orders)

    def _answer_orders(self, _request: Request) -> Reply:
        with self._arrived:
            self.pulls += 1
            self._arrived.notify_all()
        self.open.wait(120)
        return Reply(200, [{"id": i, "amount": i * 10} for i in self.ids])

    def wait_requests(self, count: int, timeout: float = 120) -> None:
        with self._arrived:
            assert self._arrived.wait_for(lambda: self.pulls >= count, timeout), self.pulls


class Holding(JsonApi):
    """A forwarder to the receiver that holds each delivery until :attr:`release` is set."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.release = threading.Event()
        self.arrived = threading.Event()
        self.route("/events", self._forward)

    def _forward(self, request: Request) -> Reply:
        self.arrived.set()
        self.release.wait(120)
        status, body = post(self.target, request.body)
        return Reply(status, body)


def manifest(feed: Feed) -> str:
    """The publication project's manifest, ``orders`` pulled from ``feed`` every second with
    ``build_reports`` riding its unit, ``other`` beside it, in a pool of one."""
    assert FILES_ORDERS in MANIFEST
    http = ('[[pipeline]]\nid = "orders"\nprimary_key = ["id"]\nschedule = "every 1s"\n[pipeline.source]\n'
            f'kind = "http"\n[pipeline.source.config]\nurl = "{feed.url}/orders"\ntimeout_s = 300\n\n'
            '[[pipeline]]\nid = "other"\nprimary_key = ["id"]\nschedule = "every 1s"\n[pipeline.source]\n'
            'kind = "files"\n[pipeline.source.config]\npaths = ["other/*.ndjson"]\n')
    text = MANIFEST.replace(FILES_ORDERS, http).replace('target = ["daily", "weekly"]',
                                                   'target = ["daily", "weekly"]\nafter = "orders"')
    return text.replace('modules = ["shop.bodies"]', 'modules = ["shop.bodies"]\n\n[control]\npool = 1')


@pytest.fixture
def feed() -> Iterator[Feed]:
    with Feed() as started:
        yield started


@pytest.fixture
def holding(receiver: ReceiverProcess) -> Iterator[Holding]:
    with Holding(receiver.events_url) as started:
        yield started


def project_of(root: Path, feed: Feed, destination: str) -> Project:
    """The project applied, ``orders`` landed and both producers completed, then ``other`` landed
    (so ``orders`` is due first: its next fire is the earlier one)."""
    project = Project(root, None)
    project.write(destination, manifest=manifest(feed), publication=PUBLICATION)
    project.cli("pipeline", "import")
    project.cli("pipeline", "run", "orders")
    project.fire("enrich")
    project.fire("build_reports")
    (root / "other").mkdir()
    (root / "other" / "a.ndjson").write_text('{"id": 1}\n')
    project.cli("pipeline", "run", "other")
    return project


def status(project: Project) -> dict[str, dict[str, Any]]:
    """``contextful --json pipeline status``: each armed entry by id."""
    doc = json.loads(project.cli("--json", "pipeline", "status").stdout)
    return {entry["id"]: entry for entry in doc["armed"]}


def wait_due(project: Project, *heads: str, timeout: float = 60) -> dict[str, dict[str, Any]]:
    """Wait (reading ``pipeline status`` until a deadline) until each of ``heads`` is due."""
    from contextful.engine.control.fire import rfc3339

    done = threading.Event()
    timer = threading.Timer(timeout, done.set)
    timer.start()
    try:
        while True:
            found = status(project)
            now = rfc3339(time.time_ns() // 1000)
            if all(found[h]["next_fire"] is not None and found[h]["next_fire"] <= now for h in heads):
                return found
            assert not done.wait(0.1), f"{heads} not due after {timeout} s: {found}"
    finally:
        timer.cancel()


def dispatches(project: Project) -> dict[str, int]:
    """The catalog's dispatch records of the deployment (each head's last dispatch)."""
    with open_project_store(project.root) as store:
        return store.catalog.dispatches("pubs")


def cycle(project: Project) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = project.cli("--json", "pipeline", "serve", "--cycle", check=False)
    try:
        return proc, json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"cycle exit {proc.returncode}: {proc.stdout!r} {proc.stderr}") from exc


class Export:
    """``contextful export group bi`` as a child process, its stderr read line by line as it comes."""

    def __init__(self, project: Project) -> None:
        import os

        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | project.env
        self.proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project.root),
                                      "--json", "export", "group", "bi"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_line(self, needle: str, timeout: float = 120) -> str:
        with self._seen:
            assert self._seen.wait_for(lambda: any(needle in line for line in self.lines) or self.proc.poll()
                                       is not None, timeout), self.lines
            found = [line for line in self.lines if needle in line]
            assert found, f"export group exited {self.proc.returncode} before {needle!r}: {self.lines}"
            return found[0]

    def finish(self, timeout: float = 120) -> dict[str, Any]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._reader.join(10)
        assert self.proc.returncode == 0, (self.proc.returncode, self.lines)
        done: dict[str, Any] = json.loads(out)
        return done

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)




@pytest.fixture
def exports() -> Iterator[list[Export]]:
    started: list[Export] = []
    yield started
    for export in started:
        export.kill()


@pytest.mark.clause("surface.dispatch.export-quiesced")
@pytest.mark.clause("surface.dispatch.export-deferred-slot")
def test_a_unit_writing_a_held_publications_inputs_starts_nothing_and_its_slot_passes_on(
        tmp_path: Path, feed: Feed, receiver: ReceiverProcess, holding: Holding, exports: list[Export]) -> None:
    project = project_of(tmp_path / "p", feed, holding.url + "/events")
    exports.append(export := Export(project))
    assert holding.arrived.wait(120), export.lines  # export group holds bi: it is delivering
    before = wait_due(project, "orders", "other")
    dispatched = dispatches(project)

    proc, answer = cycle(project)
    # orders (its unit lands a relation both producers read, and build_reports riding it writes members)
    # starts nothing and stays due, reporting pending; other, next in admission order, takes the slot
    assert proc.returncode == 0, proc.stderr
    assert answer["fired"] == ["other"] and answer["failed"] == []
    assert answer["pending"] == ["orders", "job:build_reports"]
    assert "orders: pending: contextful export group holds publication 'bi' by export group bi pid" in proc.stderr
    assert feed.pulls == 1  # the setup's run alone: the deferred unit pulled nothing
    # no dispatch record for orders, so its next fire did not move
    after = dispatches(project)
    assert after.get("orders") == dispatched.get("orders") and after["other"] != dispatched.get("other")
    assert status(project)["orders"]["next_fire"] == before["orders"]["next_fire"]

    holding.release.set()
    assert export.finish()["delivered"] == 5
    # the export over, the next evaluation starts it first (other, due again, refills the slot after it)
    proc, answer = cycle(project)
    assert proc.returncode == 0, proc.stderr
    assert answer["fired"][:2] == ["orders", "job:build_reports"]
    assert dispatches(project)["orders"] != dispatched.get("orders")


@pytest.mark.clause("surface.dispatch.export-claim")
def test_an_export_started_while_a_unit_writes_its_inputs_waits_for_the_unit_and_carries_its_commit(
        tmp_path: Path, feed: Feed, receiver: ReceiverProcess, exports: list[Export]) -> None:
    project = project_of(tmp_path / "p", feed, receiver.events_url)
    wait_due(project, "orders")
    feed.ids = [1, 2, 3]
    feed.open.clear()
    served: list[tuple[subprocess.CompletedProcess[str], dict[str, Any]]] = []
    cycling = threading.Thread(target=lambda: served.append(cycle(project)), daemon=True)
    cycling.start()
    feed.wait_requests(2)  # the unit is in flight (admitted: its claim taken before it started)

    exports.append(export := Export(project))
    waiting = export.wait_line("bi: waiting for serve unit orders")
    assert "to end before reading anything" in waiting
    assert receiver.events() == [] and export.proc.poll() is None  # nothing read, staged or delivered

    feed.open.set()
    cycling.join(300)
    proc, answer = served[0]
    assert proc.returncode == 0 and answer["fired"][:2] == ["orders", "job:build_reports"], proc.stderr
    done = export.finish()
    assert done["delivered"] == 5
    # the group carries the unit's commit: the build riding it counted the three orders it landed
    active = receiver.active()
    assert active is not None and rows(active["members"]["build_reports.daily"]).to_pylist() == [{"n": 3}]
    run_ids = {c["producer"]: c["run_id"] for c in project.completions()}
    assert json.dumps(run_ids["build_reports"]) in json.dumps(active)


@pytest.mark.clause("surface.dispatch.export-claim-unread")
def test_a_unit_whose_publication_inputs_cannot_be_read_claims_every_publication(
        tmp_path: Path, feed: Feed, receiver: ReceiverProcess, holding: Holding, exports: list[Export]) -> None:
    project = project_of(tmp_path / "p", feed, holding.url + "/events")
    # a version written into the snapshot directory by hand, past import's and apply's validation: its
    # producer's statement does not parse, so no unit's publication inputs can be computed from it
    snapshots = project.root / ".contextful" / "control" / "pubs"
    text = (snapshots / "manifest@v1.toml").read_text()
    assert "SELECT id, amount FROM orders" in text
    (snapshots / "manifest@v2.toml").write_text(text.replace("SELECT id, amount FROM orders",
                                                             "SELECT id, amount FROM orders WHERE"))
    (snapshots / "manifest@current").write_text("2\n")
    exports.append(export := Export(project))
    assert holding.arrived.wait(120), export.lines
    wait_due(project, "orders", "other")
    dispatched = dispatches(project)

    proc, answer = cycle(project)
    # other lands a table no publication reads, but with its inputs unreadable it claims bi as well
    assert proc.returncode == 0 and answer["version"] == 2, proc.stderr
    assert answer["fired"] == [] and answer["pending"] == ["orders", "job:build_reports", "other"]
    assert "other: its publication inputs cannot be computed (" in proc.stderr
    assert "syntax error" in proc.stderr and "it claims every declared publication" in proc.stderr
    assert "other: pending: contextful export group holds publication 'bi'" in proc.stderr
    assert dispatches(project) == dispatched
    holding.release.set()
    export.finish()


@pytest.mark.clause("surface.dispatch.export-claim-unread")
@pytest.mark.clause("surface.dispatch.export-deferred-slot")
def test_a_unit_whose_claim_cannot_be_taken_starts_nothing_stays_due_and_logs_the_error(
        tmp_path: Path, feed: Feed, receiver: ReceiverProcess, exports: list[Export]) -> None:
    project = project_of(tmp_path / "p", feed, receiver.events_url)
    exports.append(export := Export(project))
    export.finish()  # its hold came and went: the holds table exists
    with sqlite3.connect(project.catalog) as conn:  # the holds store refuses every new claim
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON cf_publication_holds "
                     "BEGIN SELECT RAISE(ABORT, 'the holds store refuses writes'); END")
    dispatched = dispatches(project)

    with serving(project) as daemon:  # type: ignore[arg-type]  # serve reads only the project's root
        error = daemon.wait_line("orders: pending: error: its claim on publication(s) bi could not be taken")[0]
        assert "the holds store refuses writes" in error and "starts nothing and stays due" in error
        daemon.wait_line("fired other", count=2)  # the slot orders would take passes on, beat after beat
        assert feed.pulls == 1 and dispatches(project).get("orders") == dispatched.get("orders")
        assert not [line for line in daemon.lines if "fired orders" in line]
        assert len([line for line in daemon.lines if "could not be taken" in line]) == 1  # logged once

        with sqlite3.connect(project.catalog) as conn:
            conn.execute("DROP TRIGGER refuse")
        daemon.wait_line("fired orders")  # still due: the next beat starts it
        daemon.wait_line("orders: ok (orders, job:build_reports)")
        assert daemon.stop() == 0
