"""The run's retry schedule: attempts, backoff waits, and the bound hits a run record lists.

Implements decisions ``meter-reservation-holds`` (clause ``connector.meter.acquire-call``: the
limiter never sleeps, so *this* schedule performs the wait a ``RateLimited`` names, on the run's
cancellation token) and ``bound-hit-rides`` (clause ``run.retry.bound-hit-recorded``: every
``ConnectorBoundHit`` is listed with its step label, attempt and bound, a hit a later attempt
recovered from included).

The decision is one ``isinstance`` check: a ``TransientError`` waits and retries, anything else
re-raises at once. The wait after attempt *n* is::

    backoff = min(base_s * factor ** (n - 1), max_s) * (1 ± jitter)       then capped at max_s
    wait    = max(backoff, error.retry_after_s)                            capped at max_s

except for ``RateLimited``, whose ``retry_after_s`` is honoured up to ``10 * max_s``: a meter's
exact token wait or a server's ``Retry-After`` says an earlier call is refused again, so waiting
less only burns an attempt; the ceiling keeps a broken or hostile ``Retry-After`` (a day) from
parking a run.

Cancellation: the wait is ``cancel.wait(seconds)``, so setting the run's token ends it at once.
A canceled wait re-raises the error that caused it, with a note saying the retry was canceled
(no separate error class: the failure the run reports is the attempt's).

    >>> waits = []
    >>> schedule = RetrySchedule(attempts=3, base_s=1.0, jitter=0.0, sleep=waits.append)
    >>> def pull(attempt):
    ...     if attempt == 1:
    ...         raise ConnectorBoundHit("page 3", "call-deadline", "30 s passed")
    ...     return "rows"
    >>> schedule.run("page 3", pull)
    'rows'
    >>> waits, [hit.to_json() for hit in schedule.bound_hits]
    ([1.0], [{'step': 'page 3', 'attempt': 1, 'bound': 'call-deadline'}])
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contextful.storage.errors import (
    ConnectorBoundHit,
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    RateLimited,
    TransientError,
)

T = TypeVar("T")

CONFIG_KEYS = ("attempts", "base_s", "max_s")

RATE_LIMIT_CEILING = 10
"""A ``RateLimited`` wait is honoured up to this many times ``max_s``."""


@dataclass(frozen=True)
class Attempt:
    """One call of a step: its outcome and the wait that followed it."""

    label: str
    """The step label the schedule ran under."""
    attempt: int
    """1-based attempt number within that step."""
    error: str | None
    """The error's name (``RateLimited``, ``ValueError``, …), or None when the attempt succeeded."""
    waited_s: float
    """Seconds waited before the next attempt (0 after a success, a re-raise, or the last attempt)."""


@dataclass(frozen=True)
class BoundHit:
    """A ``ConnectorBoundHit`` as the run record lists it (``run.retry.bound-hit-recorded``)."""

    step: str
    """The step label of the attempt that struck the bound."""
    attempt: int
    """That attempt's number."""
    bound: str
    """``linear-memory`` or ``call-deadline``."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "attempt": self.attempt, "bound": self.bound}


@dataclass
class RetrySchedule:
    """Runs a step up to ``attempts`` times, waiting between transient failures.

    ``sleep`` replaces the wait for tests (it receives the seconds); otherwise the wait is
    ``cancel.wait(seconds)``, or ``time.sleep`` when ``run`` gets no cancellation token.
    ``attempts_log`` and ``bound_hits`` accumulate over every ``run`` of this schedule, so one
    schedule attached to a run records the whole run.
    """

    attempts: int = 5
    """Calls per step, the first included."""
    base_s: float = 0.5
    """The wait after the first failure, before jitter."""
    factor: float = 2.0
    """Growth of the backoff per attempt."""
    max_s: float = 60.0
    """Ceiling of any wait (``RateLimited``: ten times this)."""
    jitter: float = 0.1
    """The backoff varies by up to this fraction either way, so callers failing together spread out."""
    sleep: Callable[[float], None] | None = None
    """Performs the wait instead of the cancellation token (tests inject a recorder)."""
    attempts_log: list[Attempt] = field(default_factory=list, init=False)
    bound_hits: list[BoundHit] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, not {self.attempts!r}")
        if self.base_s < 0 or self.max_s < 0 or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError("base_s and max_s must be >= 0, factor >= 1 and jitter in [0, 1)")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, where: str = "retry",
                    sleep: Callable[[float], None] | None = None) -> RetrySchedule:
        """A schedule from ``{"attempts": int, "base_s": float, "max_s": float}`` (each optional).

        Raises ``ManifestInvalid`` listing every problem (``where`` names the block).
        """
        problems: list[ContextfulError] = [ManifestKeyUnknown(where, key, CONFIG_KEYS)
                                           for key in config if key not in CONFIG_KEYS]
        values: dict[str, Any] = {}
        attempts = config.get("attempts")
        if attempts is not None:
            if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
                problems.append(ManifestValueInvalid(where, "attempts", f"must be an integer >= 1, not {attempts!r}"))
            else:
                values["attempts"] = attempts
        for key in ("base_s", "max_s"):
            value = config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                problems.append(ManifestValueInvalid(where, key, f"must be a number of seconds >= 0, not {value!r}"))
            else:
                values[key] = float(value)
        if problems:
            raise ManifestInvalid(where, problems)
        return cls(**values, sleep=sleep)

    def run(self, label: str, fn: Callable[[int], T], *, cancel: threading.Event | None = None) -> T:
        """``fn(attempt)`` for attempt 1, 2, … until it returns, fails terminally, or attempts run out."""
        for attempt in range(1, self.attempts + 1):
            try:
                return self._call(label, attempt, fn)
            except TransientError as exc:
                if getattr(exc, "permanent", False):  # DelegateAnswerRejected: this attempt closes Permanent
                    self.attempts_log.append(Attempt(label, attempt, exc.name, 0.0))
                    raise
                if isinstance(exc, ConnectorBoundHit):
                    self.bound_hits.append(BoundHit(label, attempt, exc.fields["bound"]))
                if attempt == self.attempts:
                    self.attempts_log.append(Attempt(label, attempt, exc.name, 0.0))
                    raise
                seconds = self.wait_for(attempt, exc)
                waited, canceled = self._wait(seconds, cancel)
                self.attempts_log.append(Attempt(label, attempt, exc.name, waited))
                if canceled:
                    exc.add_note(f"retry of {label!r} canceled during the wait after attempt {attempt} "
                                 f"of {self.attempts}")
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def wait_for(self, attempt: int, error: BaseException) -> float:
        """The wait after ``attempt`` failed with ``error`` (see the module docstring)."""
        backoff = min(self.base_s * self.factor ** (attempt - 1), self.max_s)
        if self.jitter:
            backoff *= 1 + random.uniform(-self.jitter, self.jitter)
        wait = min(backoff, self.max_s)
        retry_after = getattr(error, "retry_after_s", None)
        if isinstance(retry_after, (int, float)) and retry_after > wait:
            cap = self.max_s * RATE_LIMIT_CEILING if isinstance(error, RateLimited) else self.max_s
            wait = min(float(retry_after), cap)
        return wait

    def _call(self, label: str, attempt: int, fn: Callable[[int], T]) -> T:
        try:
            result = fn(attempt)
        except TransientError:
            raise
        except BaseException as exc:
            name = exc.name if isinstance(exc, ContextfulError) else type(exc).__name__
            self.attempts_log.append(Attempt(label, attempt, name, 0.0))
            raise
        self.attempts_log.append(Attempt(label, attempt, None, 0.0))
        return result

    def _wait(self, seconds: float, cancel: threading.Event | None) -> tuple[float, bool]:
        """Wait ``seconds``; answer (seconds waited, whether ``cancel`` ended or preceded the wait)."""
        if self.sleep is not None:
            self.sleep(seconds)
            return seconds, cancel is not None and cancel.is_set()
        if cancel is None:
            time.sleep(seconds)
            return seconds, False
        started = time.monotonic()
        if cancel.wait(seconds):
            return min(seconds, time.monotonic() - started), True
        return seconds, False
