"""A simulated day of a pipeline, the build riding it and maintenance jobs, on an injected clock.

The control plane (``ControlPlane.tick``) arms an applied version holding a pipeline every 10
minutes, a build ``after`` it, a nightly fold and an hourly sync-push (which fails on a store
with no corpus bucket: a failed attempt every hour). Its clock (a :class:`ManualClock`) jumps from
one due instant to the next through a day. Fires run in process on the same clock through the
production entry points a child process calls (``engine.control.child.fire_unit`` for a unit and
the builds riding it, ``engine.jobs.fire.fire_job`` for a job entry), so every instant a fire
records (its dispatch in the catalog, its execution's start in the journal) is the simulated one;
child processes are covered by ``test_jobs_serve``. The oracle is arithmetic: every 10 minutes,
every hour on the hour, 03:00.
"""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from contextful.engine.control.child import fire_unit
from contextful.engine.control.dispatch import Outcome
from contextful.engine.control.fire import ControlPlane
from contextful.engine.jobs.fire import fire_history, fire_job
from contextful.engine.project import open_project_store
from contextful.storage.clock import Clock, ManualClock, to_us
from contextful.storage.errors import JobStoreUnbound

from tests.engine.control.scenario import ControlProject, files_pipeline
from tests.engine.control.test_jobs_serve import _job, _model

FIRED = re.compile(r"fired (\S+) \(due (\S+);")
DAY = datetime(2030, 1, 1, tzinfo=UTC)


class Running(Clock):
    """A fire's clock: the plane's instant, a microsecond later at each reading, as time runs while a
    fire works (a build riding a unit reads after the unit's commit, never at its very instant)."""

    def __init__(self, base: ManualClock) -> None:
        self.base = base
        self.readings = 0

    def now_us(self) -> int:
        self.readings += 1
        return self.base.now_us() + self.readings


class InProcess:
    """The launcher port, running each fire to its end in this process on the plane's clock."""

    def __init__(self, root: Path, version: int, clock: ManualClock) -> None:
        self.root, self.version, self.clock = root, version, clock

    def launch(self, head: str) -> _Ended:
        if head.startswith("job:"):
            fired = fire_job(self.root, head[4:], version=self.version, clock=Running(self.clock))
            outcome = Outcome(head, fired.ok, tuple(fired.outcome.failures if fired.outcome else ()))
        else:
            doc = fire_unit(self.root, self.version, head, None, cancel=threading.Event(), clock=Running(self.clock))
            outcome = Outcome(head, bool(doc["ok"]), tuple(doc["failures"]))
        return _Ended(head, outcome)


class _Ended:
    def __init__(self, head: str, outcome: Outcome) -> None:
        self.head, self.outcome = head, outcome

    def poll(self) -> Outcome:
        return self.outcome

    def wait(self, timeout_s: float | None) -> Outcome:
        return self.outcome

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def _plane(project: ControlProject, clock: ManualClock, said: list[str]) -> ControlPlane:
    return ControlPlane(project.root, lambda: open_project_store(project.root, create=True, clock=clock), clock=clock,
                        launcher=lambda version: InProcess(project.root, version, clock), say=said.append)


def _at(hours: float) -> int:
    return to_us(DAY + timedelta(hours=hours))


def _second(at_us: int) -> int:
    """An instant a fire recorded, to its second (a fire's clock runs on by microseconds)."""
    return at_us - at_us % 1_000_000


def test_a_simulated_day_fires_each_job_at_its_instants_and_a_restart_resumes_from_recorded_history(
        tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 10m"), _model("order_count", "SELECT count(*) AS n FROM orders"),
                  _job("build_counts", "build", after="orders", target=("order_count",)),
                  _job("nightly_fold", "fold", schedule="0 3 * * *", target=("orders",)),
                  _job("hourly_push", "sync-push", schedule="every 1h"))
    project.rows("orders", 2, file="a")
    project.imported()
    clock = ManualClock(DAY - timedelta(seconds=30))
    said: list[str] = []
    plane = _plane(project, clock, said)
    fired: dict[str, list[int]] = {}
    try:
        while clock.now_us() <= _at(24):
            if clock.now_us() >= _at(12) + 5 * 60_000_000 and not (tmp_path / "orders" / "b.ndjson").exists():
                project.rows("orders", 5, file="b")  # lands at 12:10; the build riding that unit publishes it
            plane.tick()
            for line in said:
                if m := FIRED.search(line):
                    fired.setdefault(m.group(1), []).append(to_us(datetime.fromisoformat(m.group(2))))
            said.clear()
            assert plane.armed is not None
            next_due = plane.armed.next_due_us()
            assert next_due is not None and next_due > clock.now_us()
            clock.advance((next_due - clock.now_us()) / 1e6)
    finally:
        plane.close()
    armed_at = to_us(DAY - timedelta(seconds=30))  # never run: every entry is due when armed
    assert fired["orders"] == [armed_at] + [_at(h / 6) for h in range(24 * 6 + 1)]
    assert fired["job:hourly_push"] == [armed_at] + [_at(h) for h in range(25)]
    assert fired["job:nightly_fold"] == [armed_at, _at(3)]
    assert "job:build_counts" not in fired  # it rides orders' unit, never an entry of its own
    with open_project_store(project.root) as store:
        builds = fire_history(store, "build_counts", limit=1000)
        folds = fire_history(store, "nightly_fold", limit=10)
        pushes = fire_history(store, "hourly_push", limit=100)
    # the build ran after every unit of orders, at its instant; it published only when orders landed
    assert [_second(b.started_us) for b in builds] == fired["orders"]
    assert [_second(b.started_us) for b in builds if b.outcome is not None and b.outcome.rows] == [armed_at, _at(12 + 1 / 6)]
    assert all(b.ok for b in builds)
    assert [(_second(f.started_us), f.status) for f in folds] == [(armed_at, "ok"), (_at(3), "ok")]
    # every push failed, by name, and each failed attempt is recorded; the cadence went on
    assert [_second(p.started_us) for p in pushes] == fired["job:hourly_push"]
    assert all(p.status == "failed" and p.exit_code == JobStoreUnbound("j", "s", "n").exit_code for p in pushes)
    assert project.count("order_count") == 1

    # a restart: after the last tick (D+1 00:00) a hand-fired push fails at 01:10; a new plane at 01:30
    # computes each entry's next fire from what is recorded, that failed attempt's start included
    clock.advance((_at(25 + 1 / 6) - clock.now_us()) / 1e6)
    failed = fire_job(project.root, "hourly_push", clock=clock)
    assert failed.status == "failed" and failed.started_us == _at(25 + 1 / 6)
    clock.advance(20 * 60)
    said.clear()
    again = _plane(project, clock, said)
    try:
        started = [f.head for f in again.tick()]
        assert again.armed is not None
        assert started == ["orders"]  # its last fire was at 00:00: due at 00:10, caught up once
        assert again.armed.next_fire("job:hourly_push") == _at(26)  # after the 01:10 attempt, not 01:00
        assert again.armed.next_fire("job:nightly_fold") == _at(27)  # 03:00 from its 03:00 dispatch
    finally:
        again.close()
