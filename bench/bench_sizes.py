"""Landing at every size: throughput and peak memory against input size, ours beside raw pyarrow,
Polars and dlt on the same shards (issue 17, "small loads").

Run ``python bench/bench_sizes.py [--quick] [--sizes 20000,100000] [--reps R] [--dlt-max N] [--json PATH]``.

For each size, GitHub-archive-like events (``datasets.gharchive.write_shards``, plain NDJSON, seed 1
as in bench_pipeline: with some seeds pyarrow's own ``read_json`` fails on its type inference; 4
shards, or one per 100,000 events above 400,000) are generated once, then five sides land them,
interleaved (the order rotates each rep), each a child process timed from spawn to exit:

- ``contextful-nested``: ``contextful pipeline run`` over a fresh project declaring one ``files``
  pipeline over the shards (``normalize = "nested"``), as bench_pipeline runs it;
- ``contextful-relational``: the same with ``normalize = "relational"``, as bench_relational runs it;
- ``pyarrow``: per shard ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table(zstd)``;
- ``polars``: per shard, as the pyarrow side, ``polars.read_ndjson(path, infer_schema_length=None)``
  + ``write_parquet(zstd)`` (Polars' default inference over the first 100 lines panics on these
  events: a field null in those lines and a string later);
- ``dlt``: bench_relational's dlt side (a resource of dicts, dlt's normalizer, filesystem Parquet);
  skipped above ``--dlt-max`` events (default 300,000: a million takes dlt about two minutes a rep;
  ``--quick``: 20,000, since 100,000 events take it 25 s to over a minute a rep on a loaded machine).

Small runs are where a run's fixed cost (interpreter, imports, the decoder's fork server, the
store's commit) shows, so the figures at 20,000 and 100,000 events are the issue's two small-load
targets: relational at least 15x dlt at 20,000 events, nested at least 0.9x raw pyarrow at 100,000.
Peak RSS is bench_pipeline's sampled tree sum (the largest over the reps).

Before timing, the repository's modules are compiled to bytecode (``compileall``): an environment
with ``PYTHONDONTWRITEBYTECODE=1`` (this machine's) otherwise makes every CLI run compile about a
hundred modules from source (1.0 s of a 12.5 s relational run of 20,000 events, profiled under
load), which an installed wheel never pays and which pyarrow, Polars and dlt, installed from
wheels, do not pay here either. Children still read the cache under that setting. Sizes: full 20,000 /
100,000 / 300,000 / 1,000,000 events; ``--quick`` 5,000 / 20,000 / 100,000.

Figures: ``bench/README.md``. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import records
from bench.bench_pipeline import make_project, mb, mib, ours_argv, raw_argv, timed_tree
from bench.bench_relational import dlt_argv

FULL = [20_000, 100_000, 300_000, 1_000_000]
QUICK = [5_000, 20_000, 100_000]
SIDES = ("contextful-nested", "contextful-relational", "pyarrow", "polars", "dlt")
SMALL_RELATIONAL = (20_000, 15.0)  # events, at least this many times dlt's throughput
SMALL_NESTED = (100_000, 0.9)  # events, at least this fraction of raw pyarrow's throughput


def precompile() -> None:
    """Write the bytecode cache of the repository's packages (see the module docstring for why)."""
    for package in ("contextful", "engine", "storage", "iceberg", "datasets"):
        compileall.compile_dir(os.path.join(REPO, package), quiet=1)


def shard_count(events: int) -> int:
    """Four shards as a few new files would arrive; archive-sized inputs in 100,000-event shards."""
    return 4 if events <= 400_000 else events // 100_000


def polars_argv(shards: list[str], out_dir: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--polars-side", out_dir, *shards]


def polars_side(out_dir: str, shards: list[str]) -> None:
    """Polars' own path: each shard read whole (schema inferred over every line), written as zstd Parquet."""
    import polars as pl

    os.makedirs(out_dir, exist_ok=True)
    for i, path in enumerate(shards):
        pl.read_ndjson(path, infer_schema_length=None).write_parquet(
            os.path.join(out_dir, f"part-{i:05d}.parquet"), compression="zstd")


def side_argv(side: str, target: str, shard_dir: str, shards: list[str]) -> list[str]:
    if side == "contextful-nested":
        return ours_argv(make_project(target, shard_dir, mode="nested"))
    if side == "contextful-relational":
        return ours_argv(make_project(target, shard_dir, mode="relational"))
    if side == "pyarrow":
        return raw_argv(shards, target)
    if side == "polars":
        return polars_argv(shards, target)
    return dlt_argv(shards, target)


def bench_size(work: str, events: int, reps: int, sides: list[str]) -> list[dict[str, Any]]:
    """Land ``events`` events with every side, interleaved; one record per side (medians over reps)."""
    from contextful.datasets.gharchive import write_shards

    shard_dir = os.path.join(work, f"shards-{events}")
    shards = [str(p) for p in write_shards(events, shard_dir, shards=shard_count(events), seed=1, gzip=False)]
    size = sum(os.path.getsize(p) for p in shards)
    print(f"{events:,} events in {len(shards)} NDJSON shards ({mb(size):.1f} MB), {reps} reps, sides: {', '.join(sides)}",
          flush=True)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for rep in range(reps):
        for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
            target = os.path.join(work, "side")
            shutil.rmtree(target, ignore_errors=True)
            argv = side_argv(side, target, shard_dir, shards)
            os.sync()  # no dirty pages of the previous side written back on this side's time
            run = timed_tree(argv)
            runs[side].append(run)
            print(f"  rep {rep + 1} {side:>21}: {run['seconds']:6.2f} s ({mb(size) / run['seconds']:6.1f} MB/s),"
                  f" tree peak RSS {mib(run['tree_peak_bytes'])}", flush=True)
            shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(shard_dir, ignore_errors=True)
    return size_records(events, size, len(shards), {side: [r["seconds"] for r in rs] for side, rs in runs.items()},
                        {side: max(r["tree_peak_bytes"] for r in rs) for side, rs in runs.items()})


def size_records(events: int, size: int, shards: int, reps: dict[str, list[float]],
                 peaks: dict[str, int]) -> list[dict[str, Any]]:
    """One record per side: median seconds and throughput, and its throughput ratios to pyarrow and
    dlt both as the ratio of medians and as the median of each rep's ratio (the sides of one rep ran
    within one pass, so on a machine whose load changes between reps the pairwise figure is the
    steadier one).

    >>> found = size_records(10, 1000, 1, {"pyarrow": [1.0, 3.0, 2.0], "dlt": [4.0, 6.0, 6.0]}, {"pyarrow": 1, "dlt": 2})
    >>> [(r["series"], r["ratio"], r["ratio_pairwise"]) for r in found]
    [('pyarrow', 1.0, 1.0), ('dlt', 0.333, 0.333)]
    """
    seconds = {side: statistics.median(ts) for side, ts in reps.items()}

    def pairwise(peer: str, side: str) -> float:
        return statistics.median(p / s for p, s in zip(reps[peer], reps[side]))

    out = []
    for side, ts in reps.items():
        record: dict[str, Any] = {
            "series": side, "shape": "events", "rows": events, "input_bytes": size, "shards": shards,
            "seconds": round(seconds[side], 3), "mb_per_s": round(mb(size) / seconds[side], 2),
            "peak_rss_bytes": peaks[side], "reps": [round(t, 3) for t in ts], "ratio_to": "pyarrow",
            "ratio": round(seconds["pyarrow"] / seconds[side], 3), "ratio_pairwise": round(pairwise("pyarrow", side), 3)}
        if "dlt" in seconds and side != "dlt":
            record["ratio_to_dlt"] = round(seconds["dlt"] / seconds[side], 2)
            record["ratio_to_dlt_pairwise"] = round(pairwise("dlt", side), 2)
        out.append(record)
    return out


def targets(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's two small-load targets, from the records of the sizes that were run."""
    by = {(r["series"], r["rows"]): r for r in found}
    out = []
    events, least = SMALL_RELATIONAL
    record = by.get(("contextful-relational", events))
    if record and "ratio_to_dlt" in record:
        out.append({"target": f"{events:,} events relational >= {least:g}x dlt", "value": record["ratio_to_dlt"],
                    "pairwise": record["ratio_to_dlt_pairwise"], "met": record["ratio_to_dlt"] >= least})
    events, least = SMALL_NESTED
    record = by.get(("contextful-nested", events))
    if record:
        out.append({"target": f"{events:,} events nested >= {least:g}x raw pyarrow", "value": record["ratio"],
                    "pairwise": record["ratio_pairwise"], "met": record["ratio"] >= least})
    return out


def print_table(found: list[dict[str, Any]]) -> None:
    print(f"{'side':>22} {'events':>10} {'MB':>8} {'median s':>9} {'MB/s':>7} {'x pyarrow':>9} {'x dlt':>7} {'peak RSS':>9}")
    for r in found:
        print(f"{r['series']:>22} {r['rows']:>10,} {mb(r['input_bytes']):>8.1f} {r['seconds']:>9.2f} {r['mb_per_s']:>7.1f}"
              f" {r['ratio']:>9.2f} {r.get('ratio_to_dlt', '-'):>7} {mib(r['peak_rss_bytes']):>9}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 / 20,000 / 100,000 events")
    parser.add_argument("--sizes", help="comma-separated event counts (overrides the defaults)")
    parser.add_argument("--reps", type=int, help="timed reps per side and size (default 3)")
    parser.add_argument("--dlt-max", type=int, help="skip dlt above this many events (default 300,000; --quick 20,000)")
    parser.add_argument("--only", help="comma-separated sides (default: all five)")
    parser.add_argument("--json", help="also write the records to this file")
    parser.add_argument("--workdir", default=None, help="where shards and stores go (default: the temp dir)")
    parser.add_argument("--polars-side", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.polars_side:
        polars_side(args.polars_side[0], args.polars_side[1:])
        return 0
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else QUICK if args.quick else FULL
    reps = args.reps or 3
    dlt_max = args.dlt_max or (20_000 if args.quick else 300_000)
    chosen = [s for s in SIDES if not args.only or s in args.only.split(",")]
    if "pyarrow" not in chosen:
        chosen.append("pyarrow")  # every ratio is to the raw side of the same run
    found: list[dict[str, Any]] = []
    skipped: list[str] = []
    precompile()
    work = tempfile.mkdtemp(prefix="bench-sizes-", dir=args.workdir)
    t0 = time.perf_counter()
    try:
        for events in sizes:
            sides = [s for s in chosen if s != "dlt" or events <= dlt_max]
            if len(sides) < len(chosen):
                skipped.append(f"dlt at {events:,} events (above --dlt-max {dlt_max:,})")
            found.extend(bench_size(work, events, reps, sides))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"all sizes in {time.perf_counter() - t0:.0f} s")
    print_table(found)
    met = targets(found)
    for t in met:
        print(f"target {t['target']}: {t['value']} (pairwise {t['pairwise']}; {'met' if t['met'] else 'MISSED'})")
    for note in skipped:
        print(f"skipped: {note}")
    if args.json:
        records.write(args.json, "sizes", found, targets=met, skipped=skipped, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
