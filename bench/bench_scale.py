"""Scale: 10,000,000 events landed with bounded memory and linear time (issue 17, outside the suite).

Run ``python bench/bench_scale.py --data DIR [--quick] [--events N] [--base N] [--keep] [--json PATH]``.

Writes ``--events`` gharchive-like events (:mod:`datasets.gharchive`, seed 1; default 10,000,000,
about 12 GB of NDJSON) as shards of ``--base // 10`` events each under ``--data DIR`` (about 25 GB
free wanted for the shards and the landed store; deleted at the end unless ``--keep``, and reused
when a kept run left the same ones). Then two child processes, each timed from spawn to exit with
the peak RSS of its process tree (``bench_pipeline.timed_tree``): ``contextful pipeline run``
(nested ``files`` pipeline) over the first ``--base`` events (default 1,000,000: the first ten
shards), then over all of them, each into a fresh project. ``--quick``: 100,000 against 10,000.

Targets: the whole run's tree peak under 2 GiB, and its time within 11x the base run's (10x the
events: cost grows linearly, not worse). Figures: ``bench/README.md``. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.bench_pipeline import MANIFEST, TABLE, landed_rows, mb, mib, ours_argv, timed_tree

PEAK_TARGET = 2 << 30
TIME_TARGET = 11.0


def shards_for(events: int, base: int, data: str) -> list[str]:
    """``events`` events in shards of ``base // 10`` under ``data``, generated unless already there."""
    from contextful.datasets.gharchive import write_shards

    directory = os.path.join(data, f"events-{events}-{base}-seed1")
    done = os.path.join(directory, "DONE")
    if not os.path.exists(done):
        t0 = time.perf_counter()
        shutil.rmtree(directory, ignore_errors=True)
        write_shards(events, directory, shards=events // (base // 10), seed=1, gzip=False)
        with open(done, "w") as fh:
            fh.write("ok\n")
        print(f"generated {events:,} events in {time.perf_counter() - t0:.0f} s", flush=True)
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.startswith("events-"))


def land(project: str, shards: list[str], rows: int) -> dict[str, Any]:
    """One ``pipeline run`` over exactly ``shards`` (a glob naming only them) into a fresh project."""
    shutil.rmtree(project, ignore_errors=True)
    os.makedirs(project)
    link_dir = os.path.join(project, "inputs")
    os.makedirs(link_dir)
    for path in shards:
        os.symlink(path, os.path.join(link_dir, os.path.basename(path)))
    with open(os.path.join(project, "contextful.toml"), "w") as fh:
        fh.write(MANIFEST.format(table=TABLE, mode="nested", glob=os.path.join(link_dir, "events-*.ndjson")))
    size = sum(os.path.getsize(p) for p in shards)
    os.sync()
    run = timed_tree(ours_argv(project))
    landed = landed_rows(project)
    assert landed == rows, f"landed {landed} rows, not {rows}"
    print(f"  {rows:>11,} events ({mb(size):,.0f} MB): {run['seconds']:.1f} s ({mb(size) / run['seconds']:.1f} MB/s),"
          f" tree peak {mib(run['tree_peak_bytes'])}", flush=True)
    return {"rows": rows, "input_bytes": size, "seconds": round(run["seconds"], 3),
            "peak_rss_bytes": run["tree_peak_bytes"], "largest_process_bytes": run["max_process_bytes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--data", required=True, help="where the shards and stores go (not a tmpfs)")
    parser.add_argument("--quick", action="store_true", help="100,000 events against 10,000")
    parser.add_argument("--events", type=int, help="events of the large run (default 10,000,000)")
    parser.add_argument("--base", type=int, help="events of the base run (default 1,000,000)")
    parser.add_argument("--keep", action="store_true", help="keep the generated shards")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    events = args.events or (100_000 if args.quick else 10_000_000)
    base = args.base or (10_000 if args.quick else 1_000_000)
    if base % 10 or events % (base // 10):
        parser.error("--base must be a multiple of 10 and --events a multiple of --base / 10")

    os.makedirs(args.data, exist_ok=True)
    shards = shards_for(events, base, args.data)
    per = base // 10
    try:
        base_run = land(os.path.join(args.data, "project-base"), shards[:10], base)
        shutil.rmtree(os.path.join(args.data, "project-base"))
        large = land(os.path.join(args.data, "project-large"), shards, len(shards) * per)
        shutil.rmtree(os.path.join(args.data, "project-large"))
    finally:
        if not args.keep:
            shutil.rmtree(os.path.join(args.data, f"events-{events}-{base}-seed1"), ignore_errors=True)
    growth = large["seconds"] / base_run["seconds"]
    print(f"time {growth:.2f}x the base run's for {events // base}x the events (target <= {TIME_TARGET:g}x):"
          f" {'met' if growth <= TIME_TARGET else 'MISSED'}; peak {mib(large['peak_rss_bytes'])}"
          f" (target < 2 GiB): {'met' if large['peak_rss_bytes'] < PEAK_TARGET else 'MISSED'}", flush=True)
    records = [{"series": "contextful-nested", "shape": "gharchive", **base_run},
               {"series": "contextful-nested", "shape": "gharchive", **large, "ratio_to": "base", "ratio": round(growth, 3),
                "target": TIME_TARGET, "target_met": growth <= TIME_TARGET,
                "peak_target_bytes": PEAK_TARGET, "peak_target_met": large["peak_rss_bytes"] < PEAK_TARGET}]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"bench": "scale", "date": datetime.date.today().isoformat(),
                       "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
                       "records": records}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
