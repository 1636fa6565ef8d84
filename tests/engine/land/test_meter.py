"""The meter: a reservation takes tokens or is denied at once; the retry schedule performs the wait."""

from __future__ import annotations

import threading
import time

import pytest
from contextful.engine.land.meter import LOCK_TIMEOUT_S, Meter
from contextful.engine.run.retry import RetrySchedule
from contextful.storage.errors import ManifestInvalid, ManifestKeyUnknown, ManifestValueInvalid, RateLimited


class Clock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Records every ``time.sleep`` call made while the test runs (and does not sleep)."""
    calls: list[float] = []
    monkeypatch.setattr(time, "sleep", calls.append)
    return calls


@pytest.mark.clause("connector.meter.acquire-call")
def test_a_denied_reservation_raises_rate_limited_at_once_without_sleeping(no_sleep: list[float]) -> None:
    # One request per 100 s: a meter that waited for its token would take 100 s of wall time.
    meter = Meter("api", rate_per_s=0.01, burst=1)
    meter.reserve()
    started = time.perf_counter()
    with pytest.raises(RateLimited) as denied:
        meter.reserve()
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5
    assert no_sleep == []
    assert denied.value.source == "api"
    assert denied.value.retry_after_s == pytest.approx(100.0, abs=elapsed + 0.01)
    assert denied.value.name == "RateLimited" and denied.value.category == "transient"


@pytest.mark.clause("connector.meter.acquire-call")
def test_retry_after_is_the_exact_wait_until_enough_tokens() -> None:
    clock = Clock()
    meter = Meter("api", rate_per_s=4.0, burst=2, clock=clock)
    meter.reserve()
    meter.reserve()
    with pytest.raises(RateLimited) as denied:
        meter.reserve()
    assert denied.value.retry_after_s == 0.25
    clock.now += 0.1
    with pytest.raises(RateLimited) as denied:
        meter.reserve(cost=2)
    assert denied.value.retry_after_s == pytest.approx(0.4)  # 0.4 tokens held, 1.6 more at 4/s
    # Waiting exactly the wait named is enough; a hair less is not.
    clock.now += denied.value.retry_after_s - 0.001
    with pytest.raises(RateLimited):
        meter.reserve(cost=2)
    clock.now += 0.001
    meter.reserve(cost=2)
    # The bucket refills to burst and no further.
    clock.now += 1000
    meter.reserve(cost=2)
    with pytest.raises(RateLimited) as denied:
        meter.reserve()
    assert denied.value.retry_after_s == 0.25


@pytest.mark.clause("connector.meter.acquire-call")
def test_the_retry_schedule_performs_the_wait_the_meter_names(no_sleep: list[float]) -> None:
    clock = Clock()
    meter = Meter("api", rate_per_s=0.5, burst=1, clock=clock)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    def pull(attempt: int) -> int:
        meter.reserve()
        return attempt

    schedule = RetrySchedule(attempts=5, base_s=0.5, jitter=0.1, sleep=sleep)
    assert schedule.run("page 1", pull) == 1
    assert schedule.run("page 2", pull) == 2
    assert schedule.run("page 3", pull) == 2
    # Each denial names 2 s (one token at 0.5/s), above the jittered backoff; the schedule waited it.
    assert waits == [2.0, 2.0]
    assert no_sleep == []
    assert [(a.label, a.attempt, a.error, a.waited_s) for a in schedule.attempts_log] == [
        ("page 1", 1, None, 0.0),
        ("page 2", 1, "RateLimited", 2.0), ("page 2", 2, None, 0.0),
        ("page 3", 1, "RateLimited", 2.0), ("page 3", 2, None, 0.0),
    ]


@pytest.mark.clause("connector.meter.acquire-call")
def test_a_call_finds_the_lock_held_and_returns_within_its_timeout() -> None:
    assert LOCK_TIMEOUT_S == 5.0
    assert Meter("api", rate_per_s=1, burst=1).lock_timeout_s == 5.0
    with pytest.raises(ValueError):
        Meter("api", rate_per_s=1, burst=1, lock_timeout_s=6)

    # The holder's clock read blocks inside the meter's lock until the test releases it.
    inside, release = threading.Event(), threading.Event()
    holder_name = "meter-holder"

    def clock() -> float:
        if threading.current_thread().name == holder_name:
            inside.set()
            release.wait(30)
        return 0.0

    meter = Meter("api", rate_per_s=1, burst=5, clock=clock, lock_timeout_s=0.3)
    holder = threading.Thread(target=meter.reserve, name=holder_name, daemon=True)
    holder.start()
    try:
        assert inside.wait(300)
        started = time.perf_counter()
        with pytest.raises(RateLimited) as denied:
            meter.reserve()
        elapsed = time.perf_counter() - started
    finally:
        release.set()
        holder.join(10)
    assert 0.3 <= elapsed < 5.0
    assert denied.value.source == "api" and "lock" in denied.value.reason
    assert 0 < denied.value.retry_after_s < 1
    meter.reserve()  # free again once the holder is done


def test_reservations_from_many_threads_take_exactly_the_burst() -> None:
    meter = Meter("api", rate_per_s=1e-6, burst=50, clock=lambda: 0.0)
    granted: list[int] = []
    denied: list[float] = []

    def worker() -> None:
        for _ in range(20):
            try:
                meter.reserve()
                granted.append(1)
            except RateLimited as exc:
                denied.append(exc.retry_after_s)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 50 and len(denied) == 8 * 20 - 50


def test_from_config_reads_requests_per_seconds_and_reports_every_problem() -> None:
    clock = Clock()
    meter = Meter.from_config("api", {"requests": 10, "per_s": 60}, clock=clock)
    assert (meter.rate_per_s, meter.burst) == (pytest.approx(10 / 60), 10.0)
    assert Meter.from_config("api", {"requests": 10, "per_s": 1, "burst": 2}).burst == 2.0
    with pytest.raises(ManifestInvalid) as info:
        Meter.from_config("api", {"requests": 0, "burst": "x", "per_minute": 1}, where="source.rate_limit")
    problems = info.value.problems
    assert [type(p) for p in problems] == [ManifestKeyUnknown, ManifestValueInvalid, ManifestValueInvalid,
                                           ManifestValueInvalid]
    assert [p.fields["key"] for p in problems] == ["per_minute", "requests", "per_s", "burst"]
    with pytest.raises(ValueError):
        meter.reserve(cost=11)
