"""The armed set (engine.control.arm, issue 27; docs/schedules.md): next fire from history, catch-up,
pulled history and pulled futures, per-entry arming, and admission order.

The clock is a number the test advances: no test waits on wall time. An ``every n`` entry's instants
are the whole multiples of n since the epoch; the tests work them out themselves (:func:`grid_after`,
or by hand from T0, a midnight and so on every such grid used here), never by asking the schedule.
The set is checked against a plain model (every entry's next fire recomputed, a scan and a sort by
the stated rule) under random histories and ticks, and in a soak over a simulated day (an hour in
the ordinary suite) of 1,000 entries ticked every 500 ms, where each fire must come at the instant
the grammar admits, once.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable

import pytest
from contextful.engine.control.arm import (
    ArmedEntry,
    ArmedSet,
    Due,
    History,
    Unarmed,
    arm_entries,
    latest_start,
)
from contextful.engine.control.schedule import parse_schedule
from contextful.storage.clock import from_us, to_us
from contextful.storage.errors import ArgumentInvalid, ScheduleUnreadable
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.soak import soak_long, trials

US = 1_000_000
MIN = 60 * US
HOUR = 3600 * US
T0 = to_us(dt.datetime(2024, 2, 29, tzinfo=dt.UTC))  # a leap day, midnight UTC


def grid_after(after_us: int, step_us: int) -> int:
    """The oracle for ``every``: the least whole multiple of ``step_us`` since the epoch above ``after_us``."""
    return after_us - after_us % step_us + step_us


def entry(entry_id: str, text: str, priority: int = 0) -> ArmedEntry:
    return ArmedEntry(entry_id, parse_schedule(text, entry_id), priority)


# --- next fire from history ----------------------------------------------------------------------


@pytest.mark.clause("surface.arm.next-fire-from-history")
def test_entry_with_no_history_is_due_when_armed() -> None:
    armed = ArmedSet([entry("orders", "every 1h"), entry("users", "30 12 * * *")], armed_us=T0 + 7)
    assert armed.next_fire("orders") == armed.next_fire("users") == T0 + 7
    assert [d.id for d in armed.due(T0 + 7)] == ["orders", "users"]
    assert armed.due(T0 + 6) == []
    armed.update("orders", History(None, None))
    assert armed.next_fire("orders") == T0 + 7


@pytest.mark.clause("surface.arm.next-fire-from-history")
@pytest.mark.parametrize(("start", "dispatch", "reference", "every_fire"), [
    (T0 - 40 * MIN - 17 * US, None, T0 - 40 * MIN - 17 * US, T0 - 30 * MIN),
    (None, T0 - 20 * MIN + 3 * US, T0 - 20 * MIN + 3 * US, T0 - 15 * MIN),
    (T0 - 40 * MIN, T0 - 20 * MIN + 3 * US, T0 - 20 * MIN + 3 * US, T0 - 15 * MIN),  # dispatched after its start
    (T0 - 5 * MIN - 1, T0 - 20 * MIN, T0 - 5 * MIN - 1, T0),  # a start later than the last dispatch
])
def test_next_fire_follows_the_later_of_start_and_dispatch(start: int | None, dispatch: int | None,
                                                          reference: int, every_fire: int) -> None:
    """``every 15m`` admits the quarter hours since the epoch: its next fire is the first quarter
    hour after the reference (the later of start and dispatch), worked out by hand from midnight T0;
    the earlier of the two would name a different quarter hour in each case."""
    armed = ArmedSet([entry("every", "every 15m"), entry("cron", "0 * * * *")], armed_us=T0)
    history = History(start, dispatch)
    assert history.reference_us == reference
    armed.update("every", history)
    armed.update("cron", history)
    assert armed.next_fire("every") == every_fire
    assert armed.next_fire("cron") == T0  # the first whole hour after every reference above
    assert armed.due(every_fire - 1) == []
    assert Due("every", every_fire, 0, reference) in armed.due(every_fire)
    assert [d.id for d in armed.due(T0)] == (["every", "cron"] if every_fire < T0 else ["cron", "every"])


@pytest.mark.clause("surface.arm.next-fire-from-history")
def test_restarted_daemon_keeps_its_cadence() -> None:
    """An hourly entry dispatched at 00:00 whose run started at 00:00:03, on a daemon restarted at
    00:25, fires at 01:00: not at boot, not an hour after boot, and not an hour after the start."""
    boot = T0 + 25 * MIN
    armed = ArmedSet([entry("orders", "every 1h")], armed_us=boot)
    armed.update("orders", History(last_start_us=T0 + 3 * US, last_dispatch_us=T0))
    assert armed.due(boot) == []
    assert armed.next_due_us() == T0 + HOUR
    assert [d.id for d in armed.due(T0 + HOUR)] == ["orders"]


@pytest.mark.clause("surface.arm.next-fire-from-history")
@pytest.mark.parametrize("text", ["every 1h", "every 90s", "every 7m"])
def test_late_starts_never_shift_the_cadence(text: str) -> None:
    """Each run starts late by a random amount under one interval (a busy pool, a slow child); the
    dispatches stay on the grid, the multiples of the interval since the epoch, for 200 fires."""
    step = {"every 1h": HOUR, "every 90s": 90 * US, "every 7m": 7 * MIN}[text]
    rng = random.Random(27)
    armed = ArmedSet([entry("orders", text)], armed_us=T0)
    dispatched = []
    start = None
    for _ in range(200):
        fire = armed.next_due_us()
        assert [d.id for d in armed.due(fire)] == ["orders"]
        dispatched.append(fire)
        armed.update("orders", History(start, last_dispatch_us=fire))  # recorded before the run starts
        start = fire + rng.randint(1, step - 1)  # the run starts late, within its interval
        armed.update("orders", History(start, last_dispatch_us=fire))
    first = grid_after(T0, step)
    assert dispatched == [T0] + [first + i * step for i in range(199)]


# --- catch-up ------------------------------------------------------------------------------------


@pytest.mark.clause("surface.arm.catch-up")
@pytest.mark.parametrize(("text", "step"), [
    ("every 1h", HOUR), ("0 * * * *", HOUR), ("every 5m", 5 * MIN), ("*/5 * * * *", 5 * MIN), ("every 90s", 90 * US),
])
def test_passed_fire_fires_once_and_arms_from_that_run(text: str, step: int) -> None:
    """Armed at 00:07:00.25 after 30 hours down: one fire at arming, however many instants passed, then
    the grid again (T0 is a midnight, so the grid is T0 plus multiples of the step). Ticks come every
    500 ms from the arming instant, so each dispatch is 250 ms after its grid instant; the lateness
    never carries into the next fire."""
    last = T0 - 30 * HOUR - 17 * US
    armed_us = T0 + 7 * MIN + 250_000
    end = armed_us + 2 * HOUR
    armed = ArmedSet([entry("orders", text)], armed_us=armed_us)
    armed.update("orders", History(last_start_us=last, last_dispatch_us=None))
    fires = []
    now = armed_us
    while now <= end:  # a tick every 500 ms for two hours after arming
        for due in armed.due(now):
            fires.append((due.next_fire_us, now))
            armed.update(due.id, History(last, last_dispatch_us=now))
        now += 500_000
    assert fires[0] == (T0 - 30 * HOUR, armed_us)  # the first instant after the last start, fired once
    grid = [instant for instant in range(T0, end, step) if armed_us < instant <= end - 250_000]
    assert fires[1:] == [(instant, instant + 250_000) for instant in grid]
    assert (len(grid), grid[0]) == {HOUR: (2, T0 + HOUR), 5 * MIN: (24, T0 + 10 * MIN),
                                    90 * US: (80, T0 + 7 * MIN + 30 * US)}[step]


# --- pulled history ------------------------------------------------------------------------------


@pytest.mark.clause("surface.arm.pulled-history")
def test_last_start_is_the_latest_across_catalog_and_pulled_states() -> None:
    now = T0
    assert latest_start(T0 - HOUR, [T0 - 3 * HOUR, T0 - 10 * MIN, T0 - 2 * HOUR], now) == T0 - 10 * MIN
    assert latest_start(T0 - MIN, [T0 - HOUR], now) == T0 - MIN
    assert latest_start(None, [T0 - HOUR, T0 - 2 * HOUR], now) == T0 - HOUR
    assert latest_start(None, [], now) is None
    assert latest_start(T0 - HOUR, iter(()), now) == T0 - HOUR


@pytest.mark.clause("surface.arm.pulled-history")
def test_cold_node_with_pulled_history_does_not_fire_everything_at_once() -> None:
    """A cold node's catalog is empty; the pulled run states carry the cadence. Armed at 00:50, ten
    hourly entries whose pulled starts fall between 00:00 and 00:45 are not due until 01:00."""
    boot = T0 + 50 * MIN
    entries = [entry(f"p{i}", "every 1h") for i in range(10)]
    armed = ArmedSet(entries, armed_us=boot)
    unpulled = ArmedSet(entries, armed_us=boot)
    for i in range(10):
        start = latest_start(None, [boot - (i + 1) * 5 * MIN, T0 - 3 * HOUR], now_us=boot)
        armed.update(f"p{i}", History(last_start_us=start, last_dispatch_us=None))
        unpulled.update(f"p{i}", History(latest_start(None, [], now_us=boot), None))
    assert len(unpulled.due(boot)) == 10  # without the pulled states, everything at once
    assert armed.due(boot) == []
    assert armed.next_due_us() == T0 + HOUR
    assert armed.due(T0 + HOUR - 1) == []
    # All at 01:00, least recent start first: p9 started at 00:00, p0 at 00:45.
    assert [d.id for d in armed.due(T0 + HOUR)] == [f"p{i}" for i in range(9, -1, -1)]


@pytest.mark.clause("surface.arm.pulled-future")
def test_pulled_start_in_the_future_counts_as_no_start() -> None:
    now = T0
    assert latest_start(T0 - HOUR, [T0 + 1, T0 + 10 * HOUR], now) == T0 - HOUR
    assert latest_start(None, [T0 + 1], now) is None
    assert latest_start(None, [T0 + 1, T0], now) == T0  # a start at the current instant counts
    armed = ArmedSet([entry("orders", "every 1h")], armed_us=T0)
    # A replica whose clock runs a day fast wrote a start tomorrow: it defers nothing here.
    armed.update("orders", History(latest_start(T0 - 2 * HOUR, [T0 + 24 * HOUR], now), None))
    assert [d.id for d in armed.due(T0)] == ["orders"]
    armed.update("orders", History(latest_start(None, [T0 + 24 * HOUR], now), None))
    assert armed.next_fire("orders") == T0  # no start at all: due when armed


# --- arming: per-entry refusal -------------------------------------------------------------------


@pytest.mark.clause("surface.arm.unreadable-schedule")
def test_unreadable_schedule_holds_back_that_entry_alone() -> None:
    armed, unarmed = arm_entries([
        ("orders", "every 5m", 0), ("users", "0 0 L * *", 2), ("events", "*/15 * * * MON-FRI", 1),
        ("manual", None, 0), ("macro", "@hourly", 0),
    ])
    assert [(e.id, e.schedule.text, e.priority) for e in armed] == [
        ("orders", "every 5m", 0), ("events", "*/15 * * * MON-FRI", 1)]
    assert [(u.id, type(u.error).__name__ if u.error else None) for u in unarmed] == [
        ("users", "ScheduleUnreadable"), ("manual", None), ("macro", "ScheduleUnreadable")]
    by_id = {u.id: u for u in unarmed}
    assert by_id["manual"] == Unarmed("manual", "declares no schedule", None)
    users = by_id["users"].error
    assert isinstance(users, ScheduleUnreadable)
    assert (users.entry, users.schedule) == ("users", "0 0 L * *")
    assert "L (last)" in users.diagnostic and users.diagnostic in by_id["users"].reason
    assert "@ macro" in by_id["macro"].reason
    assert len(ArmedSet(armed, armed_us=T0)) == 2


def test_two_entries_with_one_id_are_refused() -> None:
    with pytest.raises(ArgumentInvalid, match="share this id"):
        ArmedSet([entry("orders", "every 1m"), entry("orders", "every 2m")], armed_us=T0)


# --- admission order -----------------------------------------------------------------------------


@pytest.mark.clause("surface.dispatch.admission-order")
def test_due_units_start_in_admission_order() -> None:
    armed = ArmedSet([
        entry("z-never", "every 1h"), entry("a-never", "every 1h", priority=-5),
        entry("late-fire", "every 10m", priority=100),
        entry("high", "every 5m", priority=3), entry("low", "every 5m", priority=-1),
        entry("older-ref", "every 1h"), entry("newer-ref", "0 * * * *"),
        entry("tie-b", "every 5m"), entry("tie-a", "every 5m"),
    ], armed_us=T0)
    armed.update("late-fire", History(T0 + 3 * MIN, None))  # next fire T0 + 10m (a run started after arming)
    for name in ("high", "low", "tie-a", "tie-b"):
        armed.update(name, History(T0 + 2 * MIN, None))  # next fire T0 + 5m
    armed.update("older-ref", History(T0 - 40 * MIN, None))  # next fire T0, the hour's grid instant
    armed.update("newer-ref", History(None, T0 - 1))  # next fire T0
    due = armed.due(T0 + 10 * MIN)
    assert [d.id for d in due] == [
        "z-never", "a-never",  # neither a start nor a dispatch: first; both due at T0, then by priority
        "older-ref", "newer-ref",  # earliest next fire (T0), least recent reference first
        "high", "tie-a", "tie-b", "low",  # next fire T0+5m: highest priority, then id
        "late-fire",  # next fire T0+10m, priority 100 notwithstanding
    ]
    assert due[1] == Due("a-never", T0, -5, None)
    assert [(d.next_fire_us, d.reference_us) for d in due[2:]] == [(T0, T0 - 40 * MIN), (T0, T0 - 1)] + [
        (T0 + 5 * MIN, T0 + 2 * MIN)] * 4 + [(T0 + 10 * MIN, T0 + 3 * MIN)]
    assert due == armed.due(T0 + 10 * MIN)  # due() consumes nothing


def model_order(rows: list[tuple[str, int, int, int | None]]) -> list[str]:
    """The oracle: admission order as the clause words it, over (id, next fire, priority, reference)."""
    ordered = sorted(rows, key=lambda r: r[0])  # stable sorts, the last criterion first
    ordered.sort(key=lambda r: r[3] or 0)
    ordered.sort(key=lambda r: r[2], reverse=True)
    ordered.sort(key=lambda r: r[1])
    return [r[0] for r in ordered if r[3] is None] + [r[0] for r in ordered if r[3] is not None]


MODEL_EVERY = {"every 1s": US, "every 7m": 7 * MIN, "every 1h": HOUR}


def model_fire(e: ArmedEntry, reference: int | None) -> int:
    """The oracle's next fire: the armed instant T0 without a reference; an ``every`` entry's grid
    instant by :func:`grid_after`; a cron entry's from its schedule, whose instants test_schedule.py
    checks against two oracles."""
    if reference is None:
        return T0
    if e.schedule.text in MODEL_EVERY:
        return grid_after(reference, MODEL_EVERY[e.schedule.text])
    return e.schedule.next_after(reference)


operations = st.lists(st.tuples(
    st.integers(0, 19),
    st.one_of(st.none(), st.integers(-3 * HOUR, 3 * HOUR)),
    st.one_of(st.none(), st.integers(-3 * HOUR, 3 * HOUR)),
    st.integers(0, 2 * HOUR),
), max_size=60)


@pytest.mark.clause("surface.dispatch.admission-order", "surface.arm.next-fire-from-history")
@settings(max_examples=trials(100, 2000), deadline=None)
@given(ops=operations, priorities=st.lists(st.integers(-2, 2), min_size=20, max_size=20),
       kinds=st.lists(st.sampled_from([*MODEL_EVERY, "*/5 * * * *", "0 * * * *", "13 2,14 * * *"]),
                      min_size=20, max_size=20))
def test_armed_set_matches_a_plain_model(ops: list[tuple[int, int | None, int | None, int]],
                                         priorities: list[int], kinds: list[str]) -> None:
    """Random histories and ticks: due() and next_due_us() answer what a full scan answers."""
    entries = [entry(f"e{i:02d}", kinds[i], priorities[i]) for i in range(20)]
    armed = ArmedSet(entries, armed_us=T0)
    model: dict[str, int | None] = {e.id: None for e in entries}
    for index, start, dispatch, tick in ops:
        e = entries[index]
        starts = None if start is None else T0 + start
        dispatched = None if dispatch is None else T0 + dispatch
        armed.update(e.id, History(starts, dispatched))
        model[e.id] = max((t for t in (starts, dispatched) if t is not None), default=None)
        fires = {i.id: model_fire(i, model[i.id]) for i in entries}
        now = T0 + tick
        rows = [(i.id, fires[i.id], i.priority, model[i.id]) for i in entries if fires[i.id] <= now]
        assert [d.id for d in armed.due(now)] == model_order(rows)
        assert [(d.next_fire_us, d.reference_us) for d in armed.due(now)] == [
            (fires[r], model[r]) for r in model_order(rows)]
        assert armed.next_due_us() == min(fires.values())
        assert all(armed.next_fire(i) == fires[i] for i in model)
    assert sorted(armed.ids()) == sorted(model) and len(armed) == 20


def test_many_updates_keep_the_heap_bounded() -> None:
    entries = [entry(f"e{i}", "every 1m") for i in range(50)]
    armed = ArmedSet(entries, armed_us=T0)
    for round_ in range(200):
        for e in entries:
            armed.update(e.id, History(None, T0 + round_ * MIN))
    assert len(armed._heap) <= 2 * 50 + 64  # stale rows are compacted away, not kept forever
    assert armed.next_due_us() == T0 + 200 * MIN
    assert len(armed.due(T0 + 200 * MIN)) == 50


# --- the soak: a simulated day -------------------------------------------------------------------

CRON: list[tuple[str, Callable[[dt.datetime], bool]]] = [
    ("* * * * *", lambda t: True),
    ("*/5 * * * *", lambda t: t.minute % 5 == 0),
    ("0 * * * *", lambda t: t.minute == 0),
    ("15,45 * * * *", lambda t: t.minute in (15, 45)),
    ("0-30/10 9-17 * * MON-FRI", lambda t: t.minute in (0, 10, 20, 30) and 9 <= t.hour <= 17 and t.weekday() < 5),
    ("30 12 * * *", lambda t: (t.hour, t.minute) == (12, 30)),
    ("7 */3 29 2 *", lambda t: t.minute == 7 and t.hour % 3 == 0 and (t.month, t.day) == (2, 29)),
    ("*/20 * 1 * SAT", lambda t: t.minute % 20 == 0 and (t.day == 1 or t.weekday() == 5)),
    ("59 23 * * *", lambda t: (t.hour, t.minute) == (23, 59)),
    ("0 0 1 3 *", lambda t: (t.month, t.day, t.hour, t.minute) == (3, 1, 0, 0)),
]


def matching_minutes(match: Callable[[dt.datetime], bool], after_us: int, end_us: int) -> list[int]:
    """Every whole minute in (after_us, end_us] the predicate admits, walking minute by minute."""
    first = after_us // MIN * MIN + MIN
    return [m for m in range(first, end_us + 1, MIN)
            if match(from_us(m))]


def expected_fires(text: str, start: int | None, armed_us: int, end_us: int) -> list[tuple[int, int]]:
    """(next fire, tick it is dispatched at) for one entry, from its schedule's own definition."""
    if text.startswith("every"):
        # Whole seconds, so the 500 ms ticks from a whole-second arming land on every grid instant.
        step = {"s": US, "m": MIN, "h": HOUR}[text[-1]] * int(text.split()[1][:-1])
        fire = armed_us if start is None else grid_after(start, step)
        tick = max(fire, armed_us)
        return [(fire, tick)] + [(grid, grid) for grid in range(grid_after(tick, step), end_us + 1, step)]
    match = dict(CRON)[text]
    if start is None:
        first = armed_us
    else:
        admitted = matching_minutes(match, start, end_us)
        if not admitted:
            return []
        first = admitted[0]
    tick = max(first, armed_us)
    return [(first, tick)] + [(m, m) for m in matching_minutes(match, tick, end_us)]


@pytest.mark.slow
@pytest.mark.clause("surface.arm.next-fire-from-history", "surface.arm.catch-up")
def test_soak_a_simulated_day_fires_each_entry_at_each_admitted_instant_once() -> None:
    """1,000 entries (every 1s ... every 1h, and cron), half with a history before arming, ticked
    every 500 ms over a simulated day (an hour unless CONTEXTFUL_SOAK=1), each due entry dispatched
    at once: every fire at the instant its schedule admits, none twice, none missed."""
    rng = random.Random(27)
    span = 24 * HOUR if soak_long() else HOUR
    armed_us = T0 + 11 * HOUR + 30 * MIN  # 11:30 on a leap day: noon, 12:30 and weekday hours inside the hour
    texts = ["every 1s", "every 1s", "every 2s", "every 5s", "every 1h", "every 60m", "every 90s"]
    texts += [f"every {rng.randint(1, 3600)}s" for _ in range(700 - len(texts))]
    texts += [CRON[i % len(CRON)][0] for i in range(300)]
    starts = [None if i % 2 else armed_us - rng.randint(1, 2 * 3600) * US for i in range(len(texts))]
    entries = [entry(f"e{i:04d}", text, rng.randint(-1, 1)) for i, text in enumerate(texts)]
    armed = ArmedSet(entries, armed_us)
    for e, start in zip(entries, starts):
        armed.update(e.id, History(start, None))
    fired: dict[str, list[tuple[int, int]]] = {e.id: [] for e in entries}
    end = armed_us + span
    now = armed_us
    while now <= end:
        for due in armed.due(now):
            fired[due.id].append((due.next_fire_us, now))
            armed.update(due.id, History(starts[int(due.id[1:])], last_dispatch_us=now))
        now += 500_000
    total = 0
    for e, text, start in zip(entries, texts, starts):
        expected = expected_fires(text, start, armed_us, end)
        assert fired[e.id] == expected, (e.id, text, start)
        total += len(expected)
    assert total > 10_000
