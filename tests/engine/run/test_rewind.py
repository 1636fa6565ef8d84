"""``contextful run rewind``: a pending owner retires by operator verb, never while an attempt lives."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.run.execution import open_execution
from contextful.engine.run.plan import pipeline_reference
from contextful.engine.run.rewind import rewind
from contextful.storage import Store
from contextful.storage.clock import ManualClock, SystemClock
from contextful.storage.errors import ExecutionSuspended
from contextful.storage.holders import default_holder

from tests.support.cli import contextful
from tests.support.holders import gone_pid, here

MANIFEST = """
[project]
name = "rw"

[[pipeline]]
id = "events"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def _dead_holder() -> str:
    """A holder of this machine's PID namespace whose process is gone: provably dead."""
    return str(dataclasses.replace(here(), pid=gone_pid()))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    contextful(tmp_path, "pipeline", "run")
    return tmp_path


def _pending(project: Path, holder: str, plan: str | None = None) -> str:
    spec = load_manifest(project).pipeline("events")
    with Store.open(project / ".contextful" / "store") as store:
        execution = open_execution(store.journal, "pipeline:events", plan or pipeline_reference(spec),
                                   holder=holder, lease_s=600)
        return execution.execution_id  # dropped without close: pending, as after a crash


@pytest.mark.clause("run.own.rewind")
def test_rewind_retires_the_pending_owner_and_keeps_the_committed_position(project: Path) -> None:
    execution = _pending(project, _dead_holder(), plan="0" * 64)
    blocked = contextful(project, "pipeline", "run", check=False)  # pinned to a plan no declaration produces
    assert blocked.returncode == 5 and "OwnerPlanMismatch" in blocked.stderr and execution in blocked.stderr
    done = json.loads(contextful(project, "--json", "run", "rewind", execution, "--reason", "plan changed").stdout)
    assert done == {"execution": execution, "scope": "pipeline:events", "status": "retired", "reason": "plan changed"}
    with Store.open(project / ".contextful" / "store") as store:
        position = store.table("events").cursor("pipeline:events")[0]
    assert list(position["inputs"]) == ["raw/a.ndjson"]  # the position is left alone
    (project / "raw" / "b.ndjson").write_text('{"id": 2}\n')
    out = json.loads(contextful(project, "--json", "pipeline", "run").stdout)[0]
    assert out["ok"] and out["execution"] != execution and out["tables"][0]["rows"] == 1


@pytest.mark.clause("run.own.rewind-unsafe")
def test_rewind_refuses_an_owner_whose_attempt_holds_its_lease_and_nothing_overrides_it(project: Path) -> None:
    execution = _pending(project, default_holder())
    out = contextful(project, "run", "rewind", execution, "--reason", "stuck?", check=False)
    assert out.returncode == 5 and "ExecutionRewindUnsafe" in out.stderr and execution in out.stderr
    assert "once that attempt has ended or its lease has lapsed" in out.stderr
    forced = contextful(project, "run", "rewind", execution, "--reason", "stuck?", "--force", check=False)
    assert forced.returncode == 5 and "ExecutionRewindUnsafe" in forced.stderr  # --force overrides none
    listing = json.loads(contextful(project, "--json", "run", "executions").stdout)
    assert [o["status"] for o in listing if o["execution"] == execution] == ["pending"]
    unknown = contextful(project, "run", "rewind", "nope", "--reason", "x", check=False)
    assert unknown.returncode == 6 and "ExecutionNotFound" in unknown.stderr


@pytest.mark.clause("run.own.rewind-unsafe")
def test_rewind_refuses_an_execution_with_an_awakeable_pending_before_its_deadline(project: Path) -> None:
    spec = load_manifest(project).pipeline("events")
    with Store.open(project / ".contextful" / "store") as store:
        # The holder is dead, so its lease does not refuse: the pending awakeable does.
        execution = open_execution(store.journal, "pipeline:events", pipeline_reference(spec),
                                   holder=_dead_holder(), lease_s=600)
        with pytest.raises(ExecutionSuspended) as suspended:
            execution.suspend("await approval", timeout_s=3600, wait_s=0)
        token = suspended.value.token
    for extra in ((), ("--force",)):  # --force overrides none
        out = contextful(project, "run", "rewind", execution.execution_id, "--reason", "stuck?", *extra, check=False)
        assert out.returncode == 5 and "ExecutionRewindUnsafe" in out.stderr, out.stderr
        assert execution.execution_id in out.stderr and "awakeable 'await approval' (step 0) is pending" in out.stderr
    with Store.open(project / ".contextful" / "store") as store:
        row = store.awakeables.get(token)
        assert row is not None and row.state == "pending"
        # Past its deadline the awakeable can resume nothing (it timed out): the rewind goes through.
        past = ManualClock(row.deadline_us)
        done = rewind(store.journal, execution.execution_id, "timed out", clock=past)
        assert done.owner.status == "retired"
        # A resolved awakeable holds nothing back either.
        again = open_execution(store.journal, "pipeline:events", pipeline_reference(spec),
                               holder=_dead_holder(), lease_s=600)
        with pytest.raises(ExecutionSuspended) as suspended:
            again.suspend("await approval", timeout_s=3600, wait_s=0)
        store.awakeables.resolve(suspended.value.token, b"ok", None, SystemClock().now_us())
        assert rewind(store.journal, again.execution_id, "resolved").owner.status == "retired"
