"""``python -m bench report``: run every benchmark's quick form and write ``bench/report/``.

Each ``bench/bench_*.py`` runs as a child process, one after another (never two at once: they
would measure each other), with ``--quick`` (or the small arguments in ``QUICK_ARGS`` for a
benchmark without that option; ``--full``: no arguments) and ``--json`` when it has that option.
Their documents (bench/records.py's shape) are kept in ``OUT/json/``; from them
``OUT/README.md`` (bench/summary.py) and the PNG charts (bench/charts.py) are written. A
benchmark whose dependency is missing (dlt, Polars, pyiceberg, PostgreSQL's server binaries) is
skipped with a line saying why; without matplotlib the charts are skipped the same way.

    python -m bench report                      # every benchmark, quick forms, into bench/report/
    python -m bench report --only sizes,fixed   # just those two
    python -m bench report --no-run             # redraw from the documents already in OUT/json/

A run of some benchmarks (``--only``) replaces their pages and keeps the others' from their latest
run (``OUT/json/outcomes.json`` records how each went; each page says its own date).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import charts, records, summary

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
# benchmarks without a --quick option: arguments that make a run of a few seconds to a minute
QUICK_ARGS = {
    "gateway": ["--rows", "100000", "--reps", "3"],
    "iceberg": ["--rows", "100000", "--reps", "3"],
    "models": ["--rows", "1000000", "--parts", "4", "--reps", "2"],
    "supersede": ["--units", "25000", "--changed", "2500", "--reps", "3"],
    # its shards and stores go under the temp dir and are deleted after the run
    "scale": ["--quick", "--data", os.path.join(tempfile.gettempdir(), "contextful-bench-scale")],
}
# what a benchmark imports that the base install does not bring
NEEDS_MODULES = {"relational": ("dlt",), "sizes": ("dlt", "polars"), "iceberg": ("pyiceberg",),
                 "gateway": ("pyiceberg",)}
NEEDS_POSTGRES = ("store", "journal")  # each starts its own server from Debian's binaries
QUICK_TIMEOUT_S = 900
OUTCOMES = "outcomes.json"  # in OUT/json: how each benchmark's latest run went


def discover() -> list[str]:
    """The benchmark names (``bench_X.py`` -> ``X``), sorted."""
    return sorted(os.path.basename(p)[len("bench_"):-len(".py")] for p in glob.glob(os.path.join(BENCH_DIR, "bench_*.py")))


def missing(name: str) -> str:
    """Why ``name`` cannot run here, or an empty string."""
    absent = [m for m in NEEDS_MODULES.get(name, ()) if importlib.util.find_spec(m) is None]
    if absent:
        return f"{', '.join(absent)} not installed (`pip install -e '.[bench]'`)"
    if name in NEEDS_POSTGRES and not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        return "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin)"
    return ""


def writes_json(name: str) -> bool:
    """Whether ``bench_NAME.py`` has a ``--json`` option (its source declares one)."""
    with open(os.path.join(BENCH_DIR, f"bench_{name}.py")) as fh:
        return '"--json"' in fh.read()


def run_one(name: str, full: bool, json_path: str) -> summary.Outcome:
    """Run one benchmark as a child process; its outcome (and its document at ``json_path``, if any)."""
    path = os.path.join(BENCH_DIR, f"bench_{name}.py")
    documented = writes_json(name)
    args = [] if full else QUICK_ARGS.get(name, ["--quick"])
    shown = " ".join(["python", f"bench/bench_{name}.py", *args])
    why = missing(name)
    if why:
        return summary.Outcome(name, shown, status="skipped", why=why)
    argv = [sys.executable, path, *args] + (["--json", json_path] if documented else [])
    if os.path.exists(json_path):
        os.remove(json_path)
    print(f"report: {shown}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, check=False, cwd=REPO, capture_output=True, text=True,
                              timeout=None if full else QUICK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return summary.Outcome(name, shown, time.perf_counter() - t0, status="failed",
                               why=f"timed out after {QUICK_TIMEOUT_S} s")
    seconds = time.perf_counter() - t0
    print(f"report: {name} exited {proc.returncode} after {seconds:.0f} s", flush=True)
    printed = [] if documented else summary.summary_lines(proc.stdout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return summary.Outcome(name, shown, seconds, status="failed", why=f"exit {proc.returncode}: {last}",
                               printed=printed)
    return summary.Outcome(name, shown, seconds, printed=printed)


def load(json_dir: str) -> tuple[list[summary.Outcome], dict[str, dict[str, Any]]]:
    """The outcomes of the latest run of each benchmark and the documents they left in ``json_dir``."""
    outcomes: list[summary.Outcome] = []
    path = os.path.join(json_dir, OUTCOMES)
    if os.path.exists(path):
        with open(path) as fh:
            outcomes = [summary.Outcome(**o) for o in json.load(fh)]
    docs = {}
    for o in outcomes:
        path = os.path.join(json_dir, f"{o.name}.json")
        if os.path.exists(path):
            with open(path) as fh:
                docs[o.name] = json.load(fh)
    return outcomes, docs


def save(json_dir: str, ran: list[summary.Outcome]) -> None:
    """Record ``ran`` over the outcomes already kept: a run of some benchmarks leaves the others' pages."""
    kept = {o.name: o for o in load(json_dir)[0]}
    kept.update((o.name, o) for o in ran)
    with open(os.path.join(json_dir, OUTCOMES), "w") as fh:
        json.dump([dataclasses.asdict(kept[name]) for name in sorted(kept)], fh, indent=1)


def write(out_dir: str, outcomes: list[summary.Outcome], docs: dict[str, dict[str, Any]], quick: bool,
          load_avg: tuple[float, float] | None, date: str | None = None, machine: str | None = None) -> str:
    """Draw the charts and write ``out_dir/README.md``; the README's path."""
    os.makedirs(out_dir, exist_ok=True)
    if importlib.util.find_spec("matplotlib") is None:
        drawn = {name: "not drawn: matplotlib not installed (`pip install -e '.[bench]'`)"
                 for name in ("throughput", "memory", "fixed-cost")}
    else:
        drawn = charts.draw_all(out_dir, docs)
    text = summary.render(date or datetime.date.today().isoformat(), machine or records.machine(), load_avg,
                          quick, outcomes, docs, drawn)
    path = os.path.join(out_dir, "README.md")
    with open(path, "w") as fh:
        fh.write(text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench report", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated benchmark names (bench_X.py -> X)")
    parser.add_argument("--skip", help="comma-separated benchmark names to leave out")
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "report"), help="where to write (default bench/report)")
    parser.add_argument("--full", action="store_true", help="run the full forms (minutes each)")
    parser.add_argument("--no-run", action="store_true", help="only redraw from the documents in OUT/json")
    args = parser.parse_args(argv)
    names = discover()
    unknown = [n for n in (args.only or "").split(",") + (args.skip or "").split(",") if n and n not in names]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(names)})")
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    if args.skip:
        names = [n for n in names if n not in args.skip.split(",")]
    json_dir = os.path.join(args.out, "json")
    os.makedirs(json_dir, exist_ok=True)
    start_load = os.getloadavg()[0]
    ran = [] if args.no_run else [run_one(n, args.full, os.path.join(json_dir, f"{n}.json")) for n in names]
    save(json_dir, ran)
    outcomes, docs = load(json_dir)
    load_avg = None if args.no_run else (start_load, os.getloadavg()[0])  # a redraw measured no load
    path = write(args.out, outcomes, docs, not args.full, load_avg)
    print(f"report: wrote {path}")
    return 1 if any(o.status == "failed" for o in ran) else 0
