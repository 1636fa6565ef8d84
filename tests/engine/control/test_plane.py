"""The control plane's public API on an injected clock: leases, the pool, exclusion keys, catch-up,
the tick interval and pulled history. Units are real child processes (``ChildLauncher``); the
scheduler's instants come from a :class:`ManualClock` the test moves, so no test waits for a schedule.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from contextful.engine.control.daemon import TICK_S, Daemon
from contextful.engine.control.fire import ControlPlane
from contextful.engine.project import open_project_store
from contextful.storage.clock import ManualClock, to_us

from tests.engine.control.scenario import ControlProject, Gates, files_pipeline, http_pipeline


def _plane(project: ControlProject, clock: ManualClock, said: list[str] | None = None) -> ControlPlane:
    return ControlPlane(project.root, lambda: open_project_store(project.root, create=True), clock=clock,
                        say=(said.append if said is not None else lambda _line: None))


def _until_ended(plane: ControlPlane, head: str) -> None:
    """Beat (reap only) until ``head``'s unit ended."""
    ended = threading.Event()
    while head in plane.in_flight():
        plane.keep()
        ended.wait(0.05)


def _at_minute(clock_minutes: int = 0) -> ManualClock:
    now = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(minutes=clock_minutes + 1)
    return ManualClock(now)


@pytest.fixture
def gates() -> Iterator[Gates]:
    with Gates() as api:
        yield api


@pytest.mark.clause("surface.dispatch.exclusion-key", "surface.arm.catch-up")
def test_a_unit_due_while_its_key_is_in_flight_starts_no_second_instance_and_catches_up_once(
        tmp_path: Path, gates: Gates) -> None:
    project = ControlProject(tmp_path)
    project.write(http_pipeline("slow", gates.gate("slow"), schedule="every 1m"))
    project.imported()
    clock = _at_minute()
    plane = _plane(project, clock)
    try:
        assert [f.head for f in plane.tick()] == ["slow"]  # no history: due when armed
        gates.wait_arrived(1)
        clock.advance(180)  # three intervals pass while it runs
        assert plane.tick() == [] and plane.in_flight() == ["slow"]  # due, but its key is in flight
        gates.open("slow")
        _until_ended(plane, "slow")
        # its next fire was recomputed from its history once it ended: one fire, not three
        assert [f.head for f in plane.tick()] == ["slow"]
        _until_ended(plane, "slow")
        assert plane.tick() == []
        assert plane.armed is not None and plane.armed.next_fire("slow") == to_us(
            datetime.fromtimestamp(clock.now_us() / 1e6, UTC).replace(second=0, microsecond=0) + timedelta(minutes=1))
        assert gates.arrived == ["slow", "slow"]
    finally:
        plane.close()


@pytest.mark.clause("surface.dispatch.pool-bound", "surface.dispatch.refill", "surface.arm.wake-answer")
def test_a_wake_admits_within_the_pool_bound_and_refills_freed_slots(tmp_path: Path, gates: Gates) -> None:
    project = ControlProject(tmp_path)
    names = ["u1", "u2", "u3", "u4"]
    project.write(*(http_pipeline(n, gates.gate(n)) for n in names), control="pool = 2")
    project.imported()
    plane = _plane(project, _at_minute())
    try:
        short = plane.wake(budget_s=1.0)  # nothing ends within the budget
        assert sorted(gates.wait_arrived(2)) == ["u1", "u2"]
        assert short.fired == [] and sorted(short.pending) == names  # two in flight, two past the bound
        answers = []
        waking = threading.Thread(target=lambda: answers.append(plane.wake(budget_s=120)))
        waking.start()
        gates.open("u1")
        assert gates.wait_arrived(3)[-1] == "u3"  # the freed slot went to the next pending unit
        gates.open("u2", "u3")
        assert gates.wait_arrived(4)[-1] == "u4"
        gates.open("u4")
        waking.join(180)
        [answer] = answers
        assert answer.fired == ["u3", "u4"] and answer.pending == [] and gates.most_held == 2
    finally:
        plane.close()


@pytest.mark.clause("surface.dispatch.admission-order", "surface.dispatch.refill", "surface.dispatch.pool-bound")
def test_due_units_are_admitted_in_admission_order_into_freed_slots(tmp_path: Path, gates: Gates) -> None:
    project = ControlProject(tmp_path)
    urls = {name: gates.gate(name) for name in ("a", "b", "c", "d", "e")}
    project.write(http_pipeline("a", urls["a"], schedule="every 1m"), http_pipeline("b", urls["b"], priority=5),
                  http_pipeline("c", urls["c"]), http_pipeline("d", urls["d"], priority=1),
                  http_pipeline("e", urls["e"]), control="pool = 1")
    project.imported()
    gates.open("a")
    project.cli("pipeline", "run", "a")  # a has a run start: due again a minute on, after every never-run unit
    assert gates.arrived == ["a"]
    plane = _plane(project, _at_minute(2))
    try:
        answers = []
        waking = threading.Thread(target=lambda: answers.append(plane.wake(budget_s=300)))
        waking.start()
        # pool 1: one unit in flight; each next one is admitted into the freed slot, in admission order:
        # never run first (all due when armed; then highest priority; then id), then the one run before
        for n, name in enumerate(["b", "d", "c", "e", "a"], start=2):
            assert gates.wait_arrived(n)[-1] == name, gates.arrived
            assert gates.in_flight() == ([name] if name != "a" else [])  # a's gate stayed open
            gates.open(name)
        waking.join(300)
        [answer] = answers
        assert answer.fired == ["b", "d", "c", "e", "a"] and gates.most_held == 1
    finally:
        plane.close()


@pytest.mark.clause("surface.dispatch.lease-gated")
def test_a_plane_not_holding_the_cadence_lease_arms_and_dispatches_nothing(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1m"))
    project.rows("orders", 2)
    project.imported()
    clock = _at_minute()
    first, second = _plane(project, clock), _plane(project, clock)
    try:
        assert [f.head for f in first.tick()] == ["orders"]
        assert second.tick() == [] and second.armed is None
        assert second.lease.held_by == first.lease.holder
        assert second.wake(budget_s=1).lease_held_by == first.lease.holder
        _until_ended(first, "orders")
        first.close()  # gives the lease back
        clock.advance(60)
        assert [f.head for f in second.tick()] == ["orders"]
        _until_ended(second, "orders")
    finally:
        first.close()
        second.close()


@pytest.mark.clause("surface.arm.tick-interval")
def test_the_in_process_trigger_evaluates_the_armed_set_every_500_ms(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1s"))
    project.rows("orders", 1)
    project.imported()
    clock = _at_minute()
    said: list[str] = []
    plane = _plane(project, clock, said)
    stop = threading.Event()
    slept: list[float] = []
    fired_at: list[int] = []

    def sleep(seconds: float) -> None:  # the daemon's wait, on the injected clock
        _until_ended(plane, "orders")
        fired_at.extend(clock.now_us() for line in said if line.startswith("fired"))  # this beat's fires
        said.clear()
        slept.append(seconds)
        clock.advance(seconds)
        if len(slept) == 8:
            stop.set()

    start = clock.now_us()
    Daemon(plane, "in-process", stop, sleep=sleep, drain=False).run()
    assert slept == [TICK_S] * 8 and TICK_S == 0.5
    # every 1s on a 500 ms beat: fired at arming, then at each whole second, never between
    assert [(t - start) / 1e6 for t in fired_at] == [0.0, 1.0, 2.0, 3.0]


def _snapshot_dir(project: ControlProject) -> Path:
    return project.root / ".contextful" / "control" / project.name


@pytest.mark.clause("surface.arm.pulled-history", "surface.arm.pulled-future")
def test_a_cold_node_takes_pulled_run_states_for_history_but_not_future_ones(tmp_path: Path) -> None:
    warm, cold = ControlProject(tmp_path / "warm"), ControlProject(tmp_path / "cold")
    for node in (warm, cold):
        node.write(files_pipeline("orders", schedule="every 1h"))
        node.rows("orders", 1)
        node.imported()
    proc, answer = warm.cycle()
    assert answer["fired"] == ["orders"], proc.stderr
    [state] = (_snapshot_dir(warm) / "run-state").glob("*.json")
    pulled = _snapshot_dir(cold) / "run-state"
    pulled.mkdir()
    shutil.copy(state, pulled / "warm-node.json")  # what a pull of the warm node's control state brings
    proc, answer = cold.cycle()  # its own catalog is empty, and the pulled start says: not due yet
    assert proc.returncode == 0 and answer["fired"] == [], proc.stderr
    # a start later than the cold node's instant counts as none: the entry is due again
    doc = json.loads(state.read_text())
    doc["starts"]["orders"] = (datetime.now(UTC) + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    (pulled / "warm-node.json").write_text(json.dumps(doc))
    fresh = ControlProject(tmp_path / "fresh")
    fresh.write(files_pipeline("orders", schedule="every 1h"))
    fresh.rows("orders", 1)
    fresh.imported()
    (_snapshot_dir(fresh) / "run-state").mkdir()
    shutil.copy(pulled / "warm-node.json", _snapshot_dir(fresh) / "run-state" / "warm-node.json")
    proc, answer = fresh.cycle()
    assert answer["fired"] == ["orders"], proc.stderr
