"""The landing benchmark: ``contextful pipeline run`` against the raw pyarrow path on the same shards.

Run ``python bench/bench_pipeline.py [--quick] [--events N] [--shards K] [--reps R] [--json PATH]``.

GitHub-archive-like events (``datasets.gharchive.write_shards``, plain NDJSON, default 1,000,000
events in 10 shards, about 1.2 GB; ``--quick``: 100,000 events) are generated once into a work
directory under the temp dir (deleted at the end). Then, side by side, interleaved (A B, B A, ...):

- ``ours``: a fresh project directory whose ``contextful.toml`` declares one ``files`` pipeline over
  the shards (nested, no types), and ``python -m engine.cli --project DIR pipeline run`` as a real
  child process on a fresh store each rep; after the first rep the landed row count is checked
  (``contextful --json sql "SELECT count(*) ..."``) to equal N.
- ``raw``: the fastest raw path in one child process: for each shard ``pyarrow.json.read_json`` +
  ``pyarrow.parquet.write_table(..., compression="zstd")``.

Both sides are child processes timed by wall clock from spawn to exit (so both pay an interpreter
start and their imports). Throughput is input MB (10^6 bytes of NDJSON) per second; the ratio is
ours / raw throughput (target >= 0.6).

Peak RSS: a sampler thread polls ``/proc`` every 20 ms for the side's whole process tree (for ours:
the CLI process, the decoder fork server and the decoder child of the moment) and records the peak
of the summed ``VmRSS``. Pages a forked decoder child still shares with its fork server count twice,
so the sum is an upper bound. Also shown: the largest single process of the tree
(``getrusage(RUSAGE_CHILDREN).ru_maxrss`` reported by a wrapper process around each rep; the
kernel folds a waited-for grandchild's peak into its parent's children figure). Target: the whole
run under 2 GiB.

A second, smaller figure: decoder-only throughput, ``Decoder().decode`` over one shard (batches
consumed and dropped) vs in-process ``pyarrow.json.read_json`` over the same file.

Figures: ``bench/README.md``. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import records

FULL = {"events": 1_000_000, "shards": 10, "reps": 3, "decode_reps": 3}
QUICK = {"events": 100_000, "shards": 10, "reps": 3, "decode_reps": 3}
TABLE = "events"
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.02

# A wrapper around one rep's command: it runs the command, then reports the largest resident set
# of any process in the command's tree (RUSAGE_CHILDREN: the max over every waited-for descendant).
WRAPPER = (
    "import json, resource, subprocess, sys\n"
    "proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
    "rc = proc.returncode\n"
    "if rc:\n"
    "    sys.stderr.write(proc.stderr[-4000:])\n"
    "ru = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(json.dumps({'rc': rc, 'maxrss_kib': ru.ru_maxrss}), flush=True)\n"
)


# --- the process-tree sampler -------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(c) for c in fh.read().split())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0


def tree_rss(root: int) -> int:
    """Summed resident bytes of ``root`` and all its descendants (the wrapper itself included)."""
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += _rss(pid)
        stack.extend(_children(pid))
    return total


class TreeSampler:
    """Polls a process tree's summed RSS every 20 ms in a thread; ``peak`` is the largest sum seen."""

    def __init__(self, root: int) -> None:
        self.root, self.peak = root, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.root))
            self._stop.wait(SAMPLE_S)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def timed_tree(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` under the wrapper: wall seconds, peak summed tree RSS, largest single process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *argv], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    # the sum includes the wrapper's own small interpreter (about 10 MiB): an upper bound
    sampler = TreeSampler(proc.pid)
    out, _ = proc.communicate()
    elapsed = time.perf_counter() - t0
    peak = sampler.stop()
    report = json.loads(out.strip().splitlines()[-1])
    if report["rc"] != 0 or proc.returncode != 0:
        raise RuntimeError(f"{argv} exited with {report['rc']}")
    return {"seconds": elapsed, "tree_peak_bytes": peak, "max_process_bytes": report["maxrss_kib"] * 1024}


# --- the sides ----------------------------------------------------------------------------------


MANIFEST = """\
[project]
name = "bench-landing"

[[pipeline]]
id = "{table}"
table = "{table}"
normalize = "{mode}"

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["{glob}"]
"""


def make_project(path: str, shard_dir: str, mode: str = "nested") -> str:
    """A fresh project at ``path`` with one ``files`` pipeline over the shards, in ``mode``."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    with open(os.path.join(path, "contextful.toml"), "w") as fh:
        fh.write(MANIFEST.format(table=TABLE, mode=mode, glob=os.path.join(shard_dir, "events-*.ndjson")))
    return path


def ours_argv(project: str) -> list[str]:
    return [sys.executable, "-m", "contextful.engine.cli", "--project", project, "pipeline", "run"]


def raw_argv(shards: list[str], out_dir: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--raw-side", out_dir, *shards]


def raw_side(out_dir: str, shards: list[str]) -> None:
    """The fastest raw path: read each shard whole with pyarrow's JSON reader, write it as zstd Parquet."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    for i, path in enumerate(shards):
        table = pj.read_json(path)
        pq.write_table(table, os.path.join(out_dir, f"part-{i:05d}.parquet"), compression="zstd")


def landed_rows(project: str) -> int:
    proc = subprocess.run([sys.executable, "-m", "contextful.engine.cli", "--project", project, "--json", "sql",
                           f"SELECT count(*) AS n FROM {TABLE}"], capture_output=True, text=True, cwd=REPO,
                          check=True)
    doc = json.loads(proc.stdout)
    rows = doc["rows"] if isinstance(doc, dict) and "rows" in doc else doc
    first = rows[0]
    return int(first["n"] if isinstance(first, dict) else first[0])


# --- the benchmarks -----------------------------------------------------------------------------


def mb(n: float) -> float:
    return n / 1e6


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def bench_landing(work: str, shard_dir: str, shards: list[str], events: int, reps: int) -> dict[str, Any]:
    size = sum(os.path.getsize(p) for p in shards)
    print(f"landing: {events:,} events in {len(shards)} NDJSON shards ({mb(size):.0f} MB), {reps} reps,"
          f" sides interleaved, each a child process")
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "raw": []}
    for rep in range(reps):
        order = ["ours", "raw"] if rep % 2 == 0 else ["raw", "ours"]
        for side in order:
            target = os.path.join(work, f"{side}-rep")
            shutil.rmtree(target, ignore_errors=True)
            if side == "ours":
                argv = ours_argv(make_project(target, shard_dir))
            else:
                argv = raw_argv(shards, target)
            os.sync()  # no dirty pages of the other side written back on this side's time
            run = timed_tree(argv)
            runs[side].append(run)
            print(f"  rep {rep + 1} {side:>4}: {run['seconds']:.2f} s  ({mb(size) / run['seconds']:.0f} MB/s)"
                  f"  tree peak RSS {mib(run['tree_peak_bytes'])}, largest process {mib(run['max_process_bytes'])}",
                  flush=True)
            if side == "ours" and rep == 0:
                n = landed_rows(target)
                assert n == events, f"landed {n} rows, not {events}"
                print(f"  check: landed {n:,} rows = {events:,} events")
            shutil.rmtree(target, ignore_errors=True)
    med = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
    thr = {side: mb(size) / s for side, s in med.items()}
    ratio = thr["ours"] / thr["raw"]
    pairs = [r["seconds"] / o["seconds"] for o, r in zip(runs["ours"], runs["raw"])]
    peak = {side: max(r["tree_peak_bytes"] for r in rs) for side, rs in runs.items()}
    largest = {side: max(r["max_process_bytes"] for r in rs) for side, rs in runs.items()}
    for side in runs:
        print(f"  {side:>4}: median {med[side]:.2f} s = {thr[side]:.0f} MB/s of input;"
              f" peak RSS (tree sum) {mib(peak[side])}, largest process {mib(largest[side])}")
    print(f"  ratio ours/raw throughput = {ratio:.2f} (pairwise median {statistics.median(pairs):.2f};"
          f" target >= 0.6: {'met' if ratio >= 0.6 else 'MISSED'})")
    print(f"  ours peak RSS {mib(peak['ours'])} (target < 2 GiB:"
          f" {'met' if peak['ours'] < 2 * 2**30 else 'MISSED'})")
    return {"events": events, "shards": len(shards), "input_mb": round(mb(size), 1), "input_bytes": size,
            "median_s": {k: round(v, 3) for k, v in med.items()},
            "mb_per_s": {k: round(v, 1) for k, v in thr.items()},
            "ratio": round(ratio, 3), "ratio_pairwise": round(statistics.median(pairs), 3),
            "peak_rss_tree_mib": {k: round(v / 2**20, 1) for k, v in peak.items()},
            "largest_process_mib": {k: round(v / 2**20, 1) for k, v in largest.items()},
            "target_ratio_met": ratio >= 0.6, "target_rss_met": peak["ours"] < 2 * 2**30}


def bench_decode(shard: str, reps: int) -> dict[str, Any]:
    import pyarrow.json as pj
    from contextful.engine.land.decode import Decoder

    size = os.path.getsize(shard)
    print(f"decode: one shard {os.path.basename(shard)} ({mb(size):.0f} MB), {reps} reps after a warm-up,"
          f" sides interleaved, in this process")

    with Decoder() as decoder:
        def ours() -> int:
            return sum(b.num_rows for b in decoder.decode(shard, "ndjson"))

        def raw() -> int:
            return pj.read_json(shard).num_rows

        sides = {"ours": ours, "raw": raw}
        counts = {name: fn() for name, fn in sides.items()}  # warm-up (page cache, fork server imports)
        assert counts["ours"] == counts["raw"], f"decoded {counts['ours']} rows, read_json {counts['raw']}"
        times: dict[str, list[float]] = {name: [] for name in sides}
        for rep in range(reps):
            for name in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
                t0 = time.perf_counter()
                sides[name]()
                times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    thr = {name: mb(size) / s for name, s in med.items()}
    ratio = thr["ours"] / thr["raw"]
    for name, ts in times.items():
        print(f"  {name:>4}: median {med[name]:.2f} s = {thr[name]:.0f} MB/s  runs {', '.join(f'{t:.2f}' for t in ts)}")
    print(f"  ratio decoder/read_json throughput = {ratio:.2f}")
    return {"shard_mb": round(mb(size), 1), "rows": counts["raw"], "median_s": {k: round(v, 3) for k, v in med.items()},
            "mb_per_s": {k: round(v, 1) for k, v in thr.items()}, "ratio": round(ratio, 3)}


def pipeline_records(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The results as bench/records.py records: the landing's two sides, the decoder's two sides."""
    out: list[dict[str, Any]] = []
    if "landing" in results:
        r = results["landing"]
        for side, series in (("ours", "contextful-nested"), ("raw", "pyarrow")):
            out.append({"series": series, "shape": "events", "rows": r["events"], "input_bytes": r["input_bytes"],
                        "seconds": r["median_s"][side], "mb_per_s": r["mb_per_s"][side],
                        "peak_rss_bytes": r["peak_rss_tree_mib"][side] * 2**20, "ratio_to": "pyarrow",
                        "ratio": r["ratio"] if side == "ours" else 1.0}
                       | ({"target": ">= 0.6", "met": r["target_ratio_met"]} if side == "ours" else {}))
    if "decode" in results:
        r = results["decode"]
        for side, series in (("ours", "decoder"), ("raw", "read_json in-process")):
            out.append({"series": series, "rows": r["rows"], "seconds": r["median_s"][side],
                        "mb_per_s": r["mb_per_s"][side], "ratio_to": "read_json in-process",
                        "ratio": r["ratio"] if side == "ours" else 1.0})
    return out


# --- driver -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 events, for a smoke run")
    parser.add_argument("--events", type=int, help="events to generate (default 1,000,000; --quick 100,000)")
    parser.add_argument("--shards", type=int, help="NDJSON shards (default 10)")
    parser.add_argument("--reps", type=int, help="timed reps per side (default 3)")
    parser.add_argument("--only", default="landing,decode", help="comma-separated: landing, decode")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--workdir", default=None, help="where shards and stores go (default: the temp dir)")
    parser.add_argument("--raw-side", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw_side:
        raw_side(args.raw_side[0], args.raw_side[1:])
        return 0

    from contextful.datasets.gharchive import write_shards

    size = dict(QUICK if args.quick else FULL)
    for key in ("events", "shards", "reps"):
        if getattr(args, key):
            size[key] = getattr(args, key)
    only = {n.strip() for n in args.only.split(",") if n.strip()}
    work = tempfile.mkdtemp(prefix="bench-pipeline-", dir=args.workdir)
    results: dict[str, Any] = {"quick": args.quick}
    try:
        shard_dir = os.path.join(work, "raw")
        t0 = time.perf_counter()
        shards = [str(p) for p in write_shards(size["events"], shard_dir, shards=size["shards"], seed=1, gzip=False)]
        print(f"generated {size['events']:,} events in {len(shards)} shards"
              f" ({mb(sum(os.path.getsize(p) for p in shards)):.0f} MB) in {time.perf_counter() - t0:.1f} s",
              flush=True)
        if "landing" in only:
            results["landing"] = bench_landing(work, shard_dir, shards, size["events"], size["reps"])
        if "decode" in only:
            results["decode"] = bench_decode(shards[0], size["decode_reps"])
            results["decode"]["peak_rss_mib_self"] = round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(results), flush=True)
    if args.json:
        records.write(args.json, "pipeline", pipeline_records(results), **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
