"""Group delivery under faults (issue 33's proof; ``run.export.group-activation``,
``run.export.group-delivery``): the exporter — a real ``contextful export group bi`` child process —
is killed with SIGKILL at every step of delivering group 2 and run again, as the local profile
restarts it (the store stays; the process and its memory are gone):

- before staging (the test holds the catalog's write lock, so the staging transaction cannot commit);
- after staging, before any event reaches the receiver;
- between member events;
- after the receiver acknowledged a member event the sender had not yet recorded;
- before the group-complete event;
- after the receiver acknowledged the group-complete event (it activated the group), unrecorded;
- after the sender recorded every acknowledgement.

The kill points are the receiver side's: a forwarder in front of the receiver process holds the
chosen request (before or after passing it on) until the test has killed the sender, so each point
is reached exactly, with no hook in the exporter. After each kill the receiver's active group is a
complete one (group 1 as it was, or group 2 whole); after the restart the receiver's every staged
event and its active group equal those of an uninterrupted delivery, byte for byte (acknowledged
retries changed nothing). ``CONTEXTFUL_SOAK=1`` repeats the whole round."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.engine.export.publication_project import (
    Project,
    ReceiverProcess,
    closing_db,
    export_group,
    outbox,
    post,
)
from tests.support.soak import trials

DEADLINE_S = 120.0
"""Bounds a wait for an event that a broken build would never send; never a guess at how long it takes."""


class HoldingGate:
    """A loopback forwarder in front of the current receiver: request ``hold_at`` (counted from the
    last :meth:`arm`) is held — passed on first when ``forward`` — until :attr:`release` is set."""

    def __init__(self) -> None:
        self.target = ""
        self.hold_at: int | None = None
        self.forward = False
        self.count = 0
        self.held, self.release = threading.Event(), threading.Event()
        self.seen: list[bytes] = []
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                n, gate.count = gate.count, gate.count + 1
                gate.seen.append(body)
                status, answer = 503, b'{"error": "held"}'
                if n != gate.hold_at or gate.forward:
                    status, answer = post(gate.target, body)
                if n == gate.hold_at:
                    gate.held.set()
                    assert gate.release.wait(DEADLINE_S)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except OSError:
                    pass  # the sender was killed while its request was held

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def arm(self, target: str, hold_at: int | None = None, forward: bool = False) -> None:
        self.target, self.hold_at, self.forward, self.count = target, hold_at, forward, 0
        self.held.clear()
        self.release.clear()
        self.seen.clear()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class KillPoint:
    name: str
    hold_at: int | None
    """Which of group 2's requests is held (None: none; the exporter is killed before staging or runs through)."""
    forward: bool
    """Whether the held request reached the receiver (its answer is what is held)."""
    acknowledged: int
    """Events of group 2 the sender recorded as acknowledged when it died."""


POINTS = (
    KillPoint("before staging", None, False, -1),
    KillPoint("after staging", 0, False, 0),
    KillPoint("between member events", 2, False, 2),
    KillPoint("after a member's unrecorded acknowledgement", 2, True, 2),
    KillPoint("before group-complete", 4, False, 4),
    KillPoint("after the group-complete acknowledgement, unrecorded", 4, True, 4),
    KillPoint("after every acknowledgement was recorded", None, False, 5),
)


def spawn_export(project: Project) -> subprocess.Popen[str]:
    """``contextful --json export group bi`` as a child the test can kill (``tests.support.cli``'s environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | project.env
    return subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--json", "export", "group", "bi"],
                            cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == -signal.SIGKILL, proc.returncode


def wait_until_open(proc: subprocess.Popen[str], path: Path) -> None:
    """Until the child holds ``path`` open (it is in the store, at the write lock the test holds)."""
    done = threading.Event()
    fds = Path(f"/proc/{proc.pid}/fd")
    for _ in range(int(DEADLINE_S * 100)):
        assert proc.poll() is None, proc.communicate()
        try:
            if any(os.path.realpath(fd) == str(path.resolve()) for fd in fds.iterdir()):
                return
        except OSError:
            pass  # a descriptor closed while it was listed
        done.wait(0.01)
    raise AssertionError(f"export group never opened {path}")


@dataclass
class Base:
    """Group 1 delivered to a receiver, and a later completion to deliver as group 2: copied per case."""

    project: Path
    receiver: Path
    active: dict[str, Any]
    """The receiver's group 1."""


@pytest.fixture
def holding_gate() -> Iterator[HoldingGate]:
    gate = HoldingGate()
    yield gate
    gate.close()


@pytest.fixture
def base(tmp_path: Path, fired_project: Path, holding_gate: HoldingGate) -> Base:
    project = Project(tmp_path / "base", holding_gate.url, copy_of=fired_project)
    receiver = ReceiverProcess(tmp_path / "base-receiver.sqlite")
    holding_gate.arm(receiver.events_url)
    export_group(project)
    active = receiver.active()
    receiver.stop()
    with closing_db(receiver.db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # one file holds it whole: copied per case
    project.fire("enrich")
    assert active is not None and active["order"] == 1
    return Base(project.root, receiver.db, active)


def copy(base: Base, root: Path, gate: HoldingGate) -> tuple[Project, ReceiverProcess]:
    root.mkdir()
    shutil.copyfile(base.receiver, root / "receiver.sqlite")
    return Project(root / "p", gate.url, copy_of=base.project), ReceiverProcess(root / "receiver.sqlite")


def group2(project: Project) -> list[tuple[Any, ...]]:
    return [row for row in outbox(project) if row[0] == 2]


@pytest.mark.slow
@pytest.mark.clause("run.export.group-activation", "run.export.group-delivery")
def test_a_killed_exporter_restarted_leaves_what_an_uninterrupted_delivery_leaves(
        tmp_path: Path, base: Base, holding_gate: HoldingGate) -> None:
    gate = holding_gate
    project, receiver = copy(base, tmp_path / "reference", gate)
    gate.arm(receiver.events_url)
    export_group(project)
    reference_events, reference_active = receiver.events(), receiver.active()
    receiver.stop()
    assert reference_active is not None and reference_active["order"] == 2 and len(reference_events) == 10

    for round_ in range(trials(1, 5)):
        for n, point in enumerate(POINTS):
            project, receiver = copy(base, tmp_path / f"r{round_}-{n}", gate)
            try:
                gate.arm(receiver.events_url, point.hold_at, point.forward)
                lock = None
                if point.acknowledged < 0:  # the staging transaction cannot commit while the test holds the lock
                    lock = sqlite3.connect(project.catalog, isolation_level=None)
                    lock.execute("BEGIN IMMEDIATE")
                exporter = spawn_export(project)
                if lock is not None:
                    wait_until_open(exporter, project.catalog)
                    kill(exporter)
                    lock.execute("ROLLBACK")
                    lock.close()
                elif point.hold_at is not None:
                    assert gate.held.wait(DEADLINE_S), (point.name, exporter.poll())
                    kill(exporter)
                    gate.release.set()
                else:
                    _out, err = exporter.communicate(timeout=DEADLINE_S)
                    assert exporter.returncode == 0, err
                # the receiver's active group is a complete one: group 1 as it was, or group 2 whole
                active = receiver.active()
                expected = reference_active if point.acknowledged == 5 or (point.forward and point.hold_at == 4) \
                    else base.active
                assert active == expected, point.name
                staged = group2(project)
                acked = project.rows("SELECT acknowledged FROM cf_publication_groups WHERE sequence = 2")
                assert (len(staged), acked) == ((0, []) if point.acknowledged < 0 else
                                                (5, [(point.acknowledged,)])), point.name
                held = {event_id: body for event_id, _g, _s, _k, body in receiver.events()}
                # restarted: the store stays, the process is new
                gate.arm(receiver.events_url)
                export_group(project)
                assert receiver.events() == reference_events, point.name
                assert receiver.active() == reference_active, point.name
                # what the receiver held before the restart it holds unchanged; retried events were its own bytes
                after = {event_id: body for event_id, _g, _s, _k, body in receiver.events()}
                assert all(after[event_id] == body for event_id, body in held.items()), point.name
                expected_retries = [] if point.acknowledged == 5 else [p.encode() for *_x, p in group2(project)][
                    max(point.acknowledged, 0):]
                assert gate.seen == expected_retries, point.name
            finally:
                gate.release.set()
                receiver.stop()
