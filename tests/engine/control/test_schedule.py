"""The schedule grammar (engine.control.schedule, issue 27; docs/schedules.md).

What the grammar reads and what it refuses (naming the field and token), and the instants a
schedule admits: ``every n`` admits the whole multiples of n since the Unix epoch (checked against
calendar instants worked out by hand and, over drawn intervals and instants, against remainder
arithmetic and the defining properties of the grid); a cron schedule's next fire is checked against
two oracles over expressions Hypothesis draws from the grammar and instants across three centuries
(leap years, month ends, the day-of-month/day-of-week rule): croniter called directly on the text
as written, and a brute-force matcher written here that walks day by day and minute by minute.
"""

from __future__ import annotations

import calendar
import datetime as dt

import pytest
from contextful.engine.control.schedule import parse_schedule
from contextful.storage.clock import to_us
from contextful.storage.errors import ScheduleUnreadable
from croniter import croniter
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.soak import trials

US = 1_000_000
MIN = 60 * US
DAY = 86400 * US


def at(*parts: int) -> int:
    """Microseconds since the epoch of a UTC calendar instant."""
    return to_us(dt.datetime(*parts, tzinfo=dt.UTC))


LOW_US, HIGH_US = at(1970, 1, 1), at(2199, 12, 31)


# --- the grammar ---------------------------------------------------------------------------------


REFERENCE = at(2024, 2, 29, 10, 17, 42) + 123
"""A start at 10:17:42.000123 UTC on epoch day 19,782 (a Thursday, as 1970-01-01 was)."""


@pytest.mark.clause("surface.arm.grammar")
@pytest.mark.parametrize(("text", "interval_us", "grid_instant"), [
    ("every 30s", 30 * US, at(2024, 2, 29, 10, 18)),
    ("every 30 s", 30 * US, at(2024, 2, 29, 10, 18)),
    ("every 90s", 90 * US, at(2024, 2, 29, 10, 18)),  # a day is 960 x 90 s: each day starts on the grid
    ("every 5m", 300 * US, at(2024, 2, 29, 10, 20)),
    ("every 7m", 420 * US, at(2024, 2, 29, 10, 23)),  # 19,782 days = 7 x 4,069,440 minutes; 10:23 = 89 x 7 min
    ("every 1h", 3600 * US, at(2024, 2, 29, 11)),
    ("every 2d", 2 * DAY, at(2024, 3, 2)),  # 19,782 is even: the next even epoch day is March 2
    ("every 7d", 7 * DAY, at(2024, 3, 7)),  # weeks since the epoch begin on Thursdays at 00:00 UTC
    ("  every   1h  ", 3600 * US, at(2024, 2, 29, 11)),
    ("every 010m", 600 * US, at(2024, 2, 29, 10, 20)),
])
def test_every_reads_count_and_unit_and_admits_the_epoch_grid(text: str, interval_us: int,
                                                              grid_instant: int) -> None:
    """``every n`` admits the whole multiples of n since 1970-01-01T00:00Z, whatever the reference:
    the next fire after a start at 10:17:42 is the grid instant worked out by hand, not 10:17:42 + n."""
    schedule = parse_schedule(text, "orders")
    assert schedule.text == text
    assert schedule.every_us == interval_us
    assert grid_instant % interval_us == 0 and REFERENCE < grid_instant <= REFERENCE + interval_us
    assert schedule.next_after(REFERENCE) == grid_instant
    assert schedule.next_after(grid_instant - 1) == grid_instant
    assert schedule.next_after(grid_instant) == grid_instant + interval_us  # strictly after an instant on the grid
    assert schedule.next_after(grid_instant + interval_us - 1) == grid_instant + interval_us


@pytest.mark.clause("surface.arm.grammar")
@pytest.mark.parametrize(("text", "minutes", "hours", "days", "months", "weekdays"), [
    ("* * * * *", range(60), range(24), range(1, 32), range(1, 13), range(7)),
    ("5 4 3 2 1", [5], [4], [3], [2], [1]),
    ("0-10/5 */6 1,15,31 */3 1-5", [0, 5, 10], [0, 6, 12, 18], [1, 15, 31], [1, 4, 7, 10], [1, 2, 3, 4, 5]),
    ("*/90 0 * * 7", [0], [0], range(1, 32), range(1, 13), [0]),
    ("0 0 * jan-Mar,DEC MON-FRI", [0], [0], range(1, 32), [1, 2, 3, 12], [1, 2, 3, 4, 5]),
    ("0 0 * * FRI-SUN", [0], [0], range(1, 32), range(1, 13), [0, 5, 6]),
    ("0 0 * * 5-7,3", [0], [0], range(1, 32), range(1, 13), [0, 3, 5, 6]),
    ("59\t23  31 12 sat", [59], [23], [31], [12], [6]),
])
def test_cron_fields_read_as_value_sets(text: str, minutes: range, hours: range, days: range, months: range,
                                        weekdays: range) -> None:
    cron = parse_schedule(text, "orders").cron
    assert cron is not None
    assert (cron.minutes, cron.hours, cron.days, cron.months, cron.weekdays) == tuple(
        tuple(values) for values in (minutes, hours, days, months, weekdays))


REFUSED = [
    ("0 0 L * *", "day of month field 'L'", "L (last)"),
    ("0 0 LW * *", "day of month field 'LW'", "L (last)"),
    ("0 0 15W * *", "day of month field '15W'", "W (nearest weekday)"),
    ("0 0 ? * MON", "day of month field '?'", "? (no specific value)"),
    ("0 0 * * 5L", "day of week field '5L'", "L (last)"),
    ("0 0 * * 5#3", "day of week field '5#3'", "# (nth weekday)"),
    ("H * * * *", "minute field 'H'", "H (hashed value)"),
    ("@daily", "'@daily' is an @ macro", "0 0 * * *"),
    ("@reboot", "'@reboot' is an @ macro", ""),
    ("0 0 0 * * *", "6 fields", "seconds and years"),
    ("0 0 0 * * * 2027", "7 fields", "seconds and years"),
    ("* * * *", "4 fields", "five"),
    ("61 * * * *", "minute field '61'", "61 is outside 0-59"),
    ("* 24 * * *", "hour field '24'", "24 is outside 0-23"),
    ("* * 0 * *", "day of month field '0'", "0 is outside 1-31"),
    ("* * * 13 *", "month field '13'", "13 is outside 1-12"),
    ("* * * * 8", "day of week field '8'", "8 is outside 0-7"),
    ("1,,2 * * * *", "minute field '1,,2'", "an empty list item"),
    ("1, * * * *", "minute field '1,'", "an empty list item"),
    ("1- * * * *", "minute field '1-'", "a range lacks its end"),
    ("-5 * * * *", "minute field '-5'", "a value is missing"),
    ("*/ * * * *", "minute field '*/'", "the step '' is not a positive integer"),
    ("*/0 * * * *", "minute field '*/0'", "the step '0' is not a positive integer"),
    ("5/15 * * * *", "minute field '5/15'", "write 5-59/15"),
    ("10-5 * * * *", "minute field '10-5'", "runs backwards"),
    ("* * * * SUN-SAT/x", "day of week field 'SUN-SAT/x'", "the step 'x'"),
    ("* * * FOO *", "month field 'FOO'", "'FOO' is neither a number nor one of JAN"),
    ("* * * * MONDAY", "day of week field 'MONDAY'", "'MONDAY' is neither"),
    ("0 0 30 2 *", "day of month '30' never falls in month '2'", "admits no instant"),
    ("0 0 31 4,6,9,11 *", "day of month '31' never falls in month '4,6,9,11'", "admits no instant"),
    ("", "the schedule is empty", ""),
    ("every", "'every' takes a count and a unit", ""),
    ("every30s", "'every' takes a count and a unit", ""),
    ("every 0s", "the count '0' is not a positive integer", ""),
    ("every -5m", "the count '-5' is not a positive integer", ""),
    ("every 1.5h", "the count '1.5' is not a positive integer", ""),
    ("every 30", "a unit (s, m, h or d) follows the count", ""),
    ("every 1H", "the unit 'H' is none of s, m, h, d", ""),
    ("every 1w", "the unit 'w' is none of s, m, h, d", ""),
    ("every 1h30m", "the unit 'h30m'", ""),
    ("Every 1h", "'Every' is spelled 'every'", ""),
    ("every \u0663s", "the count '\u0663' is not a positive integer", ""),  # an Arabic-Indic three
    ("\u0663 * * * *", "minute field '\u0663'", "is not a number"),
    ("every 3651d", "longer than ten years", ""),
]


@pytest.mark.clause("surface.arm.unreadable-schedule", "surface.arm.grammar")
@pytest.mark.parametrize(("text", "names", "says"), REFUSED)
def test_grammar_refuses_naming_field_and_token(text: str, names: str, says: str) -> None:
    with pytest.raises(ScheduleUnreadable) as caught:
        parse_schedule(text, "orders")
    error = caught.value
    assert (error.entry, error.schedule) == ("orders", text)
    assert names in error.diagnostic and says in error.diagnostic
    assert "orders" in str(error) and error.diagnostic in str(error)


# --- next fire of an every schedule: the epoch grid ----------------------------------------------


UNITS_US = {"s": US, "m": MIN, "h": 60 * MIN, "d": DAY}


@st.composite
def every_and_instant(draw: st.DrawFn) -> tuple[str, int, int]:
    """An ``every`` schedule drawn from the grammar, its interval, and an instant: anywhere, on its
    grid, or a microsecond either side of a grid instant."""
    unit = draw(st.sampled_from(sorted(UNITS_US)))
    count = draw(st.one_of(st.integers(1, 120), st.integers(1, 3650 * DAY // UNITS_US[unit])))  # up to ten years
    interval = count * UNITS_US[unit]
    anywhere = draw(st.integers(LOW_US, HIGH_US))
    on_grid = anywhere // interval * interval
    after = draw(st.sampled_from([anywhere, on_grid, on_grid - 1, on_grid + 1]))
    return f"every {count}{draw(st.sampled_from(['', ' ']))}{unit}", interval, after


@pytest.mark.clause("surface.arm.grammar")
@settings(max_examples=trials(300, 5000), deadline=None)
@given(drawn=every_and_instant())
@example(drawn=("every 1h", 3600 * US, at(2024, 2, 29, 10, 17, 42)))
@example(drawn=("every 1s", US, at(1970, 1, 1)))
@example(drawn=("every 3650d", 3650 * DAY, at(2024, 2, 29)))
def test_every_next_fire_is_the_next_multiple_of_n_since_the_epoch(drawn: tuple[str, int, int]) -> None:
    """The oracle: the reference's remainder modulo n, and the grid's defining properties (a whole
    multiple of n, strictly after the reference, no later than one interval after it)."""
    text, interval, after = drawn
    ours = parse_schedule(text, "orders").next_after(after)
    remainder = after % interval
    assert ours == after + (interval - remainder)
    assert ours % interval == 0 and after < ours <= after + interval


# --- next fire of a cron schedule ----------------------------------------------------------------


@pytest.mark.clause("surface.arm.grammar")
def test_cron_next_fire_is_strictly_after_and_on_a_minute_boundary() -> None:
    hourly = parse_schedule("0 * * * *", "orders")
    assert hourly.next_after(at(2026, 1, 1, 12)) == at(2026, 1, 1, 13)
    assert hourly.next_after(at(2026, 1, 1, 12) - 1) == at(2026, 1, 1, 12)
    assert hourly.next_after(at(2026, 1, 1, 12) + 1) == at(2026, 1, 1, 13)
    every_minute = parse_schedule("* * * * *", "orders")
    assert every_minute.next_after(at(2026, 12, 31, 23, 59, 30)) == at(2027, 1, 1)
    assert every_minute.next_after(-1) == 0


@pytest.mark.clause("surface.arm.grammar")
def test_cron_leap_days_and_month_ends() -> None:
    leap = parse_schedule("0 0 29 2 *", "orders")
    assert leap.next_after(at(2024, 3, 1)) == at(2028, 2, 29)
    assert leap.next_after(at(2096, 3, 1)) == at(2104, 2, 29)  # 2100 is no leap year
    month_end = parse_schedule("30 23 31 * *", "orders")
    assert month_end.next_after(at(2026, 1, 31, 23, 30)) == at(2026, 3, 31, 23, 30)
    assert month_end.next_after(at(2026, 8, 1)) == at(2026, 8, 31, 23, 30)


@pytest.mark.clause("surface.arm.grammar")
def test_day_fields_follow_vixie_cron() -> None:
    """Both restricted: either matches. Either beginning with '*': both must match (croniter's own
    default reads '*/2' as restricted and ORs it; we pass it Vixie's rule)."""
    monday = at(2024, 1, 1)  # a Monday
    either = parse_schedule("0 0 13 * FRI", "orders")
    assert either.next_after(monday) == at(2024, 1, 5)  # a Friday, not the 13th
    assert either.next_after(at(2024, 1, 12)) == at(2024, 1, 13)  # the 13th, a Saturday
    both = parse_schedule("0 0 */2 * MON", "orders")
    assert both.next_after(monday) == at(2024, 1, 15)  # the first odd-numbered Monday after
    plain = croniter("0 0 */2 * MON", monday / US).get_next(float)
    assert int(plain) * US == at(2024, 1, 3)  # croniter's default differs: an odd day or a Monday
    weekday_star = parse_schedule("0 0 1,15 * */7", "orders")  # */7 = Sunday, '*'-led: AND
    assert weekday_star.next_after(monday) == at(2024, 9, 1)


@pytest.mark.clause("surface.arm.grammar")
def test_degenerate_range_is_its_value() -> None:
    """A range a-a admits a alone. croniter 7 expands it to '*' (it would fire '0 5-5 * * *' every
    hour), one reason our grammar reads the fields and croniter gets explicit lists."""
    assert croniter("0 5-5 * * *", 0.0).get_next(float) == 3600.0  # croniter on its own: 01:00
    five = parse_schedule("0 5-5 * * *", "orders")
    assert five.next_after(0) == at(1970, 1, 1, 5)
    assert five.next_after(at(1970, 1, 1, 5)) == at(1970, 1, 2, 5)
    assert parse_schedule("* * * FEB-FEB *", "orders").next_after(0) == at(1970, 2, 1)


# --- the oracles ---------------------------------------------------------------------------------

FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


def spell(field: int, value: int, draw_name: bool) -> str:
    if draw_name and field == 3:
        return MONTHS[value - 1]
    if draw_name and field == 4 and value < 7:
        return WEEKDAYS[value].lower()
    return str(value)


@st.composite
def cron_field(draw: st.DrawFn, field: int) -> tuple[str, set[int]]:
    """One field's text and the values it admits, drawn from the grammar."""
    low, high = FIELD_RANGES[field]
    if draw(st.booleans()):
        step = draw(st.sampled_from([1, 1, 2, 3, 5, 7, 15, 40]))
        return ("*" if step == 1 else f"*/{step}"), set(range(low, high + 1, step))
    items, values = [], set()
    for _ in range(draw(st.integers(1, 3))):
        a = draw(st.integers(low, high))
        shape = draw(st.sampled_from(["value", "range", "step"]))
        if shape == "value" or a == high:
            items.append(spell(field, a, draw(st.booleans())))
            values.add(a)
            continue
        b = draw(st.integers(a + 1, high))  # croniter reads a-a as * (test_degenerate_range_is_its_value)
        step = draw(st.integers(1, 10)) if shape == "step" else 1
        named = draw(st.booleans())
        items.append(f"{spell(field, a, named)}-{spell(field, b, named)}" + (f"/{step}" if shape == "step" else ""))
        values.update(range(a, b + 1, step))
    return ",".join(items), values


@st.composite
def cron_expression(draw: st.DrawFn) -> tuple[str, list[set[int]]]:
    fields = [draw(cron_field(i)) for i in range(5)]
    return " ".join(text for text, _ in fields), [values for _, values in fields]


def brute_force_next(sets: list[set[int]], day_or: bool, after_us: int) -> int | None:
    """The first minute boundary strictly after ``after_us`` matching the sets, walking day by day
    (and minute by minute within a matching day) for up to 400 years; Vixie's day rule."""
    minutes, hours, days, months, weekdays = sets
    weekdays = {0 if d == 7 else d for d in weekdays}
    day = dt.date(1970, 1, 1) + dt.timedelta(days=after_us // (86400 * US))
    for _ in range(400 * 366):
        dom, dow = day.day in days, (day.weekday() + 1) % 7 in weekdays
        if day.month in months and ((dom or dow) if day_or else (dom and dow)):
            midnight = (day - dt.date(1970, 1, 1)).days * 86400 * US
            for hour in range(24):
                for minute in range(60):
                    instant = midnight + (hour * 60 + minute) * MIN
                    if instant > after_us and hour in hours and minute in minutes:
                        return instant
        day += dt.timedelta(days=1)
    return None


instants = st.one_of(st.integers(LOW_US, HIGH_US), st.integers(LOW_US // MIN, HIGH_US // MIN).map(lambda m: m * MIN))


@pytest.mark.clause("surface.arm.grammar")
@settings(max_examples=trials(150, 3000), deadline=None)
@given(expression=cron_expression(), after_us=instants)
@example(expression=("0 0 29 2 */7", [{0}, {0}, {29}, {2}, {0, 7}]), after_us=at(2024, 3, 1))
@example(expression=("0 0 13 * 5", [{0}, {0}, {13}, set(range(1, 13)), {5}]), after_us=at(2026, 2, 28, 23, 59))
@example(expression=("59 23 31 12 *", [{59}, {23}, {31}, {12}, set(range(8))]), after_us=at(2099, 12, 31, 23, 59))
def test_cron_next_fire_matches_croniter_and_brute_force(expression: tuple[str, list[set[int]]], after_us: int) -> None:
    text, sets = expression
    fields = text.split()
    day_or = not (fields[2].startswith("*") or fields[4].startswith("*"))
    possible = day_or or any(d <= calendar.monthrange(2000, m)[1] for m in sets[3] for d in sets[2])
    if not possible:
        with pytest.raises(ScheduleUnreadable, match="never falls in month"):
            parse_schedule(text, "orders")
        return
    ours = parse_schedule(text, "orders").next_after(after_us)
    assert ours == brute_force_next(sets, day_or, after_us)
    start = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=after_us)
    direct = croniter(text, start, day_or=day_or, max_years_between_matches=400).get_next(float)
    assert ours == round(direct) * US
