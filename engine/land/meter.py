"""A token-bucket rate limiter whose reservations never wait.

Implements decision ``meter-reservation-holds`` (clause ``connector.meter.acquire-call``): a
reservation either takes its tokens or raises :class:`~storage.errors.RateLimited` at once, carrying
the exact wait until enough tokens accrue; the run's retry schedule (``engine.run.retry``) performs
that wait. A blocking acquire cannot select on a run's cancellation token; the retry sleep can.
Each call takes at most 5 s: the meter's lock is acquired with a timeout, and contention past it
is a denial like any other.

    >>> t = [0.0]
    >>> meter = Meter("api", rate_per_s=2.0, burst=1, clock=lambda: t[0])
    >>> meter.reserve()
    >>> try:
    ...     meter.reserve()
    ... except RateLimited as denied:
    ...     denied.retry_after_s
    0.5
    >>> t[0] += 0.5
    >>> meter.reserve()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from contextful.storage.errors import (
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    RateLimited,
)

LOCK_TIMEOUT_S = 5.0
"""The clause's bound on one limiter call; a meter's lock timeout may be shorter, never longer."""

CONTENDED_RETRY_S = 0.05
"""The wait a denial for lock contention asks for: the holder is mid-call, not out of tokens."""

CONFIG_KEYS = ("requests", "per_s", "burst")

# Refill arithmetic is in floats; a caller that waits exactly ``retry_after_s`` must not be denied
# again by a rounding error in the last bit.
_EPSILON = 1e-9


class Meter:
    """A token bucket of ``burst`` tokens refilling at ``rate_per_s``; one token per request.

    ``clock`` returns seconds on a monotonic scale (``time.monotonic`` by default); tests pass a
    clock they advance. The bucket starts full.
    """

    def __init__(self, name: str, rate_per_s: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 *, lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        if not rate_per_s > 0:
            raise ValueError(f"meter {name!r}: rate_per_s must be positive, not {rate_per_s!r}")
        if not burst > 0:
            raise ValueError(f"meter {name!r}: burst must be positive, not {burst!r}")
        if not 0 < lock_timeout_s <= LOCK_TIMEOUT_S:
            raise ValueError(f"meter {name!r}: lock_timeout_s must be in (0, {LOCK_TIMEOUT_S:g}], "
                             f"not {lock_timeout_s!r}")
        self.name = name
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst)
        self.lock_timeout_s = float(lock_timeout_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = self.burst
        self._at = clock()

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any], clock: Callable[[], float] = time.monotonic,
                    *, where: str = "rate_limit") -> Meter:
        """A meter allowing ``requests`` per ``per_s`` seconds, bursts of ``burst`` (default ``requests``).

        Raises ``ManifestInvalid`` listing every problem of ``config`` (``where`` names the block).
        """
        problems: list[ContextfulError] = [ManifestKeyUnknown(where, key, CONFIG_KEYS)
                                           for key in config if key not in CONFIG_KEYS]
        values: dict[str, float] = {}
        for key in CONFIG_KEYS:
            value = config.get(key)
            if value is None:
                if key != "burst":
                    problems.append(ManifestValueInvalid(where, key, "is required"))
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                problems.append(ManifestValueInvalid(where, key, f"must be a positive number, not {value!r}"))
                continue
            values[key] = float(value)
        if problems:
            raise ManifestInvalid(where, problems)
        requests, per_s = values["requests"], values["per_s"]
        return cls(name, rate_per_s=requests / per_s, burst=values.get("burst", requests), clock=clock)

    def reserve(self, cost: float = 1) -> None:
        """Take ``cost`` tokens, or raise ``RateLimited`` naming the exact wait until they accrue.

        Never sleeps. Raises ``ValueError`` for a cost the bucket can never hold (above ``burst``).
        """
        if not 0 < cost <= self.burst:
            raise ValueError(f"meter {self.name!r}: a reservation of {cost!r} can never fit a bucket of "
                             f"{self.burst:g}")
        if not self._lock.acquire(timeout=self.lock_timeout_s):
            raise RateLimited(self.name, CONTENDED_RETRY_S,
                              f"the meter's lock stayed held for {self.lock_timeout_s:g} s by another call")
        try:
            now = self._clock()
            # A clock that steps back (it should not, being monotonic) refills nothing.
            elapsed = max(0.0, now - self._at)
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate_per_s)
            self._at = max(self._at, now)
            if self._tokens + _EPSILON >= cost:
                self._tokens = max(0.0, self._tokens - cost)
                return
            left = self._tokens
        finally:
            self._lock.release()
        raise RateLimited(self.name, (cost - left) / self.rate_per_s,
                          f"{cost:g} token(s) wanted, {left:.3f} of {self.burst:g} left, refilling at "
                          f"{self.rate_per_s:g}/s")
