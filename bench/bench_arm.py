"""One tick of the armed set (engine.control.arm, issue 27) against a plain scan of every entry.

An armed set of ``--entries`` entries (1,000 and 10,000 by default): nine in ten ``every <n>s``
with n drawn from 1 to 3600, one in ten a cron expression, each with a last run start drawn in the
hour before arming, so a 500 ms tick finds the usual handful due. The virtual clock advances in
500 ms ticks; each tick evaluates ``due(now)`` and ``next_due_us()`` (the evaluation) and then
dispatches every due entry (``update`` with ``last_dispatch_us=now``); the first tick, where every
entry whose next fire passed before arming is due at once, is reported on its own. The peer side, on the same
entries and ticks, is the least a scheduler could do without a heap: one pass over a dict of next
fires, the due ones sorted by the admission key, and ``min`` for the next due instant. Ratio =
ours / scan (below 1 is faster). Targets: a tick (evaluation and updates) under 5 ms at 1,000
entries and under 50 ms at 10,000.

    python bench/bench_arm.py                 # 1,000 and 10,000 entries, 7,200 ticks (an hour)
    python bench/bench_arm.py --quick         # 720 ticks
    python bench/bench_arm.py --json /tmp/arm.json

Figures: bench/README.md ("Issue 27: tick evaluation"). Benchmarks are not tests: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from contextful.engine.control.arm import ArmedEntry, ArmedSet, Due, History
from contextful.engine.control.schedule import parse_schedule

from bench import records

US = 1_000_000
TICK_US = 500_000
T0 = 1_767_225_600 * US  # 2026-01-01T00:00:00Z
CRON = ("* * * * *", "*/5 * * * *", "0 * * * *", "15,45 9-17 * * MON-FRI", "30 12 * * *")
TARGET_MS = {1_000: 5.0, 10_000: 50.0}


def entries(count: int, seed: int) -> tuple[list[ArmedEntry], list[int]]:
    """The armed entries and each one's last run start."""
    rng = random.Random(seed)
    made, starts = [], []
    for i in range(count):
        text = CRON[i % len(CRON)] if i % 10 == 0 else f"every {rng.randint(1, 3600)}s"
        made.append(ArmedEntry(f"p{i:05d}", parse_schedule(text, f"p{i:05d}"), rng.randint(-1, 1)))
        starts.append(T0 - rng.randint(1, 3600) * US)
    return made, starts


def ours(armed_entries: list[ArmedEntry], starts: list[int], ticks: int) -> dict[str, Any]:
    armed = ArmedSet(armed_entries, armed_us=T0)
    for entry, start in zip(armed_entries, starts):
        armed.update(entry.id, History(start, None))
    evaluation, tick_total, fired = [], [], 0
    for k in range(ticks):
        now = T0 + k * TICK_US
        t0 = time.perf_counter()
        due = armed.due(now)
        armed.next_due_us()
        t1 = time.perf_counter()
        for d in due:
            armed.update(d.id, History(starts[int(d.id[1:])], now))
        t2 = time.perf_counter()
        evaluation.append(t1 - t0)
        tick_total.append(t2 - t0)
        fired += len(due)
    return {"evaluation": evaluation, "tick": tick_total, "fired": fired}


def scan(armed_entries: list[ArmedEntry], starts: list[int], ticks: int) -> dict[str, Any]:
    """The peer: every entry's next fire in a dict, scanned whole at each tick."""
    schedules = {e.id: e.schedule for e in armed_entries}
    priority = {e.id: e.priority for e in armed_entries}
    reference = {e.id: s for e, s in zip(armed_entries, starts)}
    fires = {e.id: e.schedule.next_after(s) for e, s in zip(armed_entries, starts)}
    evaluation, tick_total, fired = [], [], 0
    for k in range(ticks):
        now = T0 + k * TICK_US
        t0 = time.perf_counter()
        due = sorted((Due(i, f, priority[i], reference[i]) for i, f in fires.items() if f <= now),
                     key=Due.admission_key)
        min(fires.values())
        t1 = time.perf_counter()
        for d in due:
            reference[d.id] = now
            fires[d.id] = schedules[d.id].next_after(now)
        t2 = time.perf_counter()
        evaluation.append(t1 - t0)
        tick_total.append(t2 - t0)
        fired += len(due)
    return {"evaluation": evaluation, "tick": tick_total, "fired": fired}


def summarize(series: str, count: int, measured: dict[str, Any], ratio_to: dict[str, Any] | None) -> dict[str, Any]:
    # The first tick is the arming burst (every entry whose next fire passed is due at once); the
    # figures below are the ticks after it, with the burst reported on its own.
    ms = {key: sorted(1000 * t for t in measured[key][1:]) for key in ("evaluation", "tick")}
    record: dict[str, Any] = {
        "series": series, "rows": count, "ticks": len(ms["tick"]), "fired": measured["fired"],
        "seconds": round(statistics.median(measured["tick"][1:]), 7),
        "arming_tick_ms": round(1000 * measured["tick"][0], 3),
        "evaluation_p50_ms": round(statistics.median(ms["evaluation"]), 4),
        "evaluation_p99_ms": round(ms["evaluation"][int(0.99 * len(ms["evaluation"]))], 4),
        "tick_p50_ms": round(statistics.median(ms["tick"]), 4),
        "tick_p99_ms": round(ms["tick"][int(0.99 * len(ms["tick"]))], 4),
        "tick_max_ms": round(ms["tick"][-1], 4),
    }
    if ratio_to is not None:
        record["ratio_to"] = f"scan of {count:,}"
        record["ratio"] = round(statistics.median(measured["tick"][1:]) / statistics.median(ratio_to["tick"][1:]), 4)
        record["target"] = f"tick p99 under {TARGET_MS[count]:g} ms" if count in TARGET_MS else None
        record["met"] = record["tick_p99_ms"] < TARGET_MS[count] if count in TARGET_MS else None
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", default="1000,10000", help="comma-separated armed-set sizes")
    parser.add_argument("--ticks", type=int, default=7_200, help="500 ms ticks (7,200: an hour)")
    parser.add_argument("--quick", action="store_true", help="720 ticks")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    ticks = 720 if args.quick else args.ticks
    found = []
    for count in (int(n) for n in args.entries.split(",")):
        armed_entries, starts = entries(count, seed=27)
        peer = scan(armed_entries, starts, ticks)
        mine = ours(armed_entries, starts, ticks)
        assert mine["fired"] == peer["fired"], (mine["fired"], peer["fired"])
        found += [summarize("scan", count, peer, None), summarize("armed set", count, mine, peer)]
        for record in found[-2:]:
            print(f"{count:>6,} entries {record['series']:>9}: {ticks:,} ticks, {record['fired']:,} fired; "
                  f"evaluation p50 {record['evaluation_p50_ms']:.4f} ms p99 {record['evaluation_p99_ms']:.4f} ms; "
                  f"tick p50 {record['tick_p50_ms']:.4f} ms p99 {record['tick_p99_ms']:.4f} ms "
                  f"max {record['tick_max_ms']:.3f} ms; arming tick {record['arming_tick_ms']:.1f} ms" + (f"; ratio {record['ratio']}" if "ratio" in record else ""))
    if args.json:
        records.write(args.json, "arm", found, ticks=ticks)


if __name__ == "__main__":
    main()
