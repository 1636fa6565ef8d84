"""History benchmarks: the read path's cost against the number of commits, and automatic compaction.

Run ``python bench/bench_history.py [--quick] [--only NAME,...] [--json PATH]``. Each benchmark
runs in a child process of its own; inside it both sides run on the same store, interleaved.

- ``connect``: a store whose table ``t`` received N one-row commits (one ``Store.append`` each,
  the default compaction policy on), measured at N = 1,000 / 10,000 / 100,000 (``--quick``:
  1,000 / 5,000) as the same store grows. Ours: ``engine.read.connect(root)`` + ``SELECT count(*)
  FROM t`` (what ``contextful sql`` does after its imports); raw: ``duckdb.connect()`` + a view over
  ``read_parquet`` of the same live part files + the same count. Measured in a fresh child process
  per N, after imports, median of 7 interleaved repetitions; the ratio is ours / raw, and the
  target is an absolute 50 ms for ours at 100,000 commits.
- ``query``: the table of the largest N (built one row per commit, compacted by the policy) against
  the same rows landed as one part, through the same snapshot view; ratio = ours / one part, target
  <= 1.5. Also shown: the table of the smallest N built with the policy off.
- ``commit``: one-row appends on the SQLite catalog (``durable=True``) with the policy on and off,
  on two stores, interleaved; p50, p99 and mean of each, ratios on / off.

The stores of ``connect`` and ``query`` are built on ``/dev/shm`` when it exists (``--workdir``
overrides; building 100,000 commits takes most of the full run). Figures: ``bench/README.md``.
Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

BENCHMARKS = ("connect", "query", "commit")
FULL = {"sizes": [1_000, 10_000, 100_000], "commits": 2_000, "reps": 7, "query_reps": 15}
QUICK = {"sizes": [1_000, 5_000], "commits": 300, "reps": 5, "query_reps": 7}
QUERY = "SELECT count(*), sum(v), count(DISTINCT s), max(id) FROM t"


def row(i: int) -> Any:
    import pyarrow as pa

    return pa.table({"id": pa.array([i], pa.int64()), "v": pa.array([i * 0.5]), "s": pa.array([f"s-{i % 97}"])})


def build(root: str, start: int, stop: int, policy_on: bool = True) -> float:
    """Append rows ``start..stop`` to table ``t`` one commit each; return the seconds it took."""
    from contextful.storage import Store
    from contextful.storage.compaction import CompactionPolicy, set_policy

    store = Store.open(root, durable=False)
    try:
        if not policy_on:
            set_policy(store, CompactionPolicy(enabled=False))
        t0 = time.perf_counter()
        for i in range(start, stop):
            store.append("t", row(i))
        return time.perf_counter() - t0
    finally:
        store.close()


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


# --- connect ------------------------------------------------------------------------------------


def measure_connect(root: str, reps: int) -> dict[str, Any]:
    """In this (fresh) process, after imports: ours vs raw connect + count, interleaved."""
    import duckdb
    from contextful.engine.read import connect
    from contextful.storage import Store

    with Store.open(root, create=False) as store:
        table = store.table("t")
        files = [store.objects.uri(p.path) for p in store.catalog.live_parts("t", table.head.commit_seq)]
        commits = table.head.commit_seq
    listed = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"

    def ours() -> int:
        con = connect(root)
        try:
            return int(con.sql("SELECT count(*) FROM t").fetchall()[0][0])
        finally:
            con.close()

    def raw() -> int:
        con = duckdb.connect()
        try:
            con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({listed})")
            return int(con.sql("SELECT count(*) FROM t").fetchall()[0][0])
        finally:
            con.close()

    assert ours() == raw()
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for rep in range(reps):
        for name, fn in ((("ours", ours), ("raw", raw)) if rep % 2 else (("raw", raw), ("ours", ours))):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {"commits": commits, "live_parts": len(files), "ours_ms": median_ms(times["ours"]),
            "raw_ms": median_ms(times["raw"]), "pandas_imported": "pandas" in sys.modules}


def bench_connect(work: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    root = os.path.join(work, "history")
    records, built = [], 0
    for size in cfg["sizes"]:
        seconds = build(root, built, size)
        print(f"  built commits {built + 1:,}..{size:,} in {seconds:.1f} s ({seconds / (size - built) * 1000:.2f} ms each)",
              flush=True)
        built = size
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure-connect", root,
                              "--reps", str(cfg["reps"])], capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = got["ours_ms"] / got["raw_ms"]
        print(f"  {size:,} commits ({got['live_parts']} live parts): ours {got['ours_ms']:.1f} ms, raw {got['raw_ms']:.1f} ms,"
              f" ratio {ratio:.2f}; pandas imported: {got['pandas_imported']}", flush=True)
        records.append({"series": "contextful", "shape": "connect+count", "commits": size, "rows": size,
                        "seconds": got["ours_ms"] / 1000, "live_parts": got["live_parts"], "ratio_to": "duckdb",
                        "ratio": round(ratio, 3), "pandas_imported": got["pandas_imported"]})
        records.append({"series": "duckdb", "shape": "connect+count", "commits": size, "rows": size,
                        "seconds": got["raw_ms"] / 1000, "live_parts": got["live_parts"]})
    return records


# --- query --------------------------------------------------------------------------------------


def bench_query(work: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    from contextful.storage import Store
    from contextful.storage.snapshot import snapshot_sql

    size = cfg["sizes"][-1]
    root = os.path.join(work, "history")
    if not os.path.exists(os.path.join(root, "store.json")):
        print(f"  building {size:,} commits ({build(root, 0, size):.1f} s)", flush=True)
    small = cfg["sizes"][0]
    off_root = os.path.join(work, "history-off")
    print(f"  building {small:,} commits with the policy off ({build(off_root, 0, small, policy_on=False):.1f} s)",
          flush=True)
    store, off = Store.open(root, create=False), Store.open(off_root, create=False)
    try:
        data = store.table("t").to_arrow()
        store.append("one_part", data)  # the same rows, one commit, one part
        off_small = off.table("t").to_arrow()
        store.append("one_part_small", off_small)
        con = store.duckdb()
        con.execute("SET enable_progress_bar = false")
        views = {}
        for view, (s, name) in {"ours": (store, "t"), "one_part": (store, "one_part"),
                                "off": (off, "t"), "one_part_small": (store, "one_part_small")}.items():
            snap = s.table(name).snapshot()
            con.execute(f"CREATE VIEW {view} AS {snapshot_sql(snap, con)}")
            views[view] = len(snap.parts)
        answers = {v: con.sql(QUERY.replace("FROM t", f"FROM {v}")).fetchall() for v in views}
        assert answers["ours"] == answers["one_part"] and answers["off"] == answers["one_part_small"]
        times: dict[str, list[float]] = {v: [] for v in views}
        for rep in range(cfg["query_reps"]):
            for v in (list(views) if rep % 2 else list(reversed(views))):
                t0 = time.perf_counter()
                con.sql(QUERY.replace("FROM t", f"FROM {v}")).fetchall()
                times[v].append(time.perf_counter() - t0)
        con.close()
        med = {v: median_ms(ts) for v, ts in times.items()}
        ratio, ratio_off = med["ours"] / med["one_part"], med["off"] / med["one_part_small"]
        print(f"  {size:,} one-row commits, policy on ({views['ours']} parts): {med['ours']:.2f} ms;"
              f" one part {med['one_part']:.2f} ms; ratio {ratio:.2f} (target <= 1.5:"
              f" {'met' if ratio <= 1.5 else 'MISSED'})")
        print(f"  {small:,} one-row commits, policy off ({views['off']} parts): {med['off']:.2f} ms;"
              f" one part {med['one_part_small']:.2f} ms; ratio {ratio_off:.2f}")
        common = {"shape": "query", "ratio_to": "one-part"}
        return [
            {"series": "policy-on", "rows": size, "commits": size, "parts": views["ours"],
             "seconds": med["ours"] / 1000, "ratio": round(ratio, 3), **common},
            {"series": "one-part", "rows": size, "parts": 1, "seconds": med["one_part"] / 1000},
            {"series": "policy-off", "rows": small, "commits": small, "parts": views["off"],
             "seconds": med["off"] / 1000, "ratio": round(ratio_off, 3), **common},
            {"series": "one-part", "rows": small, "parts": 1, "seconds": med["one_part_small"] / 1000},
        ]
    finally:
        store.close()
        off.close()


# --- commit -------------------------------------------------------------------------------------


def bench_commit(work: str, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    from contextful.storage import Store
    from contextful.storage.compaction import CompactionPolicy, set_policy

    disk = tempfile.mkdtemp(prefix="bench-history-commit-")  # a real disk: fsyncs as users pay them
    try:
        stores = {"policy-on": Store.open(os.path.join(disk, "on")), "policy-off": Store.open(os.path.join(disk, "off"))}
        set_policy(stores["policy-off"], CompactionPolicy(enabled=False))
        times: dict[str, list[float]] = {name: [] for name in stores}
        for i in range(cfg["commits"] + 5):
            for name in (list(stores) if i % 2 else list(reversed(stores))):
                t0 = time.perf_counter()
                stores[name].append("t", row(i))
                if i >= 5:
                    times[name].append(time.perf_counter() - t0)
        parts = {name: len(s.table("t").snapshot().parts) for name, s in stores.items()}
        for s in stores.values():
            s.close()
    finally:
        shutil.rmtree(disk, ignore_errors=True)
    stats = {name: {"p50": median_ms(ts), "p99": round(sorted(ts)[int(0.99 * len(ts))] * 1000, 3),
                    "mean": round(statistics.fmean(ts) * 1000, 3)} for name, ts in times.items()}
    on, off = stats["policy-on"], stats["policy-off"]
    print(f"  {cfg['commits']:,} one-row commits each: on p50 {on['p50']:.2f} ms p99 {on['p99']:.2f} mean {on['mean']:.2f}"
          f" ({parts['policy-on']} parts); off p50 {off['p50']:.2f} ms p99 {off['p99']:.2f} mean {off['mean']:.2f}"
          f" ({parts['policy-off']} parts)")
    print(f"  on/off: p50 {on['p50'] / off['p50']:.2f}, p99 {on['p99'] / off['p99']:.2f}, mean {on['mean'] / off['mean']:.2f}")
    return [{"series": name, "shape": "commit", "rows": 1, "commits": cfg["commits"], "seconds": s["p50"] / 1000,
             "p50_ms": s["p50"], "p99_ms": s["p99"], "mean_ms": s["mean"], "parts": parts[name],
             **({"ratio_to": "policy-off", "ratio": round(s["p50"] / off["p50"], 3),
                 "ratio_p99": round(s["p99"] / off["p99"], 3), "ratio_mean": round(s["mean"] / off["mean"], 3)}
                if name == "policy-on" else {})}
            for name, s in stats.items()]


RUNNERS: dict[str, Callable[[str, dict[str, Any]], list[dict[str, Any]]]] = {
    "connect": bench_connect, "query": bench_query, "commit": bench_commit,
}


def default_workdir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated: " + ", ".join(BENCHMARKS))
    parser.add_argument("--json", help="also write the records to this file")
    parser.add_argument("--workdir", default=None, help="where the history stores are built (default /dev/shm)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--measure-connect", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = QUICK if args.quick else FULL
    if args.measure_connect:
        print(json.dumps(measure_connect(args.measure_connect, args.reps)))
        return 0
    if args.child:
        work = args.workdir
        assert work is not None
        found = RUNNERS[args.child](work, cfg)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print("RESULT " + json.dumps([dict(r, bench="history", peak_rss_bytes=peak) for r in found]), flush=True)
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNNERS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    work = tempfile.mkdtemp(prefix="bench-history-", dir=args.workdir or default_workdir())
    records: list[dict[str, Any]] = []
    failed = []
    try:
        for name in names:  # one child per benchmark; query reuses the store connect built
            print(f"{name}:", flush=True)
            argv = [sys.executable, os.path.abspath(__file__), "--child", name, "--workdir", work]
            argv += ["--quick"] if args.quick else []
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("RESULT "):
                    records.extend(json.loads(line[len("RESULT "):]))
                else:
                    print(line, end="", flush=True)
            if proc.wait() != 0:
                failed.append(name)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        doc = {"bench": "history", "date": datetime.date.today().isoformat(),
               "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.system()} {platform.release()},"
                          f" Python {platform.python_version()}", "quick": args.quick, "records": records}
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
