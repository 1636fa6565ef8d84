"""Commit latency of the D1 profile's catalog beside SQLite's and PostgreSQL's, in one run.

Run ``python bench/bench_d1.py [--quick | --commits N] [--json PATH]`` from the repository root
(after ``npm ci``; ``--quick``: 50 commits). Three stores land the same one-row runs, interleaved commit by commit (the order turning
each round): the local profile's SQLite catalog (WAL, ``synchronous=FULL``), a PostgreSQL catalog
on a private loopback server (``fsync=on``), and a ``D1Catalog`` through the Worker under miniflare
on loopback (``tests/support/miniflare_server.py``; its local D1 is SQLite under workerd). Each
side's p50, p90 and p99 per commit are printed, with the ratios D1/SQLite and D1/PostgreSQL, and
the Worker requests a D1 commit makes (D1 holds no transaction across requests, so the commit's
reads and its one conditional batch are separate round trips: ``storage.d1.catalog``).

miniflare on loopback is not Cloudflare: a deployed Worker adds the network between the engine
and the Worker, and D1's own replication. The ratio says what the adapter's shape costs beside the
other catalogs on one machine. Figures and how to read them: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run as a script from the repository: bench and tests import as packages
    sys.path.insert(0, REPO)

from contextful.storage import Store
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.d1.client import D1Client

from bench import records
from bench.bench_store import make_row, ms, pct, peak_rss_mib
from tests.support.miniflare_server import MiniflareServer
from tests.support.postgres_server import PostgresServer

COMMITS = 300
QUICK = 50
WARMUP = 5


class CountingClient(D1Client):
    """The Worker client, counting the requests it makes (what a D1 commit costs in round trips)."""

    requests = 0

    def _request(self, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return super()._request(*args, **kwargs)


def run(work: str, commits: int) -> dict[str, Any]:
    d1 = MiniflareServer().start()
    pg = PostgresServer(fsync=True).start()
    client = CountingClient(d1.url, d1.token)
    stores = {
        "sqlite": Store.open(os.path.join(work, "sqlite")),
        "postgres": Store.open(os.path.join(work, "postgres"), catalog=PostgresCatalog(pg.dsn, "bench_d1")),
        "d1": Store.open(os.path.join(work, "d1"), catalog=D1Catalog(client)),
    }
    times: dict[str, list[float]] = {name: [] for name in stores}
    d1_requests = 0
    try:
        for i in range(WARMUP + commits):
            row = make_row(i)
            names = list(stores)
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                before = client.requests
                t0 = time.perf_counter()
                stores[name].append("t", row)
                elapsed = time.perf_counter() - t0
                if i >= WARMUP:
                    times[name].append(elapsed)
                    if name == "d1":
                        d1_requests += client.requests - before
        for store in stores.values():
            assert store.table("t").count() == WARMUP + commits
    finally:
        for store in stores.values():
            store.close()
        d1.stop()
        pg.stop()

    print(f"one-row commits: {commits:,} per catalog ({WARMUP} warm-up), the three interleaved")
    out: dict[str, Any] = {"commits": commits, "d1_requests_per_commit": round(d1_requests / commits, 2)}
    for name, ts in times.items():
        out[name] = {"p50_ms": round(pct(ts, 50) * 1000, 3), "p90_ms": round(pct(ts, 90) * 1000, 3),
                     "p99_ms": round(pct(ts, 99) * 1000, 3)}
        print(f"  {name:>8}: p50 {ms(pct(ts, 50))}  p90 {ms(pct(ts, 90))}  p99 {ms(pct(ts, 99))}")
    for ref in ("sqlite", "postgres"):
        for q in ("p50", "p99"):
            out[f"ratio_{q}_d1_vs_{ref}"] = round(out["d1"][f"{q}_ms"] / out[ref][f"{q}_ms"], 2)
        print(f"  ratio d1/{ref}: p50 {out[f'ratio_p50_d1_vs_{ref}']:.2f}  p99 {out[f'ratio_p99_d1_vs_{ref}']:.2f}")
    print(f"  Worker requests per D1 commit: {out['d1_requests_per_commit']}; peak RSS {peak_rss_mib():.0f} MiB")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=COMMITS, help=f"commits per catalog (default {COMMITS})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} commits per catalog")
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-d1-") as work:
        result = run(work, QUICK if args.quick else args.commits)
    if args.json:
        found = [{"series": f"commit {name}", "commits": result["commits"], **result[name],
                  "ratio_to": "d1 p50", "ratio": round(result["d1"]["p50_ms"] / result[name]["p50_ms"], 2)}
                 for name in ("sqlite", "postgres", "d1")]
        records.write(args.json, "d1", found, result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
