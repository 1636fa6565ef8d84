"""The armed set (engine.control.arm, issue 27; docs/schedules.md): next fire from history, catch-up,
pulled history and pulled futures, per-entry arming, and admission order.

The clock is a number the test advances: no test waits on wall time. The set is checked against a
plain model (every entry's next fire recomputed, a scan and a sort by the stated rule) under random
histories and ticks, and in a soak over a simulated day (an hour in the ordinary suite) of 1,000
entries ticked every 500 ms, where each fire must come at the instant the grammar admits, once.
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
@pytest.mark.parametrize(("start", "dispatch", "reference"), [
    (T0 - 10 * MIN, None, T0 - 10 * MIN),
    (None, T0 - 20 * MIN, T0 - 20 * MIN),
    (T0 - 30 * MIN, T0 - 20 * MIN, T0 - 20 * MIN),  # dispatched after its last recorded start
    (T0 - 5 * MIN, T0 - 20 * MIN, T0 - 5 * MIN),  # a start later than the last dispatch
])
def test_next_fire_rides_the_later_of_start_and_dispatch(start: int | None, dispatch: int | None,
                                                        reference: int) -> None:
    armed = ArmedSet([entry("every", "every 1h"), entry("cron", "0 * * * *")], armed_us=T0)
    history = History(start, dispatch)
    assert history.reference_us == reference
    armed.update("every", history)
    armed.update("cron", history)
    assert armed.next_fire("every") == reference + HOUR
    assert armed.next_fire("cron") == T0  # the first whole hour after every reference above
    assert [d.id for d in armed.due(T0)] == ["cron"]
    assert armed.due(reference + HOUR - 1) == [Due("cron", T0, 0, reference)]
    assert [d.id for d in armed.due(reference + HOUR)] == ["cron", "every"]


@pytest.mark.clause("surface.arm.next-fire-from-history")
def test_restarted_daemon_keeps_its_cadence() -> None:
    """A daemon restarted 25 minutes after the last run of an hourly entry fires 35 minutes later,
    not at boot and not an hour after boot."""
    last = T0 - 25 * MIN
    armed = ArmedSet([entry("orders", "every 1h")], armed_us=T0)
    armed.update("orders", History(last_start_us=last, last_dispatch_us=last - 2 * US))
    assert armed.due(T0) == []
    assert armed.next_due_us() == T0 + 35 * MIN


# --- catch-up ------------------------------------------------------------------------------------


@pytest.mark.clause("surface.arm.catch-up")
@pytest.mark.parametrize("text", ["every 1h", "0 * * * *", "*/5 * * * *"])
def test_passed_fire_fires_once_and_arms_from_that_run(text: str) -> None:
    armed = ArmedSet([entry("orders", text)], armed_us=T0)
    armed.update("orders", History(last_start_us=T0 - 30 * HOUR - 17 * US, last_dispatch_us=None))
    fires = []
    now = T0
    while now <= T0 + 59 * MIN:  # a tick every 500 ms for the hour after arming
        for due in armed.due(now):
            fires.append((due.next_fire_us, now))
            armed.update(due.id, History(T0 - 30 * HOUR - 17 * US, last_dispatch_us=now))
        now += 500_000
    schedule = parse_schedule(text, "orders")
    assert fires[0] == (schedule.next_after(T0 - 30 * HOUR - 17 * US), T0)  # once, for all 30 intervals missed
    following = [fire for fire, _ in fires[1:]]
    expected = [schedule.next_after(T0)]
    while len(expected) < 20 and (nxt := schedule.next_after(expected[-1])) <= T0 + 59 * MIN:
        expected.append(nxt)
    expected = [fire for fire in expected if fire <= T0 + 59 * MIN]
    assert following == expected
    assert (len(fires) - 1, following[:1]) == {"every 1h": (0, []), "0 * * * *": (0, []),
                                               "*/5 * * * *": (11, [T0 + 5 * MIN])}[text]


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
    """A cold node's catalog is empty; the pulled run states carry the cadence."""
    entries = [entry(f"p{i}", "every 1h") for i in range(10)]
    armed = ArmedSet(entries, armed_us=T0)
    for i in range(10):
        start = latest_start(None, [T0 - (i + 1) * 5 * MIN, T0 - 3 * HOUR], now_us=T0)
        armed.update(f"p{i}", History(last_start_us=start, last_dispatch_us=None))
    assert armed.due(T0) == []
    assert armed.next_due_us() == T0 + 10 * MIN  # p9 started 50 minutes ago
    assert [d.id for d in armed.due(T0 + 25 * MIN)] == ["p9", "p8", "p7", "p6"]


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
        entry("late-fire", "every 1h", priority=100),
        entry("high", "every 1h", priority=3), entry("low", "every 1h", priority=-1),
        entry("older-ref", "0 * * * *"), entry("newer-ref", "0 * * * *"),
        entry("tie-b", "every 1h"), entry("tie-a", "every 1h"),
    ], armed_us=T0)
    armed.update("late-fire", History(T0 - 50 * MIN, None))  # next fire T0 + 10m
    for name in ("high", "low", "tie-a", "tie-b"):
        armed.update(name, History(T0 - 55 * MIN, None))  # next fire T0 + 5m
    armed.update("older-ref", History(T0 - 40 * MIN, None))  # next fire T0
    armed.update("newer-ref", History(None, T0 - 1))  # next fire T0
    due = armed.due(T0 + 10 * MIN)
    assert [d.id for d in due] == [
        "z-never", "a-never",  # neither a start nor a dispatch: first; both due at T0, then by priority
        "older-ref", "newer-ref",  # earliest next fire (T0), least recent reference first
        "high", "tie-a", "tie-b", "low",  # next fire T0+5m: highest priority, then id
        "late-fire",  # next fire T0+10m, priority 100 notwithstanding
    ]
    assert due[1] == Due("a-never", T0, -5, None)
    assert due == armed.due(T0 + 10 * MIN)  # due() consumes nothing


def model_order(rows: list[tuple[str, int, int, int | None]]) -> list[str]:
    """The oracle: admission order as the clause words it, over (id, next fire, priority, reference)."""
    ordered = sorted(rows, key=lambda r: r[0])  # stable sorts, the last criterion first
    ordered.sort(key=lambda r: r[3] or 0)
    ordered.sort(key=lambda r: r[2], reverse=True)
    ordered.sort(key=lambda r: r[1])
    return [r[0] for r in ordered if r[3] is None] + [r[0] for r in ordered if r[3] is not None]


operations = st.lists(st.tuples(
    st.integers(0, 19),
    st.one_of(st.none(), st.integers(-3 * HOUR, 3 * HOUR)),
    st.one_of(st.none(), st.integers(-3 * HOUR, 3 * HOUR)),
    st.integers(0, 2 * HOUR),
), max_size=60)


@pytest.mark.clause("surface.dispatch.admission-order", "surface.arm.next-fire-from-history")
@settings(max_examples=trials(100, 2000), deadline=None)
@given(ops=operations, priorities=st.lists(st.integers(-2, 2), min_size=20, max_size=20),
       kinds=st.lists(st.sampled_from(["every 1s", "every 7m", "every 1h", "*/5 * * * *", "0 * * * *",
                                       "13 2,14 * * *"]), min_size=20, max_size=20))
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
        fires = {i.id: T0 if model[i.id] is None else i.schedule.next_after(model[i.id]) for i in entries}
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
        step = {"s": US, "m": MIN, "h": HOUR}[text[-1]] * int(text.split()[1][:-1])
        fire = armed_us if start is None else start + step
        out = []
        tick = max(fire, armed_us)
        out.append((fire, tick))
        fire = tick + step
        while fire <= end_us:
            out.append((fire, fire))
            fire += step
        return [f for f in out if f[1] <= end_us]
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
