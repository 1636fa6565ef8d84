"""A unit with derive tiers under workers: its landing members land on a worker, its tiers run after
them in serve's own unit child (``engine.control.child --landed-on-workers``).

``serve --cycle`` and ``worker serve`` are real child processes; the tier runs a real engine child
(tests/engine/derive/project.py's ``lines`` engine, which logs each call).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.control.test_control_source import _closed_port
from tests.engine.control.test_workers import KEY, Worker
from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline
from tests.support.cli import contextful_in


def _project(root: Path, control: str) -> DeriveProject:
    manifest = (HEADER + f"\n[control]\n{control}\n" + files_pipeline("docs").replace(
        'primary_key = ["id"]', 'primary_key = ["id"]\nschedule = "every 1h"')
        + derive_pipeline("passages", "docs", engine="lines", media_column="path"))
    project = DeriveProject(root, manifest=manifest)
    project.parents([{"id": 1, "path": project.media("a.txt", "one\ntwo\nthree\n")}])
    return project


def _cycle(project: DeriveProject) -> tuple[int, dict[str, object], str]:
    proc = contextful_in(None, "--project", str(project.root), "--json", "pipeline", "serve", "--cycle",
                         env={"CONTEXTFUL_WORKER_KEY": KEY}, check=False, timeout=300)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


@pytest.mark.clause("surface.dispatch.worker-target")
def test_a_unit_s_landing_member_lands_on_a_worker_and_its_tier_runs_after_it_in_serve(tmp_path: Path) -> None:
    relay = f'relay = "http://127.0.0.1:{_closed_port()}"'
    project = _project(tmp_path / "p", relay)
    worker = Worker(project.root)
    try:
        (project.root / "contextful.toml").write_text(
            (project.root / "contextful.toml").read_text().replace(relay, f'{relay}\nworkers = ["{worker.url}"]'))
        contextful_in(None, "--project", str(project.root), "pipeline", "import")
        code, answer, stderr = _cycle(project)
        assert code == 0 and answer["fired"] == ["docs", "passages"], (answer, stderr)
        run = worker.wait_log("/docs/1: admitted").split()[1].split("/")[0]
        assert "pointer" in worker.wait_log(f"step {run}/docs/1: {{")
        assert not any("passages" in line for line in worker.log)  # the tier never went to the worker
        assert len(project.engine_calls()) == 1  # it ran once, in serve's child, over what the worker landed
        assert project.rows("SELECT text FROM passages ORDER BY start_s") == [("one",), ("two",), ("three",)]
    finally:
        worker.stop()


@pytest.mark.clause("run.select.parent-outcome")
def test_a_worker_dispatch_error_stops_the_unit_before_its_tier(tmp_path: Path) -> None:
    project = _project(tmp_path / "p", 'relay = "http://127.0.0.1:9"')  # the worker's relay is not serve's
    worker = Worker(project.root)
    try:
        (project.root / "contextful.toml").write_text((project.root / "contextful.toml").read_text().replace(
            'relay = "http://127.0.0.1:9"', f'relay = "http://127.0.0.1:{_closed_port()}"\nworkers = ["{worker.url}"]'))
        contextful_in(None, "--project", str(project.root), "pipeline", "import")
        code, answer, stderr = _cycle(project)
        assert code == 1 and answer["failed"] == ["docs", "passages"], (answer, stderr)
        failures = answer["failures"]
        assert isinstance(failures, list)
        assert any("docs: " in line and "DispatchSubmitRejected" in line for line in failures), failures
        assert any(line.startswith("passages: UpstreamFailed") for line in failures), failures
        assert project.engine_calls() == []  # the tier never ran
        assert not any("admitted" in line for line in worker.log)
    finally:
        worker.stop()
