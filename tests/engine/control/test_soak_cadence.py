"""A simulated day of 1,000 armed entries on an injected clock, checked against an independent oracle.

The control plane (``ControlPlane.tick``, the in-process trigger's beat) runs over an applied
version of 1,000 pipelines (every 1s … every 1h, and cron expressions), its clock moved 500 ms per
beat. Units run in an in-process launcher (the :class:`~engine.control.dispatch.Launcher` port) that
ends each unit at the next beat: a day holds hundreds of thousands of fires, far past what child
processes could run in a test, and what is under test here is when the scheduler fires, not what a
unit does (child units are covered end to end elsewhere). Each fire's due instant comes from the
plane's own log line. The oracle is arithmetic (an ``every`` schedule admits the multiples of its
interval since the epoch) and croniter iterated directly: once the arming's first rush (every entry
never run, so all due at once) has cleared, every entry fires at every instant its schedule admits,
none twice, none missed, and the pool never holds more than its bound.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
from contextful.engine.control.dispatch import Outcome
from contextful.engine.control.fire import ControlPlane
from contextful.engine.project import open_project_store
from contextful.storage.clock import ManualClock, to_us
from croniter import croniter

from tests.engine.control.scenario import ControlProject, files_pipeline
from tests.support.soak import trials

EVERY = [("every 1s", 2), ("every 2s", 2), ("every 5s", 4), ("every 10s", 10), ("every 30s", 20), ("every 1m", 60),
         ("every 5m", 150), ("every 15m", 150), ("every 30m", 150), ("every 1h", 150), ("every 2h", 50)]
CRON = [("*/5 * * * *", 60), ("0 * * * *", 50), ("15,45 * * * *", 40), ("0 */2 * * *", 40), ("30 3 * * *", 20),
        ("10-20/5 1-23 * * *", 20), ("0 0 * * 1-5", 22)]
POOL = 384
"""Enough that the top of an hour (850 entries due at once) clears within a second."""
WARM_UP_S = 10
"""Arming finds every entry never run, all due at once: the day is checked from this long after."""
FIRED = re.compile(r"fired (\S+) \(due (\S+);")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class InstantUnits:
    """The launcher port in process: each unit ends at the next reap; the most ever running at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def launch(self, head: str) -> _Unit:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        return _Unit(head, self)


class _Unit:
    def __init__(self, head: str, owner: InstantUnits) -> None:
        self.head = head
        self.owner = owner
        self.done = False

    def poll(self) -> Outcome | None:
        if not self.done:
            self.done = True
            with self.owner.lock:
                self.owner.running -= 1
        return Outcome(self.head, True)

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def wait(self, timeout_s: float | None) -> Outcome | None:
        return self.poll()


def _oracle(schedule: str, start_us: int, end_us: int) -> list[int]:
    """The instants ``schedule`` admits from ``start_us`` to ``end_us``, both included."""
    if schedule.startswith("every "):
        n = int(schedule[6:-1]) * UNITS[schedule[-1]] * 1_000_000
        return list(range(-(-start_us // n) * n, end_us + 1, n))
    fires = []
    it = croniter(schedule, datetime.fromtimestamp((start_us - 1) / 1e6, UTC))
    while (at := to_us(it.get_next(datetime))) <= end_us:
        fires.append(at)
    return fires


@pytest.mark.slow
@pytest.mark.clause("surface.arm.grammar", "surface.arm.next-fire-from-history", "surface.dispatch.pool-bound")
def test_a_simulated_day_of_1000_entries_fires_each_admitted_instant_once(tmp_path: Path) -> None:
    hours = trials(1, 24)
    schedules = [s for s, n in EVERY + CRON for _ in range(n)]
    assert len(schedules) == 1000
    project = ControlProject(tmp_path)
    priority = {s: 10 - i for i, (s, _n) in enumerate(EVERY)}  # the fastest first among equal instants
    blocks = []
    for i, schedule in enumerate(schedules):
        block = files_pipeline(f"p{i:04d}", schedule=schedule, paths="nothing/*.ndjson")
        if schedule in priority:
            block = block.replace('primary_key = ["id"]', f'primary_key = ["id"]\npriority = {priority[schedule]}')
        blocks.append(block)
    project.write(*blocks, control=f"pool = {POOL}")
    project.imported()
    start = datetime(2030, 1, 1, tzinfo=UTC)
    clock = ManualClock(to_us(start) - WARM_UP_S * 1_000_000)
    units = InstantUnits()
    said: list[str] = []
    plane = ControlPlane(project.root, lambda: open_project_store(project.root, create=True), clock=clock,
                         launcher=lambda _version: units, say=said.append)
    end = to_us(start) + hours * 3_600_000_000
    fired: dict[str, list[int]] = defaultdict(list)
    try:
        while clock.now_us() <= end + WARM_UP_S * 1_000_000:  # the last instant's rush clears too
            plane.tick()
            for line in said:
                if m := FIRED.search(line):
                    fired[m.group(1)].append(to_us(datetime.fromisoformat(m.group(2))))
            said.clear()
            clock.advance(0.5)
    finally:
        plane.close()
    assert units.most <= POOL
    for i, schedule in enumerate(schedules):  # once armed, every admitted instant fires, none twice, none missed
        expected = _oracle(schedule, to_us(start), end)
        assert [at for at in fired[f"p{i:04d}"] if to_us(start) <= at <= end] == expected, (schedule, fired[f"p{i:04d}"][:5], expected[:5])
