"""A command's fixed cost: what `contextful` pays before and around its work, against the interpreter's.

A data engineer's everyday run is small and frequent (a few new files every few minutes, a cron
``--cycle``), so the start-up of a command weighs more than its throughput. Each command below is
timed as a user runs it — a child process from spawn to exit — interleaved with the yardstick
``python -c "import pyarrow"`` (A B A B …), and its ratio taken pair by pair, medians over reps.

Commands, on a project with one ``files`` pipeline over GitHub-archive-like events that has landed
once (so the store, its catalog and one table exist):

- ``python -c pass``: the interpreter alone (the floor);
- ``contextful --help``, ``contextful pipeline validate``, ``contextful sql "SELECT count(*) …"``;
- ``contextful pipeline run`` with nothing new (target: within 2x the yardstick);
- ``contextful pipeline run`` landing one new 1 MB file (target: under 0.5 s more than the no-op run);
- ``contextful export status`` and ``contextful export run`` with the source unchanged, on an
  ``[[export]]`` of a small table loaded once (``table load``; the pipeline's table changes every
  rep) and published once (issue 28; target: each within 2x the no-op ``pipeline run``, the ratio
  taken pair by pair against it as well).

The package's bytecode is compiled first (``compileall``), as an installed wheel has it: a
checkout run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise recompile every module per
command and time the compiler. Where the time goes: one more run of each command under
``python -X importtime``, its import time summed per top-level package (``pyarrow`` counts numpy
with it), and the rest of the wall time (less the interpreter's start) called work.

    python bench/bench_fixed.py            # 15 reps of each
    python bench/bench_fixed.py --quick    # 5 reps
    python bench/bench_fixed.py --json /tmp/fixed.json
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import records as documents

BASELINE = "python -c 'import pyarrow'"
ONE_MB_EVENTS = 850  # GitHub-archive-like events: about 1.0 MB of NDJSON
GROUPS = {"pyiceberg": "pyiceberg", "numpy": "pyarrow", "pyarrow": "pyarrow", "duckdb": "duckdb", "_duckdb": "duckdb", "polars": "polars",
          "pandas": "pandas", "fsspec": "fsspec", "contextful": "contextful", "click": "click"}


def contextful_argv(*args: str) -> list[str]:
    """The ``contextful`` console script beside this interpreter (as a user runs it), else ``-m``."""
    script = Path(sys.executable).with_name("contextful")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "contextful.engine.cli"]
    return [*head, *args]


LAUNCHER = r"""
import json, os, sys, time
for line in sys.stdin:
    job = json.loads(line)
    os.chdir(job["cwd"])
    with open(job["stderr"], "wb") as err:
        started = time.perf_counter()
        pid = os.posix_spawn(job["argv"][0], job["argv"], dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
        _, status, usage = os.wait4(pid, 0)
    print(json.dumps({"wall": time.perf_counter() - started, "exit": os.waitstatus_to_exitcode(status),
                      "cpu": usage.ru_utime + usage.ru_stime, "maxrss_kib": usage.ru_maxrss}), flush=True)
"""


class Launcher:
    """Runs each timed command from a small process of its own. A child's peak RSS as the kernel
    reports it starts at its parent's (the exec records the old image's high-water mark), and this
    process holds pyarrow and the data generator: spawned from here, every command would read
    ~190 MiB. The launcher is a bare interpreter (~10 MiB), started before anything heavy loads."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        fd, self.stderr = tempfile.mkstemp(prefix="bench-fixed-stderr-")
        os.close(fd)

    def timed(self, argv: list[str]) -> tuple[float, float, int]:
        """Wall seconds spawn to exit, CPU seconds and peak RSS (bytes) of one run of ``argv``, in
        the current directory."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "cwd": os.getcwd(), "stderr": self.stderr}) + "\n")
        self.proc.stdin.flush()
        done = json.loads(self.proc.stdout.readline())
        if done["exit"] != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done['exit']}): {Path(self.stderr).read_text()[-2000:]}")
        return done["wall"], done["cpu"], done["maxrss_kib"] * 1024

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()
        os.unlink(self.stderr)


def import_breakdown(argv: list[str]) -> dict[str, float]:
    """Seconds of import per package group in one run of ``argv`` under ``-X importtime``."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    groups: dict[str, float] = defaultdict(float)
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        head, _cumulative, name = line.split("|", 2)
        try:
            self_us = int(head.split(":")[1])
        except ValueError:  # the header line
            continue
        top = name.strip().split(".")[0]
        groups[GROUPS.get(top, "other")] += self_us / 1e6
    return dict(groups)


def make_project(work: Path, events: int) -> Path:
    """bench_pipeline's project (one nested ``files`` pipeline over ``work/in/events-*.ndjson``)."""
    from contextful.datasets import gharchive

    from bench.bench_pipeline import make_project as landing_project

    gharchive.write_shards(events, work / "in", shards=1, seed=7)
    project = Path(landing_project(str(work / "project"), str(work / "in")))
    with (project / "contextful.toml").open("a") as fh:
        fh.write(EXPORT)
    return project


EXPORT = """
[[export]]
name = "events_out"
source = "users"
namespace = "bi"
credential = "analysts"
"""
NOOP_RUN = "contextful pipeline run (nothing new)"
EXPORTS = ("contextful export status", "contextful export run (nothing new)")


def new_input(project: Path, serial: int) -> None:
    """One more ~1 MB input (``events-new-NNNN.ndjson`` beside the others) for the next run to land."""
    from contextful.datasets import gharchive

    staging = project.parent / f"staging-{serial}"
    gharchive.write_shards(ONE_MB_EVENTS, staging, shards=1, seed=1000 + serial)
    for path in staging.iterdir():
        path.rename(project.parent / "in" / f"events-new-{serial:04d}-{path.name}")
    staging.rmdir()


def measure(reps: int, launcher: Launcher) -> list[dict[str, object]]:
    compileall.compile_dir(REPO / "engine", quiet=1)
    for package in ("storage", "iceberg", "datasets", "contextful"):
        compileall.compile_dir(REPO / package, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="bench-fixed-"))
    try:
        project = make_project(work, ONE_MB_EVENTS)
        os.chdir(project)  # every command runs in the project (posix_spawn takes no working directory)
        subprocess.run(contextful_argv("pipeline", "run"), check=True, capture_output=True)
        (project / "users.csv").write_text("id,name\n" + "".join(f"{i},user {i}\n" for i in range(100)))
        subprocess.run(contextful_argv("table", "load", "users", "users.csv", "--primary-key", "id"), check=True,
                       capture_output=True)
        subprocess.run(contextful_argv("export", "run"), check=True, capture_output=True)
        baseline = [sys.executable, "-c", "import pyarrow"]
        commands: dict[str, list[str]] = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "contextful --help": contextful_argv("--help"),
            "contextful pipeline validate": contextful_argv("pipeline", "validate"),
            "contextful sql": contextful_argv("sql", "SELECT count(*) FROM events"),
            "contextful pipeline run (nothing new)": contextful_argv("pipeline", "run"),
            "contextful pipeline run (one 1 MB file)": contextful_argv("pipeline", "run"),
            "contextful export status": contextful_argv("export", "status"),
            "contextful export run (nothing new)": contextful_argv("export", "run"),
        }
        samples: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
        ratios: dict[str, list[float]] = defaultdict(list)
        to_noop: dict[str, list[float]] = defaultdict(list)  # an export command against the no-op run
        serial = 0
        for argv in [baseline, *commands.values()]:  # warm the page cache (a no-op run: nothing is new yet)
            launcher.timed(argv)
        for _ in range(reps):
            for name, argv in commands.items():
                if name.endswith("1 MB file)"):
                    serial += 1
                    new_input(project, serial)
                base = launcher.timed(baseline)
                ours = launcher.timed(argv)
                samples[BASELINE].append(base)
                samples[name].append(ours)
                ratios[name].append(ours[0] / base[0])
                if name in EXPORTS:
                    noop = launcher.timed(commands[NOOP_RUN])
                    to_noop[name].append(ours[0] / noop[0])
        floor = statistics.median(s[0] for s in samples["python -c pass"])
        records: list[dict[str, object]] = []
        for name in [BASELINE, *commands]:
            runs = samples[name]
            wall = statistics.median(r[0] for r in runs)
            record: dict[str, object] = {
                "series": name, "seconds": round(wall, 4), "cpu_seconds": round(statistics.median(r[1] for r in runs), 4),
                "peak_rss_bytes": max(r[2] for r in runs), "reps": len(runs)}
            if name in ratios:
                record.update(ratio_to="python -c 'import pyarrow'", ratio=round(statistics.median(ratios[name]), 3))
            if name in to_noop:
                record["ratio_to_noop_run"] = round(statistics.median(to_noop[name]), 3)
            if name.startswith("contextful"):
                if name.endswith("1 MB file)"):  # a fresh input for the breakdown's own run
                    serial += 1
                    new_input(project, serial)
                imports = import_breakdown(commands[name])
                record["imports_seconds"] = {k: round(v, 4) for k, v in sorted(imports.items())}
                record["work_seconds"] = round(max(0.0, wall - floor - sum(imports.values())), 4)
            records.append(record)
        return records
    finally:
        os.chdir(REPO)
        shutil.rmtree(work, ignore_errors=True)


def targets(records: list[dict[str, object]]) -> list[dict[str, object]]:
    """Issue 17's two fixed-cost targets and issue 28's export ones, as measured."""
    by = {r["series"]: r for r in records}
    noop = by[NOOP_RUN]
    one = by["contextful pipeline run (one 1 MB file)"]
    ratio = float(noop["ratio"])  # type: ignore[arg-type]
    extra = float(one["seconds"]) - float(noop["seconds"])  # type: ignore[arg-type]
    return [{"target": "pipeline run with nothing new, ratio to python -c 'import pyarrow' <= 2",
             "value": ratio, "met": ratio <= 2},
            {"target": "pipeline run landing one 1 MB file, seconds more than the no-op run < 0.5",
             "value": round(extra, 3), "met": extra < 0.5}] + [
            {"target": f"{name} within 2x the no-op pipeline run", "value": by[name]["ratio_to_noop_run"],
             "met": float(by[name]["ratio_to_noop_run"]) <= 2} for name in EXPORTS]  # type: ignore[arg-type]


def summary(records: list[dict[str, object]]) -> str:
    lines = [("| command | median wall s | cpu s | ratio to `import pyarrow` | ratio to no-op `pipeline run` "
              "| peak RSS MiB | imports s (by package) |"),
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in records:
        imports = r.get("imports_seconds") or {}
        spelled = ", ".join(f"{k} {v:.3f}" for k, v in sorted(imports.items(), key=lambda kv: -kv[1])) \
            if isinstance(imports, dict) else ""
        lines.append(f"| `{r['series']}` | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | {r.get('ratio', '—')} | "
                     f"{r.get('ratio_to_noop_run', '—')} | {int(r['peak_rss_bytes']) / 2**20:.0f} | {spelled} |")  # type: ignore[call-overload]
    lines.append("")
    lines += [f"{t['target']}: {t['value']} ({'met' if t['met'] else 'MISSED'})" for t in targets(records)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 reps instead of 15")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    args = parser.parse_args()
    reps = args.reps or (5 if args.quick else 15)
    launcher = Launcher()  # before anything heavy is imported here
    try:
        records = measure(reps, launcher)
    finally:
        launcher.close()
    print(summary(records))
    if args.json is not None:
        documents.write(str(args.json), "fixed", records, targets=targets(records))


if __name__ == "__main__":
    main()
