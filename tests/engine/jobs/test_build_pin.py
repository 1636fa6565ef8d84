"""A build's execution pins the model definitions it publishes (``surface.fire.executable-pin``):
a build fire left pending by a dead process under one definition is never replayed under another;
the next fire records it interrupted and publishes the definition of the version it was fired with."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.control.apply import load_version
from contextful.engine.jobs.build import build_opening
from contextful.engine.jobs.context import JobContext
from contextful.engine.jobs.fire import fire_history, fire_in
from contextful.engine.jobs.scope import job_scope
from contextful.engine.project import open_project_store
from contextful.engine.run.execution import open_execution
from contextful.storage.clock import ManualClock

from tests.engine.jobs.project import applied

MANIFEST = """\
[project]
name = "pins"

[[external]]
id = "orders"
table = "orders"

[[model]]
name = "order_total"
sql = "{sql}"

[[job]]
name = "totals"
kind = "build"
target = ["order_total"]
"""


def _write(root: Path, sql: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text(MANIFEST.format(sql=sql))


@pytest.mark.clause("surface.fire.executable-pin")
def test_a_build_left_pending_under_another_definition_is_recorded_interrupted_never_replayed(tmp_path: Path) -> None:
    root = tmp_path / "project"
    _write(root, "SELECT sum(amount) AS total FROM orders")
    clock = ManualClock(1_800_000_000.0)
    with open_project_store(root, create=True, clock=clock) as store:
        store.append("orders", pa.table({"id": [1, 2], "amount": [10, 32]}))
        first = applied(root)
        v1 = load_version(root, first)
        job = v1.jobs[0]
        pinned_v1 = build_opening(JobContext(job, v1, first, store))
        # a fire of v1 that died after opening its execution: pending, its lease left to lapse
        dead = open_execution(store.journal, job_scope("totals"), pinned_v1.reference, holder="dead-fire",
                              clock=clock)
        clock.advance(3600)

        _write(root, "SELECT sum(amount) * 2 AS total FROM orders")
        second = applied(root)
        v2 = load_version(root, second)
        assert build_opening(JobContext(v2.jobs[0], v2, second, store)).reference != pinned_v1.reference
        fired = fire_in(store, v2, second, v2.jobs[0])
        assert fired.ok and fired.execution_id != dead.execution_id
        history = fire_history(store, "totals")
        assert [(f.execution_id, f.status) for f in history] == [(dead.execution_id, "failed"),
                                                                  (fired.execution_id, "ok")]
        assert history[0].outcome is not None and "interrupted" in history[0].outcome.failures[0]
        total = store.table("order_total").to_arrow().column("total").to_pylist()
    assert total == [84]  # v2's definition: the one its execution pinned
