"""The run's retry schedule: transient failures wait and retry, bound hits are listed, waits cancel."""

from __future__ import annotations

import threading
import time

import pytest
from contextful.engine.run.retry import Attempt, BoundHit, RetrySchedule
from contextful.storage.errors import (
    ConnectorBoundHit,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    RateLimited,
    SourceUnavailable,
    TableNotFound,
)


def failing(errors: list[BaseException | None]) -> tuple[list[int], object]:
    """A step raising ``errors[attempt - 1]`` (None: return the attempt); and the attempts it saw."""
    calls: list[int] = []

    def fn(attempt: int) -> int:
        calls.append(attempt)
        error = errors[attempt - 1]
        if error is not None:
            raise error
        return attempt

    return calls, fn


@pytest.mark.clause("run.retry.bound-hit-recorded")
def test_a_bound_hit_a_later_attempt_recovered_from_is_listed() -> None:
    waits: list[float] = []
    calls, fn = failing([ConnectorBoundHit("page 3", "call-deadline", "30 s passed"), None])
    schedule = RetrySchedule(sleep=waits.append)
    assert schedule.run("page 3", fn) == 2  # type: ignore[arg-type]
    assert calls == [1, 2]
    assert schedule.bound_hits == [BoundHit("page 3", 1, "call-deadline")]
    assert [hit.to_json() for hit in schedule.bound_hits] == [{"step": "page 3", "attempt": 1, "bound": "call-deadline"}]
    assert len(waits) == 1


@pytest.mark.clause("run.retry.bound-hit-recorded")
def test_every_bound_hit_of_every_step_is_listed_with_its_step_attempt_and_bound() -> None:
    schedule = RetrySchedule(attempts=3, sleep=lambda s: None)
    _, first = failing([None])
    _, second = failing([ConnectorBoundHit("x", "linear-memory", "2 GiB"), SourceUnavailable("api", "reset"),
                         ConnectorBoundHit("x", "call-deadline", "30 s")])
    schedule.run("page 1", first)  # type: ignore[arg-type]
    with pytest.raises(ConnectorBoundHit):
        schedule.run("page 2", second)  # type: ignore[arg-type]
    assert [h.to_json() for h in schedule.bound_hits] == [
        {"step": "page 2", "attempt": 1, "bound": "linear-memory"},
        {"step": "page 2", "attempt": 3, "bound": "call-deadline"},
    ]


def test_transient_errors_retry_until_attempts_run_out_then_the_last_reraises() -> None:
    waits: list[float] = []
    errors = [SourceUnavailable("api", f"503 #{n}", 503) for n in range(1, 4)]
    calls, fn = failing(list(errors))
    schedule = RetrySchedule(attempts=3, base_s=1.0, factor=2.0, jitter=0.0, sleep=waits.append)
    with pytest.raises(SourceUnavailable) as info:
        schedule.run("pull", fn)  # type: ignore[arg-type]
    assert info.value is errors[2]
    assert calls == [1, 2, 3] and waits == [1.0, 2.0]
    assert schedule.attempts_log == [Attempt("pull", 1, "SourceUnavailable", 1.0),
                                     Attempt("pull", 2, "SourceUnavailable", 2.0),
                                     Attempt("pull", 3, "SourceUnavailable", 0.0)]


@pytest.mark.parametrize("error", [TableNotFound("t"), ValueError("bug")])
def test_a_terminal_or_foreign_error_reraises_at_once(error: Exception) -> None:
    waits: list[float] = []
    calls, fn = failing([error, None])
    schedule = RetrySchedule(sleep=waits.append)
    with pytest.raises(type(error)) as info:
        schedule.run("pull", fn)  # type: ignore[arg-type]
    assert info.value is error and calls == [1] and waits == []
    assert schedule.attempts_log == [Attempt("pull", 1, type(error).__name__, 0.0)]


def test_backoff_grows_jitters_within_bounds_and_caps_at_max() -> None:
    schedule = RetrySchedule(base_s=1.0, factor=2.0, max_s=5.0, jitter=0.1)
    error = SourceUnavailable("api", "down")
    for attempt, expected in [(1, 1.0), (2, 2.0), (3, 4.0)]:
        for _ in range(50):
            assert expected * 0.9 <= schedule.wait_for(attempt, error) <= expected * 1.1
    assert all(4.5 <= schedule.wait_for(9, error) <= 5.0 for _ in range(50))


@pytest.mark.clause("connector.meter.acquire-call")
def test_rate_limited_waits_its_retry_after_up_to_ten_times_max() -> None:
    schedule = RetrySchedule(base_s=0.5, max_s=60.0, jitter=0.0)
    assert schedule.wait_for(1, RateLimited("api", 7.25, "429")) == 7.25
    assert schedule.wait_for(1, RateLimited("api", 300.0, "429")) == 300.0
    assert schedule.wait_for(1, RateLimited("api", 86_400.0, "429")) == 600.0
    assert schedule.wait_for(1, RateLimited("api", 0.1, "429")) == 0.5  # the backoff is the floor
    waits: list[float] = []
    _, fn = failing([RateLimited("api", 90.0, "Retry-After: 90"), None])
    assert RetrySchedule(sleep=waits.append).run("page 1", fn) == 2  # type: ignore[arg-type]
    assert waits == [90.0]


def test_setting_cancel_ends_the_wait_and_reraises_the_error_with_a_note() -> None:
    cancel = threading.Event()
    error = SourceUnavailable("api", "down")
    calls, fn = failing([error, None])
    schedule = RetrySchedule(base_s=3600.0, max_s=3600.0, jitter=0.0)
    threading.Timer(0.1, cancel.set).start()  # during the wait or before it: either way the wait ends
    started = time.perf_counter()
    with pytest.raises(SourceUnavailable) as info:
        schedule.run("page 1", fn, cancel=cancel)  # type: ignore[arg-type]
    assert time.perf_counter() - started < 3600  # the hour's wait did not run out: the cancel ended it
    assert info.value is error and calls == [1]
    assert any("canceled" in note for note in info.value.__notes__)
    (attempt,) = schedule.attempts_log
    assert attempt.error == "SourceUnavailable" and attempt.waited_s < 3600


def test_an_uncanceled_wait_runs_on_the_cancel_token() -> None:
    cancel = threading.Event()
    calls, fn = failing([SourceUnavailable("api", "down"), None])
    assert RetrySchedule(base_s=0.01, jitter=0.0).run("page 1", fn, cancel=cancel) == 2  # type: ignore[arg-type]
    assert calls == [1, 2]


def test_from_config_reads_attempts_base_and_max_and_reports_every_problem() -> None:
    schedule = RetrySchedule.from_config({"attempts": 3, "base_s": 2, "max_s": 10})
    assert (schedule.attempts, schedule.base_s, schedule.max_s) == (3, 2.0, 10.0)
    assert RetrySchedule.from_config({}).attempts == 5
    with pytest.raises(ManifestInvalid) as info:
        RetrySchedule.from_config({"attempts": 0, "base_s": -1, "tries": 2}, where="pipeline.retry")
    assert [type(p) for p in info.value.problems] == [ManifestKeyUnknown, ManifestValueInvalid, ManifestValueInvalid]
    assert [p.fields["key"] for p in info.value.problems] == ["tries", "attempts", "base_s"]
