"""Remote workers' overhead per landing step: the same tiny landing steps on 3 local workers vs in-process.

``python bench/bench_workers.py [--steps 1000] [--quick] [--json PATH]`` builds a scratch project
of 10 tiny ``files`` pipelines (one 3-row NDJSON input each; every step after the first of a
pipeline lands nothing new, as a scheduled step mostly does), then runs ``--steps`` landing
steps twice in the same run:

- **in-process**: ``run_landing_step`` on one open store, step after step, as a worker lands each;
- **workers**: the same steps submitted through serve's relay (``engine.control.relay``) to 3
  ``contextful worker serve`` processes on loopback, 10 at a time (one per pipeline, as distinct
  steps of concurrent units run), each journaled (``engine.control.attempts``), signed, heartbeaten
  and answered with a signed callback.

It prints both wall times and the overhead per step (workers minus in-process, divided by the
step count), and with ``--json`` writes a bench/records.py document. Absolute times are noise on a
shared machine; the ratio and the per-step overhead are the figures (bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench.records, run as a script
PIPELINES = 10
KEY = "bench-worker-key-" + "x" * 32


def _project(root: Path, relay: str) -> None:
    blocks = []
    for n in range(PIPELINES):
        (root / f"p{n}").mkdir(parents=True, exist_ok=True)
        (root / f"p{n}" / "a.ndjson").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(3)))
        blocks.append(f'[[pipeline]]\nid = "p{n}"\nprimary_key = ["id"]\n[pipeline.source]\nkind = "files"\n'
                      f'[pipeline.source.config]\npaths = ["p{n}/*.ndjson"]\n')
    (root / "contextful.toml").write_text(f'[project]\nname = "bench"\n[control]\nrelay = "{relay}"\n\n'
                                          + "\n".join(blocks))


def _cli(root: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "contextful.engine.cli", "--project", str(root), *args]


def in_process(root: Path, steps: int) -> float:
    from contextful.engine.control.arming import load_armable
    from contextful.engine.project import open_project_store
    from contextful.engine.run.units import run_landing_step

    manifest, _ = load_armable(root, 1)
    with open_project_store(root, create=True) as store:
        started = time.perf_counter()
        for n in range(steps):
            result = run_landing_step(store, manifest, f"p{n % PIPELINES}")
            assert result.ok, result.failures
        return time.perf_counter() - started


def on_workers(root: Path, relay_url: str, steps: int) -> float:
    from contextful.engine.config.control import read_control
    from contextful.engine.control.relay import serve_relay
    from contextful.engine.control.worker_key import WorkerKey
    from contextful.engine.project import open_project_store

    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | {"CONTEXTFUL_WORKER_KEY": KEY}
    workers = [subprocess.Popen(_cli(root, "worker", "serve", "--http", "127.0.0.1:0"), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=env) for _ in range(3)]
    try:
        urls = [w.stdout.readline().split()[-1] for w in workers if w.stdout is not None]
        control = read_control(root)[1]
        from dataclasses import replace

        store = open_project_store(root, create=True)  # the relay journals its attempts there, as serve's does
        relay, face = serve_relay(replace(control, workers=tuple(urls)), WorkerKey(KEY.encode()), store)
        try:
            started = time.perf_counter()
            for first in range(0, steps, PIPELINES):
                batch = [relay.submit(f"bench-{n}", f"p{n % PIPELINES}", 1)
                         for n in range(first, min(steps, first + PIPELINES))]
                assert relay.wait_for(lambda: all(r.closed.is_set() for r in batch), 600)  # noqa: B023
                assert all(r.ok for r in batch), [r.result for r in batch if not r.ok]
            return time.perf_counter() - started
        finally:
            face.shutdown(5)
            store.close()
    finally:
        for w in workers:
            w.terminate()
            w.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_workers")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="100 steps")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    steps = 100 if args.quick else args.steps
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        relay = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with tempfile.TemporaryDirectory(prefix="contextful-bench-workers-") as scratch:
        root = Path(scratch)
        _project(root, relay)
        subprocess.run(_cli(root, "pipeline", "import"), check=True, capture_output=True)
        local = in_process(root, steps)
        remote = on_workers(root, relay, steps)
    import resource

    per_step_ms = (remote - local) / steps * 1000
    rss = {who: resource.getrusage(which).ru_maxrss // 1024
           for who, which in (("bench", resource.RUSAGE_SELF), ("largest worker", resource.RUSAGE_CHILDREN))}
    print(f"{steps} steps: in-process {local:.2f} s, 3 workers {remote:.2f} s, ratio {remote / local:.2f}x, "
          f"overhead {per_step_ms:.1f} ms per step; peak RSS {rss['bench']} MiB (bench), "
          f"{rss['largest worker']} MiB (largest worker)")
    if args.json:
        from bench.records import write

        write(args.json, "workers", [
            {"series": "in-process", "rows": steps, "seconds": local},
            {"series": "3 workers", "rows": steps, "seconds": remote, "ratio_to": "in-process",
             "ratio": remote / local, "overhead_ms_per_step": per_step_ms}], peak_rss_mib=rss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
