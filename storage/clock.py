"""Clocks: the store's notion of now, injectable wherever the spec reasons about instants.

Transaction time (``committed_us``), retention and ``as_of`` reads all ask a :class:`Clock`, so a
test advances a :class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now_us(self) -> int:
        """Microseconds since the Unix epoch, UTC."""
        ...


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | int = 1_700_000_000_000_000) -> None:
        self._now = to_us(start) if isinstance(start, datetime) else int(start)

    def now_us(self) -> int:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += int(seconds * 1_000_000)


def to_us(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1_000_000)


def from_us(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1_000_000, tz=UTC)
