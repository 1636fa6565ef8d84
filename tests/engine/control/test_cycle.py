"""``contextful pipeline serve --cycle``: arm the applied version, fire what is due once, wait, drain, answer.

Every test drives real ``contextful`` child processes over a real project; units run as serve's
child processes. Due-ness comes from history (a first cycle finds an entry with no history due
when armed, the next finds its dispatch recorded), so no test waits for a schedule's wall time.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.engine.control.scenario import (
    RECEIVE,
    ControlProject,
    block_table,
    files_pipeline,
    serving,
    spool_dead,
)


def _next_hour(after: datetime) -> datetime:
    return after.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text)


@pytest.mark.clause("surface.fire.cycle", "surface.arm.next-fire-from-history")
def test_a_cycle_fires_what_is_due_once_waits_for_it_and_answers(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1h"), files_pipeline("lines", schedule=None, after="orders"))
    project.rows("orders", 3)
    project.rows("lines", 2)
    project.imported()
    before = datetime.now(UTC)
    proc, answer = project.cycle()
    assert proc.returncode == 0, proc.stderr
    assert answer["fired"] == ["orders", "lines"] and answer["failed"] == [] and answer["pending"] == []
    assert answer["armed"] == 1 and answer["version"] == 1
    # an entry with no history is due when armed; its next fire is the first instant its schedule
    # admits after that dispatch: every 1h admits each hour on the hour
    next_due = _instant(answer["next_due"])
    assert next_due in {_next_hour(before), _next_hour(datetime.now(UTC))}
    assert project.count("orders") == 3 and project.count("lines") == 2
    # the dispatch is recorded: the next cycle finds nothing due, and says when it will be
    proc, again = project.cycle()
    assert proc.returncode == 0 and again["fired"] == [] and again["pending"] == []
    assert again["next_due"] == answer["next_due"]
    text = project.cli("pipeline", "serve", "--cycle").stdout
    assert "v1: fired -; failed -; pending -" in text and f"armed 1, next due {answer['next_due']}" in text


@pytest.mark.clause("surface.fire.cycle-exit")
def test_a_cycle_exits_non_zero_after_its_answer_when_a_unit_failed(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("good"), files_pipeline("bad"))
    project.rows("good", 2)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.ndjson").write_text('{"id": 1}\n{"id": \n')
    project.imported()
    proc, answer = project.cycle()
    assert proc.returncode != 0
    assert answer["fired"] == ["good"] and answer["failed"] == ["bad"]
    assert any(line.startswith("bad:") and "InputMalformed" in line for line in answer["failures"])
    assert project.count("good") == 2
    proc, again = project.cycle()  # nothing due, nothing failed: zero
    assert proc.returncode == 0 and again["fired"] == again["failed"] == []


@pytest.mark.clause("surface.arm.unarmed-named", "surface.arm.unreadable-schedule", "surface.dispatch.not-a-head")
def test_a_cycle_lists_what_arms_nothing_with_its_reason_and_arms_the_rest(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("armed", schedule="every 1h"), files_pipeline("manual", schedule=None),
                  files_pipeline("macro", schedule="@daily"), files_pipeline("lastday", schedule="0 0 L * *"),
                  files_pipeline("step", schedule="every 5m", after="armed"))
    for name in ("armed", "manual", "macro", "lastday", "step"):
        project.rows(name, 1)
    project.imported()
    proc, answer = project.cycle()
    assert proc.returncode == 0, proc.stderr
    reasons = {u["pipeline"]: u["reason"] for u in answer["unarmed"]}
    assert set(reasons) == {"manual", "macro", "lastday", "step"}
    assert "no schedule" in reasons["manual"]
    assert reasons["macro"].startswith("ScheduleUnreadable") and "@daily" in reasons["macro"]
    assert reasons["lastday"].startswith("ScheduleUnreadable") and "L" in reasons["lastday"]
    assert reasons["step"].startswith("DispatchUnitNotAHead") and "'armed'" in reasons["step"]
    # the readable entry armed and fired, with its step riding its unit; nothing else started
    assert answer["armed"] == 1 and answer["fired"] == ["armed", "step"]
    assert project.count("step") == 1
    for table in ("manual", "macro", "lastday"):
        proc = project.cli("sql", f"SELECT count(*) FROM {table}", check=False)
        assert proc.returncode != 0  # never landed: the table does not exist
    text = project.cli("pipeline", "serve", "--cycle").stdout
    assert "unarmed manual: declares no schedule" in text


@pytest.mark.clause("surface.dispatch.lease-gated")
def test_a_cycle_finding_the_cadence_lease_held_dispatches_nothing_exits_zero_and_names_the_holder(
        tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1s"), control='trigger = "external"')
    project.rows("orders", 1)
    project.imported()
    with serving(project, "--http", "127.0.0.1:0") as daemon:  # holds the lease; fires only on a wake
        daemon.wait_line("armed v1")
        proc, answer = project.cycle()
        assert proc.returncode == 0, proc.stderr
        assert answer["fired"] == [] and answer["armed"] == 0 and answer["lease_held_by"]
        assert str(daemon.proc.pid) in answer["lease_held_by"]
        text = project.cli("pipeline", "serve", "--cycle").stdout
        assert text.startswith("cadence lease held by ") and "nothing dispatched" in text
        assert daemon.stop() == 0
    proc, answer = project.cycle()  # the daemon gave the lease back as it stopped
    assert proc.returncode == 0 and answer["fired"] == ["orders"]


@pytest.mark.clause("surface.fire.cycle-drain")
def test_a_cycle_drains_queued_batches_once_and_counts_them(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders"), RECEIVE)
    project.rows("orders", 1)
    project.imported()
    for key in ("k1", "k2"):
        spool_dead(project, key)
    proc, answer = project.cycle()
    assert proc.returncode == 0, proc.stderr
    assert answer["drained"] == {"settled": 2, "failed": 0, "failures": []}
    assert project.count("clicks") == 6
    proc, again = project.cycle()
    assert again["drained"]["settled"] == 0


@pytest.mark.clause("surface.fire.cycle-drain-exit")
def test_a_cycle_whose_drain_fails_exits_non_zero_and_leaves_its_deliveries_queued(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(RECEIVE)
    project.imported()
    spool_dead(project, "k1")
    blocked = block_table(project, "clicks")
    proc, answer = project.cycle()
    assert proc.returncode != 0
    assert answer["failed"] == [] and answer["drained"]["failed"] == 1
    assert answer["drained"]["failures"][0].startswith("clicks:")
    queued = list((tmp_path / ".contextful" / "queue" / "clicks").glob("*.json"))
    assert len(queued) == 1  # still queued for the next cycle
    blocked.unlink()
    proc, again = project.cycle()
    assert proc.returncode == 0 and again["drained"]["settled"] == 1
    assert project.count("clicks") == 3


@pytest.mark.clause("surface.arm.next-fire-from-history")
def test_a_schedule_edited_and_applied_never_refires_an_instant_that_already_ran(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1h"))
    project.rows("orders", 1)
    project.imported()
    _proc, first = project.cycle()
    assert first["fired"] == ["orders"]
    project.write(files_pipeline("orders", schedule="0 0 * * *"))
    assert "claimed v2" in project.cli("pipeline", "apply").stdout
    proc, again = project.cycle()  # the next fire comes from history, not from the edit
    assert proc.returncode == 0 and again["version"] == 2 and again["fired"] == []
    assert again["next_due"].endswith("T00:00:00.000Z")


@pytest.mark.clause("surface.arm.unreadable-schedule")
def test_validate_reports_an_unreadable_schedule_as_a_problem_of_its_pipeline_beside_the_others(
        tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("weekly", schedule="0 0 ? * MON"), files_pipeline("fine", schedule="every 5m"),
                  files_pipeline("typo", schedule="every 1h").replace('primary_key = ["id"]', 'primary_kee = ["id"]'))
    proc = project.cli("--json", "pipeline", "validate", check=False)
    assert proc.returncode == 3
    problems = json.loads(proc.stdout)["problems"]
    assert {p["error"] for p in problems} == {"ManifestKeyUnknown", "ScheduleUnreadable"}
    [unreadable] = [p for p in problems if p["error"] == "ScheduleUnreadable"]
    assert unreadable["detail"].startswith("weekly:") and "?" in unreadable["detail"]
    project.write(files_pipeline("weekly", schedule="0 0 ? * MON"), files_pipeline("fine", schedule="every 5m"))
    proc = project.cli("pipeline", "validate", check=False)
    assert proc.returncode == 3 and proc.stderr.count("error: ") == 1 and "ScheduleUnreadable: weekly" in proc.stderr
    imported = project.cli("pipeline", "import")  # the version is claimed: the other entries arm
    assert "claimed v1" in imported.stdout and "warning: ScheduleUnreadable: weekly" in imported.stderr


def test_status_shows_armed_entries_their_fires_and_what_arms_nothing(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1h"), files_pipeline("lines", schedule=None, after="orders"),
                  files_pipeline("manual", schedule=None))
    project.rows("orders", 1)
    project.imported()
    status = json.loads(project.cli("--json", "pipeline", "status").stdout)
    [entry] = status["armed"]
    assert entry["id"] == "orders" and entry["members"] == ["orders", "lines"] and entry["last_fire"] is None
    assert status["unarmed"] == [{"pipeline": "manual", "reason": "declares no schedule"}]
    _proc, answer = project.cycle()
    status = json.loads(project.cli("--json", "pipeline", "status").stdout)
    [entry] = status["armed"]
    assert entry["last_fire"] is not None and entry["next_fire"] == answer["next_due"] and not entry["in_flight"]
    assert status["cadence_lease"] is None  # the cycle gave it back
    text = project.cli("pipeline", "status").stdout
    assert "applied v1; cadence lease: free" in text and "armed orders [every 1h]: last fire 20" in text
    assert "unarmed manual: declares no schedule" in text


@pytest.mark.clause("surface.apply.local-claim")
def test_a_cycle_runs_the_applied_version_never_the_working_file(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders"))
    project.rows("orders", 1)
    project.rows("extra", 2)
    project.imported()
    project.write(files_pipeline("orders"), files_pipeline("extra"))  # edited, not applied
    _proc, answer = project.cycle()
    assert answer["version"] == 1 and answer["fired"] == ["orders"] and answer["armed"] == 1
    project.applied()
    _proc, answer = project.cycle()
    assert answer["version"] == 2 and answer["fired"] == ["extra"] and answer["armed"] == 2
    assert project.count("extra") == 2
