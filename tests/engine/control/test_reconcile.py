"""The reconciler end to end: real ``contextful pipeline serve`` daemons and ``serve --cycle`` processes
polling a real loopback control URL (``tests.engine.control.pulled.ControlServer``) that serves a
control directory, and the daemon's loop on an injected clock for the poll cadence.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from contextful.engine.control.daemon import Daemon
from contextful.engine.control.fire import ControlPlane
from contextful.engine.control.reconcile import node_reconciler
from contextful.engine.project import open_project_store
from contextful.storage.clock import ManualClock

from tests.engine.control.pulled import Chain, ControlServer, project_text
from tests.engine.control.scenario import ControlProject, files_pipeline, serving
from tests.support.cli import contextful_in
from tests.support.http_api import JsonApi, Reply

NEVER = "0 0 1 1 *"
"""A poll schedule that comes due once a year: between a daemon's start and a test's end only a wake polls."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ControlServer]:
    with ControlServer(tmp_path / "published") as api:
        yield api


def url_node(tmp_path: Path, server: ControlServer, *blocks: str, control: str = "") -> ControlProject:
    """A node whose control source is ``server``'s control URL (its working file declaring ``blocks``)."""
    node = ControlProject(tmp_path / "node")
    node.write(*blocks, control=f'url = "{server.control_url}"\n{control}')
    return node


def pointer(node: ControlProject) -> str | None:
    path = node.root / ".contextful" / "control" / node.name / "manifest@current"
    return path.read_text() if path.exists() else None


def wake(url: str) -> dict[str, object]:
    request = urllib.request.Request(f"{url}/wake", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=60) as answer:
        return dict(json.loads(answer.read()))


@pytest.mark.clause("surface.reconcile.poll-cadence")
@pytest.mark.parametrize(("poll", "gap_s"), [(None, 30), ("every 10s", 10), ("*/2 * * * *", 120)])
def test_serve_reads_its_control_url_at_each_instant_its_poll_schedule_admits(
        tmp_path: Path, server: ControlServer, poll: str | None, gap_s: int) -> None:
    chain = Chain(server.directory, "ctl", None)
    chain.publish(project_text("ctl", files_pipeline("orders", schedule=None)))
    node = url_node(tmp_path, server, files_pipeline("orders", schedule=None),
                    control=f'poll = "{poll}"' if poll else "")
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))  # on a whole 120 s: every gap divides it
    start = clock.now_us()
    polled_at: list[int] = []
    server.fault = lambda name: polled_at.append(clock.now_us()) if name == "manifest@current" else None
    said: list[str] = []
    reconciler = node_reconciler(node.root, store=None, clock=clock, say=said.append)
    assert reconciler is not None
    plane = ControlPlane(node.root, lambda: open_project_store(node.root, create=True), clock=clock, say=said.append,
                         reconciler=reconciler)
    stop = threading.Event()

    def sleep(seconds: float) -> None:  # the daemon's wait, on the injected clock
        clock.advance(seconds)
        if clock.now_us() - start > (3 * gap_s + 1) * 1_000_000:
            stop.set()

    Daemon(plane, "in-process", stop, sleep=sleep, drain=False).run()
    assert [(t - start) // 1_000_000 for t in polled_at] == [0, gap_s, 2 * gap_s, 3 * gap_s]
    assert "adopted v1 from " + server.control_url in said and pointer(node) == "1\n"


@pytest.mark.clause("surface.reconcile.learns-by-reading", "surface.reconcile.url-layout",
                    "surface.reconcile.pulled-control")
def test_a_daemon_learns_a_new_version_only_by_reading_its_control_url_on_each_wake(
        tmp_path: Path, server: ControlServer) -> None:
    chain = Chain(server.directory, "ctl", None)
    node = url_node(tmp_path, server, files_pipeline("orders"), files_pipeline("returns"),
                    control=f'trigger = "external"\npoll = "{NEVER}"')
    node.rows("orders", 2)
    node.rows("returns", 3)
    with serving(node, "--http", "127.0.0.1:0") as daemon:
        url = daemon.url
        daemon.wait_line("nothing armed until a poll adopts one")  # the pointer answered 404: no version yet
        assert server.polls() == 1 and pointer(node) is None
        # the source's head declares one of the two pipelines the node's file declares
        chain.publish(project_text("ctl", files_pipeline("orders")))
        assert pointer(node) is None  # published is not learnt: nothing pushes a version to the daemon
        answer = wake(url)  # a wake reads the source first
        assert answer["version"] == 1 and answer["fired"] == ["orders"] and answer["armed"] == 1
        assert server.polls() == 2 and pointer(node) == "1\n"
        chain.publish(project_text("ctl", files_pipeline("orders"), files_pipeline("returns")))
        answer = wake(url)
        assert answer["version"] == 2 and answer["fired"] == ["returns"] and answer["armed"] == 2
        assert server.polls() == 3
        assert daemon.stop() == 0
    assert any(f"adopted v2 from {server.control_url}" in line for line in daemon.lines)
    assert node.count("orders") == 2 and node.count("returns") == 3


@pytest.mark.clause("surface.reconcile.poll-cadence", "surface.reconcile.learns-by-reading")
def test_an_in_process_daemon_adopts_and_rearms_what_its_poll_finds(tmp_path: Path, server: ControlServer) -> None:
    chain = Chain(server.directory, "ctl", None)
    chain.publish(project_text("ctl", files_pipeline("orders", schedule=None)))
    node = url_node(tmp_path, server, files_pipeline("orders"), control='poll = "every 1s"')
    node.rows("orders", 2)
    with serving(node) as daemon:  # no address: a node with a control URL serves its schedules
        daemon.wait_line("armed v1: 0 entries")
        server.wait_polls(server.polls() + 2)  # and keeps polling, every second
        chain.publish(project_text("ctl", files_pipeline("orders", schedule="every 1h")))  # the schedule diff
        daemon.wait_line(f"adopted v2 from {server.control_url}")
        daemon.wait_line("armed v2: 1 entry")
        daemon.wait_line("orders: ok")
        assert daemon.stop() == 0
    assert node.count("orders") == 2


SECOND = project_text("ctl", files_pipeline("orders", schedule="every 1h")).encode()


@pytest.mark.clause("surface.reconcile.fail-static", "surface.reconcile.pointer-malformed",
                    "surface.reconcile.pulled-control-untrusted")
def test_a_failed_poll_is_logged_and_leaves_the_armed_set_firing(tmp_path: Path, server: ControlServer) -> None:
    chain = Chain(server.directory, "ctl", None)
    chain.publish(project_text("ctl", files_pipeline("orders", schedule="every 2s")))
    node = url_node(tmp_path, server, files_pipeline("orders"), control='poll = "every 1s"')
    node.rows("orders", 2)
    failures = [
        ("5xx", lambda name: Reply(500, b"oops"), "ControlSnapshotUnreadable:", "HTTP 500"),
        ("garbage pointer", lambda name: Reply(200, b"2 please") if name == "manifest@current" else None,
         "ControlPointerMalformed:", "'2 please'"),
        ("redirect", lambda name: Reply(302, b"", {"Location": "/control/x"}) if name == "manifest@current" else None,
         "ControlSnapshotUnreadable:", "HTTP 302"),
        ("unparseable snapshot", lambda name: (Reply(200, b"2\n") if name == "manifest@current" else
                                               Reply(200, b"[[pipeline]\n") if name == "manifest@v2.toml" else None),
         "ControlSnapshotUnreadable:", "not UTF-8 TOML"),
        ("forked source", lambda name: (Reply(200, b"2\n") if name == "manifest@current" else
                                        Reply(200, b"# forked\n") if name == "manifest@v1.toml" else
                                        Reply(200, SECOND) if name == "manifest@v2.toml" else None),
         "ControlSnapshotUntrusted:", "does not descend from the local head v1"),
    ]
    with serving(node) as daemon:
        daemon.wait_line("armed v1: 1 entry")
        daemon.wait_line("orders: ok")
        for recovered, (what, fault, error, detail) in enumerate(failures, start=1):
            logged = sum(f"failed: {error}" in line for line in daemon.lines)
            server.fault = fault
            line = daemon.wait_line(f"failed: {error}", count=logged + 1)[-1]
            assert detail in line and f"poll of {server.control_url} failed" in line, (what, line)
            fires = sum("fired orders" in line for line in daemon.lines)
            daemon.wait_line("fired orders", count=fires + 1)  # the armed set stays in place, firing
            server.fault = None
            daemon.wait_line(f"poll of {server.control_url} recovered", count=recovered)
        assert pointer(node) == "1\n" and not any("armed v2" in line for line in daemon.lines)
        assert daemon.proc.poll() is None
        assert daemon.stop() == 0


@pytest.mark.clause("surface.reconcile.learns-by-reading", "surface.reconcile.url-layout",
                    "surface.reconcile.loopback-only")
def test_a_cycle_polls_once_before_it_arms_through_no_proxy(tmp_path: Path, server: ControlServer) -> None:
    node = url_node(tmp_path, server, files_pipeline("orders"))
    node.rows("orders", 2)
    with JsonApi() as proxy:
        env = {name: proxy.url for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")} | {"no_proxy": ""}

        def cycle() -> tuple[int, str, str]:
            proc = contextful_in(None, "--project", str(node.root), "--json", "pipeline", "serve", "--cycle",
                                 env=env, check=False)
            return proc.returncode, proc.stdout, proc.stderr

        code, _out, err = cycle()  # the pointer answers 404: no applied version anywhere
        assert code == 5 and "StoreNotInitialized" in err, err
        Chain(server.directory, "ctl", None).publish(project_text("ctl", files_pipeline("orders")))
        before = server.polls()
        code, out, err = cycle()
        assert code == 0, err
        answer = json.loads(out)
        assert answer["version"] == 1 and answer["fired"] == ["orders"]
        assert server.polls() == before + 2  # resolved, then polled once: the wake adds no second poll
        assert proxy.requests == []
    assert node.count("orders") == 2


@pytest.mark.clause("surface.reconcile.loopback-only")
def test_serve_refuses_a_control_url_off_loopback_and_arms_nothing(tmp_path: Path) -> None:
    node = ControlProject(tmp_path / "node")
    node.write(files_pipeline("orders", schedule="every 1s"), control='url = "http://192.0.2.7:8787/control"')
    node.rows("orders", 1)
    node.imported()  # a version the node holds: still nothing is armed from it
    proc = node.cli("pipeline", "serve", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "error: ControlSourceNotLoopback: [control] url 'http://192.0.2.7:8787/control'" in proc.stderr
    assert "armed v1" not in proc.stderr and "fired" not in proc.stderr
    assert not (node.root / ".contextful" / "store").exists()
