"""The schedule grammar and the instants a schedule admits (issue 27; docs/schedules.md).

Implements ``surface.arm.grammar`` and the grammar half of ``surface.arm.unreadable-schedule``: a
schedule is ``every <n><unit>`` (unit ``s``, ``m``, ``h`` or ``d``; ``n`` a positive integer) or a
five-field UTC cron expression (minute, hour, day of month, month, day of week), each field ``*``,
a value, a range, a list or a ``/`` step. This module's own grammar check decides what is read;
anything else (``L``, ``W``, ``?``, ``#``, ``H``, ``@`` macros, six or seven fields, values out of
range, empty fields, backwards ranges, a zero or negative ``every``, a day that never falls in the
months named) raises :class:`~contextful.storage.errors.ScheduleUnreadable` naming the field and the
token. ``croniter`` only computes a cron schedule's instants, from the field sets this module read,
with the day-of-month/day-of-week rule stated explicitly (Vixie cron's: see :class:`CronFields`).

    >>> parse_schedule("every 30 s", "orders").next_after(1_000_000)
    30000000
    >>> parse_schedule("*/15 * * * *", "orders").next_after(0) // 60_000_000
    15

No I/O: the caller passes instants (microseconds since the epoch, UTC).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from contextful.storage.errors import ScheduleUnreadable
from croniter import croniter

US = 1_000_000
MINUTE_US = 60 * US
UNIT_US = {"s": US, "m": 60 * US, "h": 3600 * US, "d": 86400 * US}
MAX_EVERY_US = 3650 * UNIT_US["d"]
"""The longest ``every`` interval read (ten years): a longer one names an instant past the calendar."""

MONTH_NAMES = {name: i + 1 for i, name in enumerate(
    ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))}
WEEKDAY_NAMES = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
"""The most days each month can hold (February in a leap year)."""

EXTENSIONS = {"L": "L (last)", "W": "W (nearest weekday)", "?": "? (no specific value)", "#": "# (nth weekday)",
              "H": "H (hashed value)"}
_EVERY = re.compile(r"every(?P<gap>\s*)(?P<count>[^\sA-Za-z]*)\s*(?P<unit>\S*)")
_NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: \d admits other scripts' digits


@dataclass(frozen=True)
class _Field:
    """One cron field's name, bounds and value names."""

    name: str
    low: int
    high: int
    names: dict[str, int]


FIELDS = (_Field("minute", 0, 59, {}), _Field("hour", 0, 23, {}), _Field("day of month", 1, 31, {}),
          _Field("month", 1, 12, MONTH_NAMES), _Field("day of week", 0, 7, WEEKDAY_NAMES))


@dataclass(frozen=True)
class CronFields:
    """The values each field of a cron expression admits, read by the grammar.

    ``day_or`` is Vixie cron's day rule: when both day fields are restricted (neither begins with
    ``*``), a day matches if either matches; when either begins with ``*`` (``*``, ``*/2``), both
    must match. Day of week 7 is Sunday and is held as 0.
    """

    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]
    day_or: bool

    def croniter_text(self) -> str:
        """The expression croniter is given: each field as the explicit list of its values."""
        return " ".join(",".join(map(str, values)) for values in
                        (self.minutes, self.hours, self.days, self.months, self.weekdays))


class _CronInstants:
    """Next-instant computation for one cron schedule: one croniter object, built once, reused
    under a lock (it is stateful) for every call."""

    def __init__(self, fields: CronFields) -> None:
        # 400 years: the Gregorian cycle, within which any day the grammar admits recurs.
        self._iter = croniter(fields.croniter_text(), 0.0, day_or=fields.day_or, max_years_between_matches=400)
        self._lock = threading.Lock()

    def next_after(self, after_us: int) -> int:
        # The first admitted minute boundary after the minute holding after_us is the first
        # strictly after after_us (every boundary past after_us is past that minute's start).
        start_s = after_us // MINUTE_US * 60
        with self._lock:
            self._iter.set_current(float(start_s), force=True)
            found = self._iter.get_next(float)
        return round(found) * US


@dataclass(frozen=True)
class Schedule:
    """A schedule as read by :func:`parse_schedule`: ``every_us`` for ``every <n><unit>``, else
    ``cron``; :meth:`next_after` gives the instants it admits."""

    text: str
    """The schedule as written."""
    every_us: int | None = None
    """The interval of an ``every`` schedule, in microseconds."""
    cron: CronFields | None = None
    """The field sets of a cron schedule."""
    _next: Callable[[int], int] | None = field(default=None, compare=False, repr=False)

    def next_after(self, after_us: int) -> int:
        """The first instant strictly after ``after_us`` the schedule admits (microseconds, UTC):
        for ``every n`` the next whole multiple of ``n`` since the Unix epoch (``every 1h``: each
        hour on the hour), so a cadence never drifts by how long a start takes; for cron the next
        matching minute boundary."""
        if self.every_us is not None:
            return (after_us // self.every_us + 1) * self.every_us
        assert self._next is not None
        return self._next(after_us)


def parse_schedule(text: str, entry: str) -> Schedule:
    """Read ``text`` as the schedule of ``entry``, or raise ``ScheduleUnreadable`` naming what is wrong."""
    stripped = text.strip()
    if not stripped:
        raise ScheduleUnreadable(entry, text, "the schedule is empty")
    if stripped.startswith("@"):
        raise ScheduleUnreadable(entry, text, f"{stripped.split()[0]!r} is an @ macro, which the grammar refuses: "
                                              "write the five cron fields (e.g. '0 0 * * *' for @daily)")
    if stripped[:5].lower() == "every":
        return Schedule(text, every_us=_every(stripped, entry, text))
    fields = _cron(stripped, entry, text)
    instants = _CronInstants(fields)
    return Schedule(text, cron=fields, _next=instants.next_after)


def _every(stripped: str, entry: str, text: str) -> int:
    if not stripped.startswith("every"):
        raise ScheduleUnreadable(entry, text, f"{stripped[:5]!r} is spelled 'every'")
    match = _EVERY.fullmatch(stripped)
    if match is None or not match["gap"] or not match["count"]:
        raise ScheduleUnreadable(entry, text, "'every' takes a count and a unit after a space, as 'every 30s'")
    count, unit = match["count"], match["unit"]
    if not _NUMBER.fullmatch(count) or int(count) == 0:
        raise ScheduleUnreadable(entry, text, f"the count {count!r} is not a positive integer")
    if not unit:
        raise ScheduleUnreadable(entry, text, "a unit (s, m, h or d) follows the count")
    if unit not in UNIT_US:
        raise ScheduleUnreadable(entry, text, f"the unit {unit!r} is none of s, m, h, d")
    interval = int(count) * UNIT_US[unit]
    if interval > MAX_EVERY_US:
        raise ScheduleUnreadable(entry, text, f"every {count}{unit} is longer than ten years")
    return interval


def _cron(stripped: str, entry: str, text: str) -> CronFields:
    parts = stripped.split()
    if len(parts) in (6, 7):
        raise ScheduleUnreadable(entry, text, f"{len(parts)} fields: seconds and years fields are refused; a cron "
                                              "schedule has five (minute hour day-of-month month day-of-week)")
    if len(parts) != 5:
        raise ScheduleUnreadable(entry, text, f"{len(parts)} field{'s' if len(parts) > 1 else ''}: a schedule is "
                                              "'every <n><unit>' or five cron fields")
    sets = [_field(spec, part, entry, text) for spec, part in zip(FIELDS, parts)]
    weekdays = tuple(sorted({0 if day == 7 else day for day in sets[4]}))
    day_or = not (parts[2].startswith("*") or parts[4].startswith("*"))
    fields = CronFields(sets[0], sets[1], sets[2], sets[3], weekdays, day_or)
    if not day_or and not any(day <= MONTH_DAYS[month - 1] for month in fields.months for day in fields.days):
        raise ScheduleUnreadable(entry, text, f"day of month {parts[2]!r} never falls in month {parts[3]!r}: "
                                              "the schedule admits no instant")
    return fields


def _field(spec: _Field, part: str, entry: str, text: str) -> tuple[int, ...]:
    """The values one cron field admits (a list of items, each ``*``, a value or a range, with an
    optional ``/`` step)."""

    def refuse(problem: str) -> ScheduleUnreadable:
        return ScheduleUnreadable(entry, text, f"{spec.name} field {part!r}: {problem}")

    for char in "?#":
        if char in part:
            raise refuse(f"{EXTENSIONS[char]} is a cron extension the grammar refuses")
    values: set[int] = set()
    for item in part.split(","):
        if not item:
            raise refuse("an empty list item")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _NUMBER.fullmatch(step_text) or int(step_text) == 0:
                raise refuse(f"the step {step_text!r} is not a positive integer")
            step = int(step_text)
        if base == "*":
            low, high = spec.low, spec.high
        else:
            start, dash, end = base.partition("-")
            low = _value(spec, start, refuse)
            if dash:
                high = _value(spec, end, refuse, range_end=True)
                if high < low:
                    raise refuse(f"the range {base!r} runs backwards (ranges do not wrap)")
            elif slash:
                raise refuse(f"a step follows * or a range, not the value {base!r} "
                             f"(write {base}-{spec.high}/{step_text})")
            else:
                high = low
        values.update(range(low, high + 1, step))
    return tuple(sorted(values))


def _value(spec: _Field, token: str, refuse: Callable[[str], ScheduleUnreadable], range_end: bool = False) -> int:
    if not token:
        raise refuse("a range lacks its end" if range_end else "a value is missing")
    if _NUMBER.fullmatch(token):
        value = int(token)
        if not spec.low <= value <= spec.high:
            raise refuse(f"{token} is outside {spec.low}-{spec.high}")
        return value
    name = token.upper()
    if spec.names and name in spec.names:
        # SUN ending a day-of-week range is day 7, so FRI-SUN reads Friday to Sunday.
        return 7 if range_end and name == "SUN" else spec.names[name]
    extension = next((EXTENSIONS[char] for char in name if char in EXTENSIONS), None)
    if extension is not None:
        raise refuse(f"{extension} is a cron extension the grammar refuses")
    if spec.names:
        raise refuse(f"{token!r} is neither a number nor one of {', '.join(spec.names)}")
    raise refuse(f"{token!r} is not a number")
