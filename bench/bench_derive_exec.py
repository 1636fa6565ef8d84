"""Engine-child overhead per unit: ``run_chain`` against a bare ``subprocess.run`` of the same script.

Run ``python bench/bench_derive_exec.py [--units N] [--quick] [--json PATH]``.

The engine is a no-op script (``python -I -S noop.py {input}`` printing ``{"status": "empty"}``,
the engine output protocol's answer for a unit with nothing to derive) over one local media file.
Sides, interleaved (A B A B ...), timed per unit:

- ``run_chain``: :func:`contextful.engine.derive.exec.run_chain` with a binding whose ``env`` is
  empty: the media check, placeholder substitution, the child in its own process group under a
  cleared environment, the ``poll`` loop over stdout, stderr and the pidfd, the group kill and reap;
- ``subprocess.run``: ``subprocess.run(argv, capture_output=True, env={}, cwd=workdir)`` of the
  same argv (the same cleared environment, so the child's own start-up is the same).

Also shown: ``subprocess.run`` with ``start_new_session=True`` (the process group of its own that
``run.exec.no-shell`` requires; the child calls ``setsid``), and the same sides with ``/bin/true`` as the engine, where the child's start-up is small
and the executor's own cost shows. Reported: medians and p90 per unit, the ratio run_chain /
subprocess.run (no target set by the issue; recorded to watch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import records

SERIES = {"run_chain": "run_chain", "subprocess.run": "subprocess.run", "+session": "subprocess.run +session"}
NOOP = 'import sys\nsys.stdout.write(\'{"status": "empty"}\\n\')\n'


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def ratios(figures: dict[str, tuple[float, float]], peer: str) -> dict[str, Any]:
    """run_chain's ratio to ``peer``: p50's, and p90's beside."""
    (ours_p50, ours_p90), (peer_p50, peer_p90) = figures["run_chain"], figures[peer]
    return {"ratio_to": SERIES[peer], "ratio": round(ours_p50 / peer_p50, 3),
            "ratio_p90": round(ours_p90 / peer_p90, 3)}


def exec_records(label: str, units: int, figures: dict[str, tuple[float, float]]) -> list[dict[str, Any]]:
    """One record per side (latencies in ms), run_chain's with its ratio to subprocess.run, then one
    for its ratio to subprocess.run with a session of its own."""
    found: list[dict[str, Any]] = [
        {"series": SERIES[side], "shape": label, "units": units, "p50_ms": round(p50 * 1000, 3),
         "p90_ms": round(p90 * 1000, 3)} for side, (p50, p90) in figures.items()]
    found[0].update(ratios(figures, "subprocess.run"))
    found.append({"series": f"run_chain / {SERIES['+session']}", "shape": label, "units": units,
                  **ratios(figures, "+session")})
    return found


def compare(label: str, argv: tuple[str, ...], units: int, media: str, workdir: Path) -> list[dict[str, Any]]:
    from contextful.engine.derive.bind import Binding
    from contextful.engine.derive.exec import run_chain

    binding = Binding("noop", command=(*argv, "{input}"))
    bare = [*argv, media]
    expected = subprocess.run(bare, capture_output=True, env={}, cwd=workdir, check=True).stdout
    assert run_chain(binding, "warm-up", media, workdir).output == expected
    timed: dict[str, list[float]] = {"run_chain": [], "subprocess.run": [], "+session": []}
    for unit in range(units):
        start = time.perf_counter()
        run_chain(binding, f"u{unit}", media, workdir)
        timed["run_chain"].append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(bare, capture_output=True, env={}, cwd=workdir, check=True)
        timed["subprocess.run"].append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(bare, capture_output=True, env={}, cwd=workdir, check=True, start_new_session=True)
        timed["+session"].append(time.perf_counter() - start)
    figures = {side: quantiles(samples) for side, samples in timed.items()}
    print(f"{label}: {units} units per side (after one warm-up)")
    for side, (p50, p90) in figures.items():
        print(f"  {side:>15}: p50 {p50 * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms")
    for peer in ("subprocess.run", "+session"):
        print(f"  run_chain / {peer}: p50 {figures['run_chain'][0] / figures[peer][0]:.2f}, "
              f"p90 {figures['run_chain'][1] / figures[peer][1]:.2f}")
    return exec_records(label, units, figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1000, help="units per side")
    parser.add_argument("--quick", action="store_true", help="100 units per side")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    units = 100 if args.quick else args.units
    with tempfile.TemporaryDirectory(prefix="bench-derive-exec-") as scratch:
        root = Path(scratch)
        media = root / "talk.wav"
        media.write_bytes(b"RIFF" + bytes(1020))
        script = root / "noop.py"
        script.write_text(NOOP)
        workdir = root / "work"
        workdir.mkdir()
        python_engine = (sys.executable, "-I", "-S", str(script))
        found = compare("no-op python engine", python_engine, units, str(media), workdir)
        found += compare("/bin/true engine", ("/bin/true",), units, str(media), workdir)
    if args.json:
        records.write(args.json, "derive_exec", found, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
