"""A killed derive run resumes: a unit whose engine already answered is not run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine.derive.project import DeriveProject

WAITING_ENGINE = r'''
"""Answers every unit at once, but the unit whose media says WAIT: it tells the test its pid through
the FIFO, then waits until the other units started (their log lines), then forever."""
import json, os, sys, time
path = sys.argv[1]
log = os.environ["DERIVE_LOG"]
text = open(path).read()
if text.startswith("WAIT "):
    fifo, others = text.split()[1], int(text.split()[2])
    while True:  # a condition, not a guess: the other units' engines have all started
        with open(log) as f:
            if len(f.read().splitlines()) >= others:
                break
        time.sleep(0.01)
    with open(fifo, "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(3600)
with open(log, "a") as f:
    f.write(path + "\n")
print(json.dumps({"text": text}))
'''


def _pending_steps(project: DeriveProject) -> list[str]:
    with project.store() as store:
        owner = store.journal.owner("pipeline:passages")
        if owner is None or owner.status != "pending":
            return []
        return [step.label for step in store.journal.steps(owner.execution_id)]


@pytest.mark.slow
def test_a_killed_derive_run_resumes_without_asking_answered_units_again(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path)
    (tmp_path / "engine.py").write_text(WAITING_ENGINE)
    fifo = tmp_path / "engine.fifo"
    os.mkfifo(fifo)
    rows = [{"id": f"u{n}", "path": project.media(f"u{n}.txt", f"text {n}")} for n in range(5)]
    rows.append({"id": "w", "path": project.media("w.txt", f"WAIT {fifo} 5")})
    project.parents(rows)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    run = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline",
                            "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                           start_new_session=True)
    try:
        with open(fifo) as f:  # the waiting unit's engine reached its wait: every other unit answered
            engine_pid = int(f.read())
        deadline = time.monotonic() + 120
        while len(_pending_steps(project)) < 5:  # their answers are journaled as the run records them
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            assert time.monotonic() < deadline, _pending_steps(project)
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    os.kill(engine_pid, signal.SIGKILL)
    journaled = _pending_steps(project)
    assert len(journaled) == 5
    with project.store() as store:
        assert "passages" not in store.table_names() or store.table("passages").snapshot().rows_stored == 0
    answered = len(project.engine_calls())
    project.media("w.txt", "now it answers")  # new bytes: a new key, still outstanding
    results = project.run()
    derive = results[-1].derive
    assert derive is not None and derive["replayed"] == 5 and derive["ok"] == 6
    assert [Path(c).name for c in project.engine_calls()[answered:]] == ["w.txt"]
    assert project.rows("SELECT count(DISTINCT unit_ref) FROM passages WHERE kind = 'passage'") == [(6,)]
