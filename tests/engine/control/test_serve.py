"""``contextful pipeline serve`` as a daemon: triggers, the wake route, children, drains, end to end.

Real ``contextful pipeline serve`` processes over real projects; units are serve's child processes;
slow units are ``http`` pipelines held on a loopback gate (``tests.engine.control.scenario.Gates``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.engine.control.scenario import (
    RECEIVE,
    ControlProject,
    Gates,
    block_table,
    files_pipeline,
    http_pipeline,
    serving,
    spool_dead,
)


def _wake(url: str) -> tuple[float, dict[str, object]]:
    began = time.monotonic()
    request = urllib.request.Request(f"{url}/wake", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return time.monotonic() - began, json.loads(answer.read())


def _unit_children(project: ControlProject) -> list[int]:
    """The pids of live unit child processes working on ``project``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"contextful.engine.control.child" in argv and str(project.root).encode() in argv and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.clause("surface.arm.trigger-select", "surface.arm.wake-answer", "surface.arm.wake-pending-steps",
                    "surface.arm.unarmed-named")
def test_an_external_trigger_fires_only_on_a_wake_which_answers_within_25_s_naming_steps_pending(
        tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    with Gates() as gates:
        project.write(http_pipeline("quick", gates.gate("quick", open_=True)),
                      http_pipeline("slow", gates.gate("slow")), files_pipeline("slow_lines", schedule=None, after="slow"),
                      files_pipeline("manual", schedule=None), control='trigger = "external"')
        project.rows("slow_lines", 2)
        project.imported()
        with serving(project, "--http", "127.0.0.1:0") as daemon:
            daemon.wait_line("armed v1")
            # no tick of its own: both units are due since arming, and only the wake fires them
            seconds, answer = _wake(daemon.url)
            assert seconds < 25
            assert answer["fired"] == ["quick"] and answer["failed"] == []
            assert answer["pending"] == ["slow", "slow_lines"]  # in flight: the head and its landing step
            assert answer["armed"] == 2 and answer["next_due"] is not None
            assert gates.arrived.count("slow") == 1
            gates.open("slow")
            daemon.wait_line("slow: ok")
            seconds, again = _wake(daemon.url)  # nothing due: each fired an hour's entry
            assert again["fired"] == again["pending"] == [] and seconds < 5
            assert project.count("slow_lines") == 2
            assert daemon.stop() == 0
        # what arms nothing is named once per applied version, with its reason
        assert [line.split(" ", 1)[1] for line in daemon.lines if "unarmed" in line] == [
            "unarmed: manual: declares no schedule"]


@pytest.mark.clause("surface.arm.unknown-trigger")
def test_an_unknown_trigger_is_refused_at_startup_and_serve_fires_nothing(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1s"), RECEIVE, control='trigger = "kubernetes"')
    project.rows("orders", 1)
    project.imported()
    with serving(project, "--http", "127.0.0.1:0") as daemon:
        [line] = daemon.wait_line("TriggerAdapterUnknown")
        assert "'kubernetes'" in line and "in-process, external" in line
        with pytest.raises(urllib.error.HTTPError) as refused:  # no adapter: no wake route either
            _wake(daemon.url)
        assert refused.value.code == 404
        assert daemon.stop() == 0
    assert not any("fired" in line for line in daemon.lines)
    status = json.loads(project.cli("--json", "pipeline", "status").stdout)
    assert status["armed"][0]["last_fire"] is None


@pytest.mark.clause("surface.arm.trigger-face-missing")
def test_an_external_trigger_without_an_http_face_is_refused_at_startup(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders"), control='trigger = "external"')
    project.imported()
    proc = project.cli("pipeline", "serve", check=False)
    assert proc.returncode == 3 and "TriggerFaceMissing" in proc.stderr and "--http" in proc.stderr


@pytest.mark.clause("surface.dispatch.children-reaped")
def test_serve_stops_each_units_process_group_on_sigterm_and_exits_once_they_have(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    with Gates() as gates:
        project.write(http_pipeline("slow", gates.gate("slow")))
        project.imported()
        with serving(project) as daemon:
            gates.wait_arrived(1)
            [child] = _unit_children(project)
            assert os.getpgid(child) == child != os.getpgid(daemon.proc.pid)  # a process group of its own
            assert daemon.stop(signal.SIGTERM, timeout=60) == 0
            assert _unit_children(project) == []
            assert any("slow: stopped" in line for line in daemon.lines)


@pytest.mark.clause("surface.fire.daemon-drain", "surface.fire.daemon-drain-retry")
def test_the_daemon_drains_beside_its_ticks_and_retries_a_failed_drain_on_its_next_pass(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(RECEIVE)
    project.imported()
    spool_dead(project, "k1")
    blocked = block_table(project, "clicks")
    with serving(project) as daemon:
        daemon.wait_line("error: drain: clicks")
        assert len(list((tmp_path / ".contextful" / "queue" / "clicks").glob("*.json"))) == 1
        blocked.unlink()
        daemon.wait_line("drained 1 queued batch(es)")
        assert daemon.proc.poll() is None  # still serving
        assert daemon.stop() == 0
    assert project.count("clicks") == 3


@pytest.mark.slow
def test_a_real_daemon_lands_new_files_and_their_passages_every_two_seconds(tmp_path: Path) -> None:
    from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline

    manifest = (HEADER + '\n[[pipeline]]\nid = "docs"\nprimary_key = ["id"]\nschedule = "every 2s"\n'
                '[pipeline.source]\nkind = "files"\n[pipeline.source.config]\npaths = ["parents/*.ndjson"]\n'
                + derive_pipeline("passages", "docs", engine="lines", media_column="path"))
    derive = DeriveProject(tmp_path, manifest=manifest)
    project = ControlProject(tmp_path, name="derive-test")
    project.imported()
    with serving(project) as daemon:
        daemon.wait_line("docs: ok")
        derive.parents([{"id": 1, "path": derive.media("a.txt", "one\ntwo\n")}])
        derive.parents([{"id": 2, "path": derive.media("b.txt", "three\n")}])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a few ticks: each fire lands what is new
            daemon.wait_line("docs: ok", count=len([x for x in daemon.lines if "docs: ok" in x]) + 1)
            if derive.rows("SELECT count(*) FROM passages")[0][0] == 3:
                break
        assert derive.rows("SELECT id FROM docs ORDER BY id") == [(1,), (2,)]
        assert sorted(r[0] for r in derive.rows("SELECT text FROM passages")) == ["one", "three", "two"]
        assert daemon.stop(signal.SIGTERM) == 0
    assert _unit_children(project) == []
    assert subprocess.run([sys.executable, "-c", "0"], check=False).returncode == 0
