"""The resume route: resolving an awakeable over HTTP vs resolving it on the store directly.

Run ``python bench/bench_awake.py [--resumes N] [--quick] [--json PATH]``.

A project pins an issuer key; ``contextful pipeline serve --awake-http 127.0.0.1:0`` runs in a
child process over its SQLite store; this process mints ``2 N`` pending awakeables there and issues
one signed credential. Sides, interleaved (A B A B ...), timed per resume:

- ``http``: ``POST /awake/<token>`` with ``Authorization: Bearer <credential>`` on a fresh
  connection: the credential's Ed25519 verification, the store's conditional resolve (one SQLite
  write transaction), the answer with the recorded payload;
- ``direct``: in this process, ``store.awakeables.resolve(token, payload, subject, now)`` on the
  same SQLite file: the same write without HTTP and admission.

Also shown: ``verify`` alone (the credential check each request pays). Reported: medians and p90,
the ratio http / direct (no target set by an issue; recorded to watch).
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
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

PAYLOAD = b'{"approved": true, "by": "bench"}'


def post(url: str, token: str, credential: str) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", f"/awake/{token}", body=PAYLOAD, headers={"Authorization": f"Bearer {credential}"})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"the resume route answered {response.status}: {body[:200]!r}")
    return body


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(0.9 * (len(ordered) - 1))]


def awake_records(figures: dict[str, tuple[float, float]], resumes: int) -> list[dict[str, Any]]:
    """One record per side (latencies in ms); http's carries its ratio to direct (p50's, p90's beside)."""
    found: list[dict[str, Any]] = []
    for side, (p50, p90) in figures.items():
        record: dict[str, Any] = {"series": side, "resumes": resumes, "p50_ms": round(p50 * 1000, 3),
                                  "p90_ms": round(p90 * 1000, 3)}
        if side == "http":
            direct = figures["direct"]
            record.update(ratio_to="direct", ratio=round(p50 / direct[0], 3),
                          ratio_p90=round(p90 / direct[1], 3))
        found.append(record)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resumes", type=int, default=2000, help="resumes per side")
    parser.add_argument("--quick", action="store_true", help="200 resumes per side")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    resumes = 200 if args.quick else args.resumes

    from contextful.engine.config import load_manifest
    from contextful.engine.control.credentials import generate_key, issue, load_signing_key, verify
    from contextful.storage import Store

    with tempfile.TemporaryDirectory(prefix="bench-awake-") as scratch:
        root = Path(scratch) / "project"
        root.mkdir()
        pin, key_file = generate_key(Path(scratch) / "issuer.pem")
        (root / "contextful.toml").write_text(f'[project]\nname = "awake-bench"\nissuer_keys = ["{pin.text}"]\n')
        credential = issue(load_signing_key(key_file), "bench", "awake", 3600, on_behalf_of="operator")
        store = Store.open(load_manifest(root).project.store)
        now = store.clock.now_us()
        tokens = [store.awakeables.mint("bench", seq, "approve", now + 3_600_000_000, now).token
                  for seq in range(2 * resumes)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
        server = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(root), "pipeline",
                                   "serve", "--awake-http", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            found = re.match(r"listening on (\S+)", line)
            if found is None:
                raise RuntimeError(f"serve printed {line!r}")
            url = found.group(1)
            post(url, tokens[0], credential)  # warm-up: the route opens its store on the first admitted request
            timed: dict[str, list[float]] = {"http": [], "direct": [], "verify": []}
            for i in range(1, resumes):
                start = time.perf_counter()
                assert post(url, tokens[2 * i], credential) == PAYLOAD
                timed["http"].append(time.perf_counter() - start)
                start = time.perf_counter()
                store.awakeables.resolve(tokens[2 * i + 1], PAYLOAD, "operator", store.clock.now_us())
                timed["direct"].append(time.perf_counter() - start)
                start = time.perf_counter()
                verify(credential, [pin], "awake")
                timed["verify"].append(time.perf_counter() - start)
        finally:
            server.terminate()
            server.wait(timeout=60)
            store.close()

    figures = {side: quantiles(samples) for side, samples in timed.items()}
    print(f"resumes per side: {resumes - 1} (after one warm-up)")
    for side, (p50, p90) in figures.items():
        print(f"{side:>7}: p50 {p50 * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms")
    print(f"http / direct: p50 {figures['http'][0] / figures['direct'][0]:.2f}, "
          f"p90 {figures['http'][1] / figures['direct'][1]:.2f}")
    if args.json:
        records.write(args.json, "awake", awake_records(figures, resumes - 1), quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
