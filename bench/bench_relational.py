"""Relational landing: ``contextful pipeline run`` (normalize = "relational") vs dlt vs the raw path.

Run ``python bench/bench_relational.py [--quick] [--events N] [--shards K] [--reps R] [--dlt-reps R] [--json PATH]``
(needs the ``bench`` extra: ``pip install -e '.[bench]'`` installs dlt).

The same GitHub-archive-like NDJSON shards (``datasets.gharchive.write_shards``, default 1,000,000
events in 10 shards) are landed, each side a child process timed from spawn to exit:

- ``ours``: ``python -m engine.cli pipeline run`` over a project declaring one ``files`` pipeline in
  ``relational`` mode (root table plus one child table per list, secret guard on);
- ``dlt``: a dlt pipeline (PyPI ``dlt``) with the ``filesystem`` destination writing Parquet, fed by
  a resource yielding each NDJSON line's object; dlt normalizes nested lists into child tables too;
- ``raw``: ``pyarrow.json.read_json`` + ``pyarrow.parquet.write_table`` per shard (no normalization).

Throughput is MB (10^6 bytes) of NDJSON input per second. Targets (issue 4): ours >= 10x dlt, and
ours / raw >= 0.4. After the first rep the landed relational row counts are printed.

A third figure (``--only read``): a keyed relational root's child table read. The shards land
in-process into a pipeline keyed on ``id``, then half of them land again under other names (every
event there re-landed: two versions per key); ``events__payload__commits`` is then read with its
lifetime rule (``storage.follows``: the rows of the root row version the root answers) and as the
plain keyed merge over the same parts (the rule dropped), interleaved, and the ratio printed with
the landing's seconds. Against a checkout without the rule, both reads are the plain one.

A second figure: the secret guard alone (``engine.guard.guard_table``) over the decoded shards,
in MB/s of string data, and its share of the landing time (target <= 15%).

Figures: ``bench/README.md``. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import bench_pipeline, records
from bench.bench_pipeline import mb, mib, ours_argv, raw_argv, timed_tree

TABLE = "events"


def make_project(path: str, shard_dir: str) -> str:
    return bench_pipeline.make_project(path, shard_dir, mode="relational")


def dlt_argv(shards: list[str], out_dir: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--dlt-side", out_dir, *shards]


def dlt_side(out_dir: str, shards: list[str]) -> None:
    """dlt's own path: a resource of dicts, normalized by dlt, loaded as Parquet files."""
    import dlt

    os.environ["DLT_DATA_DIR"] = os.path.join(out_dir, "dlt-data")
    os.environ["RUNTIME__LOG_LEVEL"] = "WARNING"

    @dlt.resource(name=TABLE, write_disposition="append")
    def events() -> Any:
        for path in shards:
            with open(path, "rb") as fh:
                for line in fh:
                    if line.strip():
                        yield json.loads(line)

    pipeline = dlt.pipeline(pipeline_name="bench", destination=dlt.destinations.filesystem(
        bucket_url=os.path.join(out_dir, "lake")), dataset_name="bench", pipelines_dir=os.path.join(out_dir, "p"))
    pipeline.run(events(), loader_file_format="parquet")


def relational_counts(project: str) -> dict[str, int]:
    proc = subprocess.run([sys.executable, "-m", "contextful.engine.cli", "--project", project, "--json", "table", "list"],
                          capture_output=True, text=True, cwd=REPO, check=True)
    return {t["table"]: t["rows_stored"] for t in json.loads(proc.stdout)}


def bench_landing(work: str, shard_dir: str, shards: list[str], events: int, reps: int,
                  dlt_reps: int) -> dict[str, Any]:
    size = sum(os.path.getsize(p) for p in shards)
    print(f"relational landing: {events:,} events in {len(shards)} NDJSON shards ({mb(size):.0f} MB)")
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "raw": [], "dlt": []}
    for rep in range(max(reps, dlt_reps)):
        sides = [s for s, n in (("ours", reps), ("raw", reps), ("dlt", dlt_reps)) if rep < n]
        for side in sides if rep % 2 == 0 else list(reversed(sides)):
            target = os.path.join(work, f"{side}-rep")
            shutil.rmtree(target, ignore_errors=True)
            argv = (ours_argv(make_project(target, shard_dir)) if side == "ours"
                    else raw_argv(shards, target) if side == "raw" else dlt_argv(shards, target))
            os.sync()
            run = timed_tree(argv)
            runs[side].append(run)
            print(f"  rep {rep + 1} {side:>4}: {run['seconds']:.2f} s ({mb(size) / run['seconds']:.1f} MB/s),"
                  f" tree peak RSS {mib(run['tree_peak_bytes'])}", flush=True)
            if side == "ours" and rep == 0:
                print(f"  landed: {relational_counts(target)}")
            shutil.rmtree(target, ignore_errors=True)
    med = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items() if rs}
    thr = {side: mb(size) / s for side, s in med.items()}
    out: dict[str, Any] = {"events": events, "input_mb": round(mb(size), 1), "input_bytes": size,
                           "median_s": {k: round(v, 2) for k, v in med.items()},
                           "mb_per_s": {k: round(v, 2) for k, v in thr.items()},
                           "peak_rss_tree_mib": {k: round(max(r["tree_peak_bytes"] for r in rs) / 2**20)
                                                 for k, rs in runs.items() if rs}}
    if "dlt" in thr:
        out["ours_over_dlt"] = round(thr["ours"] / thr["dlt"], 1)
        print(f"  ours / dlt = {out['ours_over_dlt']}x (target >= 10x:"
              f" {'met' if out['ours_over_dlt'] >= 10 else 'MISSED'})")
    out["ours_over_raw"] = round(thr["ours"] / thr["raw"], 3)
    print(f"  ours / raw = {out['ours_over_raw']} (target >= 0.4: {'met' if out['ours_over_raw'] >= 0.4 else 'MISSED'})")
    return out


def bench_guard(work: str, shard_dir: str, shards: list[str]) -> dict[str, Any]:
    """The guard alone over each decoded shard as the landing sees it (whole batches), and its share
    of the landing time: the same in-process relational landing of the shards, guard on and off."""
    import pyarrow as pa
    import pyarrow.json as pj
    from contextful.engine.config import load_manifest
    from contextful.engine.guard import guard_table
    from contextful.engine.land import sink
    from contextful.engine.run.units import run_pipelines
    from contextful.storage import Store

    seconds, string_bytes = 0.0, 0
    for path in shards:
        table = pj.read_json(path).combine_chunks()
        string_bytes += _string_bytes(table, pa)
        t0 = time.perf_counter()
        guard_table(table)
        seconds += time.perf_counter() - t0
    rate = mb(string_bytes) / seconds
    project = make_project(os.path.join(work, "guard-share"), shard_dir)
    manifest = load_manifest(project)
    timings: dict[bool, list[float]] = {True: [], False: []}
    original = sink.LandingSink.__init__
    for guard in (True, False, True, False, True, False):
        def init(self: Any, *args: Any, _guard: bool = guard, **kwargs: Any) -> None:
            kwargs["guard"] = _guard
            original(self, *args, **kwargs)

        sink.LandingSink.__init__ = init  # type: ignore[method-assign]
        shutil.rmtree(os.path.join(project, ".contextful"), ignore_errors=True)
        with Store.open(os.path.join(project, ".contextful", "store")) as store:
            t0 = time.perf_counter()
            run_pipelines(store, manifest)
            timings[guard].append(time.perf_counter() - t0)
        sink.LandingSink.__init__ = original  # type: ignore[method-assign]
    on, off = statistics.median(timings[True]), statistics.median(timings[False])
    share = (on - off) / on
    print(f"guard alone: {mb(string_bytes):.0f} MB of strings in {seconds:.2f} s = {rate:.0f} MB/s (target >= 100)")
    print(f"landing in-process, guard on {on:.2f} s / off {off:.2f} s: the guard is {share:.1%} of landing"
          f" time (target <= 15%: {'met' if share <= 0.15 else 'MISSED'})")
    return {"string_mb": round(mb(string_bytes), 1), "seconds": round(seconds, 2), "mb_per_s": round(rate),
            "landing_on_s": round(on, 2), "landing_off_s": round(off, 2), "share_of_landing": round(share, 3)}


def _string_bytes(table: Any, pa: Any) -> int:
    total = 0

    def walk(array: Any) -> None:
        nonlocal total
        t = array.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            total += array.buffers()[2].size if array.buffers()[2] is not None else 0
        elif pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(array.field(i))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            walk(array.values)

    for column in table.columns:
        for chunk in column.chunks:
            walk(chunk)
    return total


def bench_read(work: str, shard_dir: str, shards: list[str], reps: int) -> dict[str, Any]:
    """The lifetime rule's read cost against the plain keyed merge of the same child table parts."""
    import dataclasses

    from contextful.engine.config import load_manifest
    from contextful.engine.run.units import run_pipelines
    from contextful.storage import Store
    from contextful.storage.snapshot import snapshot_sql

    project = os.path.join(work, "keyed")
    os.makedirs(project)
    with open(os.path.join(project, "contextful.toml"), "w") as fh:
        keyed = bench_pipeline.MANIFEST.replace('normalize = "{mode}"\n', 'normalize = "{mode}"\nprimary_key = ["id"]\n')
        fh.write(keyed.format(table=TABLE, mode="relational", glob=os.path.join(shard_dir, "*.ndjson")))
    manifest = load_manifest(project)
    with Store.open(os.path.join(project, ".contextful", "store")) as store:
        t0 = time.perf_counter()
        run_pipelines(store, manifest)
        landing = time.perf_counter() - t0
        for path in shards[: max(1, len(shards) // 2)]:  # every event of these lands again: a second version
            shutil.copy(path, os.path.join(shard_dir, "again-" + os.path.basename(path)))
        run_pipelines(store, manifest)
        child = store.table(f"{TABLE}__payload__commits")
        ruled = child.snapshot()
        plain = (dataclasses.replace(ruled, follows=None, root=None) if hasattr(ruled, "follows") else ruled)
        con = store.duckdb()
        try:
            queries = {name: f"SELECT count(*), sum(_cf_list_idx), max(sha), max(message) FROM ({snapshot_sql(snap, con)})"
                       for name, snap in (("plain", plain), ("ruled", ruled))}
            times: dict[str, list[float]] = {name: [] for name in queries}
            answers = {}
            for _ in range(reps + 1):
                for name, sql in queries.items():
                    start = time.perf_counter()
                    answers[name] = con.execute(sql).fetchall()[0]
                    times[name].append(time.perf_counter() - start)
        finally:
            con.close()
    med = {name: statistics.median(t[1:]) for name, t in times.items()}
    ratio = med["ruled"] / med["plain"]
    print(f"keyed relational landing (in process): {landing:.2f} s; {TABLE}__payload__commits stores"
          f" {ruled.rows_stored:,} rows, answers {answers['ruled'][0]:,} (plain merge {answers['plain'][0]:,})")
    print(f"  read with the lifetime rule {med['ruled']:.3f} s, plain keyed merge {med['plain']:.3f} s: ratio {ratio:.2f}")
    return {"landing_s": round(landing, 2), "rows_stored": ruled.rows_stored, "answered": answers["ruled"][0],
            "ruled_s": round(med["ruled"], 4), "plain_s": round(med["plain"], 4), "ratio": round(ratio, 3)}


def relational_records(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The results as bench/records.py records: one per landing side, one for the guard's share."""
    out: list[dict[str, Any]] = []
    if "landing" in results:
        r = results["landing"]
        for side, series in (("ours", "contextful-relational"), ("raw", "pyarrow"), ("dlt", "dlt")):
            if side not in r["median_s"]:
                continue
            record = {"series": series, "shape": "events", "rows": r["events"], "input_bytes": r["input_bytes"],
                      "seconds": r["median_s"][side], "mb_per_s": r["mb_per_s"][side],
                      "peak_rss_bytes": r["peak_rss_tree_mib"][side] * 2**20, "ratio_to": "pyarrow",
                      "ratio": round(r["mb_per_s"][side] / r["mb_per_s"]["raw"], 3)}
            if side == "ours":
                record |= {"target": ">= 0.4", "met": r["ours_over_raw"] >= 0.4}
            out.append(record)
        if "ours_over_dlt" in r:
            out.append({"series": "contextful-relational / dlt", "rows": r["events"], "ratio_to": "dlt",
                        "ratio": r["ours_over_dlt"], "target": ">= 10", "met": r["ours_over_dlt"] >= 10})
    if "read" in results:
        r = results["read"]
        out.append({"series": "child table read with the lifetime rule", "rows": r["rows_stored"],
                    "seconds": r["ruled_s"], "ratio_to": "plain keyed merge", "ratio": r["ratio"]})
    if "guard" in results:
        g = results["guard"]
        out.append({"series": "guard share of landing", "seconds": g["landing_on_s"], "mb_per_s": g["mb_per_s"],
                    "ratio_to": "landing time", "ratio": g["share_of_landing"], "target": "<= 0.15",
                    "met": g["share_of_landing"] <= 0.15})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events in 4 shards")
    parser.add_argument("--events", type=int, help="events (default 1,000,000; --quick 100,000)")
    parser.add_argument("--shards", type=int, help="shards (default 10; --quick 4)")
    parser.add_argument("--reps", type=int, default=3, help="reps of ours and raw")
    parser.add_argument("--dlt-reps", type=int, default=1, help="reps of dlt (slow)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--only", default="landing,guard,read", help="comma-separated: landing, guard, read")
    parser.add_argument("--dlt-side", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.events = args.events or (100_000 if args.quick else 1_000_000)
    args.shards = args.shards or (4 if args.quick else 10)
    if args.dlt_side:
        dlt_side(args.dlt_side[0], args.dlt_side[1:])
        return 0
    from contextful.datasets.gharchive import write_shards

    work = tempfile.mkdtemp(prefix="cf-bench-rel-", dir=args.workdir)
    try:
        shard_dir = os.path.join(work, "shards")
        write_shards(args.events, shard_dir, shards=args.shards, seed=11)
        shards = sorted(os.path.join(shard_dir, f) for f in os.listdir(shard_dir))
        results: dict[str, Any] = {}
        if "landing" in args.only:
            results["landing"] = bench_landing(work, shard_dir, shards, args.events, args.reps, args.dlt_reps)
        if "guard" in args.only:
            results["guard"] = bench_guard(work, shard_dir, shards)
        if "read" in args.only:
            results["read"] = bench_read(work, shard_dir, shards, args.reps)
        if args.json:
            records.write(args.json, "relational", relational_records(results), **results)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
