"""Serve fires ``[[job]]``s: scheduled builds and maintenance as ``job:<name>`` entries, builds riding
a pipeline's unit, and what an applied snapshot holds that no job dispatches.

Everything runs as a user runs it: ``contextful pipeline serve --cycle`` in a child process, each
fire a child of its own (``contextful job fire <name> --version <V>`` for a job entry), and the
fires read back with ``contextful job history``. Due-ness comes from history (an entry never fired
is due when armed; the next cycle finds its dispatch recorded), so no test waits for a schedule.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.engine.control.scenario import ControlProject, files_pipeline


def _job(name: str, kind: str, *, schedule: str | None = None, after: str | None = None,
         target: tuple[str, ...] = ()) -> str:
    lines = [f'name = "{name}"', f'kind = "{kind}"']
    if schedule is not None:
        lines.append(f'schedule = "{schedule}"')
    if after is not None:
        lines.append(f'after = "{after}"')
    if target:
        lines.append("target = [" + ", ".join(f'"{t}"' for t in target) + "]")
    return "\n[[job]]\n" + "\n".join(lines) + "\n"


def _model(name: str, sql: str) -> str:
    return f'\n[[model]]\nname = "{name}"\nsql = "{sql}"\n'


def history(project: ControlProject, name: str) -> list[dict[str, Any]]:
    fires: list[dict[str, Any]] = json.loads(project.cli("--json", "job", "history", name).stdout)
    return fires


def model_row(project: ControlProject, sql: str) -> list[Any]:
    from contextful.engine.project import open_project_store
    from contextful.engine.read import connect

    with open_project_store(project.root) as store:
        con = connect(store)
        try:
            return list(con.execute(sql).fetchone())
        finally:
            con.close()


@pytest.mark.clause("surface.fire.scheduled-build", "surface.fire.scheduled-maintenance")
def test_a_cycle_dispatches_scheduled_build_fold_and_sync_push_jobs_under_their_job_identity(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule=None), _model("order_count", "SELECT count(*) AS n FROM orders"),
                  _job("hourly_build", "build", schedule="every 1h", target=("order_count",)),
                  _job("nightly_fold", "fold", schedule="0 3 * * *", target=("orders",)),
                  _job("hourly_push", "sync-push", schedule="every 1h"))
    project.rows("orders", 3, file="a")
    project.cli("pipeline", "run", "orders")
    project.rows("orders", 2, file="b")
    project.cli("pipeline", "run", "orders")
    project.imported()
    proc, answer = project.cycle()
    # each job is its own entry, dispatched through the pool as `contextful job fire <name> --version 1`
    assert answer["armed"] == 3 and answer["unarmed"] == [{"pipeline": "orders", "reason": "declares no schedule"}]
    assert sorted(answer["fired"]) == ["job:hourly_build", "job:nightly_fold"]
    # a store with no corpus bucket has nothing to push to: that fire fails by name, and the cycle says so
    assert answer["failed"] == ["job:hourly_push"] and proc.returncode != 0
    assert any(line.startswith("job:hourly_push: ") and "JobStoreUnbound" in line for line in answer["failures"])
    keys = {json.loads(line)["id"] for f in ("a", "b") for line in (tmp_path / "orders" / f"{f}.ndjson").open()}
    assert model_row(project, "SELECT n FROM order_count") == [len(keys)]  # the native model publisher ran
    [build] = history(project, "hourly_build")
    assert build["status"] == "ok" and build["version"] == 1 and build["rows"] == 1
    assert build["detail"]["models"] == [{**build["detail"]["models"][0], "model": "order_count", "status": "published"}]
    [fold] = history(project, "nightly_fold")
    assert fold["status"] == "ok" and [f["table"] for f in fold["detail"]["folded"]] == ["orders"]
    assert fold["rows"] == len(keys) and fold["detail"]["folded"][0]["parts_removed"] == 2
    [push] = history(project, "hourly_push")  # the failed attempt is recorded like any fire
    assert push["status"] == "failed" and push["exit_code"] == 3 and "JobStoreUnbound" in push["failures"][0]
    # the next fire follows from each entry's record (its dispatch, its execution's start, failed or
    # not): the next cycle fires none of them, and names the earliest next fire
    proc, again = project.cycle()
    assert proc.returncode == 0 and again["fired"] == again["failed"] == again["pending"] == []
    hour = datetime.fromisoformat(push["started"]).replace(minute=0, second=0, microsecond=0)
    next_hour = (hour + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert again["next_due"] == next_hour
    assert [len(history(project, n)) for n in ("hourly_build", "nightly_fold", "hourly_push")] == [1, 1, 1]
    armed = {e["id"]: e for e in json.loads(project.cli("--json", "pipeline", "status").stdout)["armed"]}
    assert set(armed) == {"job:hourly_build", "job:nightly_fold", "job:hourly_push"}
    assert armed["job:hourly_build"]["next_fire"] == next_hour and armed["job:hourly_push"]["next_fire"] == next_hour


@pytest.mark.clause("surface.fire.build-dependency")
def test_a_build_after_a_pipeline_runs_after_its_whole_unit_succeeded_and_never_after_a_failed_one(
        tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1h"), files_pipeline("lines", schedule=None, after="orders"),
                  files_pipeline("bad", schedule="every 1h"),
                  _model("both_counts", "SELECT (SELECT count(*) FROM orders) AS o, (SELECT count(*) FROM lines) AS l"),
                  _model("bad_count", "SELECT count(*) AS n FROM bad"),
                  _job("build_both", "build", after="orders", target=("both_counts",)),
                  _job("build_bad", "build", after="bad", target=("bad_count",)))
    project.rows("orders", 3)
    project.rows("lines", 2)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.ndjson").write_text('{"id": 1}\n{"id": \n')
    project.imported()
    proc, answer = project.cycle()
    # the build rides orders' unit (it arms no entry of its own) and is named with it
    assert answer["armed"] == 2 and answer["unarmed"] == []
    assert answer["fired"] == ["orders", "lines", "job:build_both"]
    # it ran after every step of the unit: the step's table was there to read
    assert model_row(project, "SELECT o, l FROM both_counts") == [3, 2]
    [fire] = history(project, "build_both")
    assert fire["status"] == "ok" and fire["version"] == 1
    # a failed unit fires no build riding it: no fire recorded, nothing published
    assert answer["failed"] == ["bad", "job:build_bad"] and proc.returncode != 0
    assert history(project, "build_bad") == []
    from contextful.engine.project import open_project_store

    with open_project_store(project.root) as store:
        assert "bad_count" not in store.table_names()


@pytest.mark.clause("surface.fire.kind-undispatched")
def test_serve_arms_none_of_the_undispatched_jobs_an_applied_snapshot_holds_and_names_why(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1h"),
                  _job("nightly_fold", "fold", schedule="0 3 * * *", target=("orders",)))
    project.rows("orders", 2)
    project.imported()
    # a version written into the snapshot directory by hand, past import's and apply's validation
    snapshots = tmp_path / ".contextful" / "control" / "ctl"
    text = (snapshots / "manifest@v1.toml").read_text()
    (snapshots / "manifest@v2.toml").write_text(
        text + _job("collect", "sweep", schedule="every 1h") + _job("checks", "validate", schedule="every 1h"))
    (snapshots / "manifest@current").write_text("2\n")
    proc, answer = project.cycle()
    assert proc.returncode == 0 and answer["version"] == 2
    # the rest of the version is armed and fires; the undispatched jobs arm nothing, each named with
    # its error and the command doing its work
    assert answer["armed"] == 2 and sorted(answer["fired"]) == ["job:nightly_fold", "orders"]
    reasons = {u["pipeline"]: u["reason"] for u in answer["unarmed"]}
    assert set(reasons) == {"job:collect", "job:checks"}
    assert reasons["job:collect"].startswith("JobKindUndispatched: ") and "contextful store collect" in reasons["job:collect"]
    assert "contextful pipeline validate" in reasons["job:checks"]
    assert "unarmed: job:collect: JobKindUndispatched" in proc.stderr
    assert project.count("orders") == 2
