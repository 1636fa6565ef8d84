"""The Iceberg query gateway: a template over HTTP vs DuckDB reading the same data files directly.

Run ``python bench/bench_gateway.py [--rows N] [--reps R] [--json PATH]``.

A project exports 1,000,000 rows x 10 columns (bench_iceberg's data) to the default SQLite
catalog; ``contextful pipeline serve`` runs in a child process; a reader key is issued. Sides,
interleaved, timed per request:

- ``gateway``: ``POST /query`` of a declared template (a GROUP BY to 5,000 rows, JSON answer) with
  the reader's key: admission, refusal checks, catalog load, snapshot planning, a sealed DuckDB
  connection, the query, JSON encoding, HTTP;
- ``raw``: in this process, a fresh ``duckdb.connect()`` running the same SQL over
  ``read_parquet`` of exactly the snapshot's data files, fetched as Python rows.

Also shown: a point query (``WHERE i0 = $v``, a handful of rows), where fixed costs dominate.
Reported: medians, the ratio gateway / raw (no target set by an issue; recorded to watch).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import records

GROUPED = "SELECT s0, count(*) AS n, sum(f0) AS total FROM wide GROUP BY s0 ORDER BY s0"
POINT = "SELECT i0, i1, s0, f0 FROM wide WHERE i0 = $v ORDER BY i1"

PROJECT = f"""
[project]
name = "gateway-bench"

[[export]]
name = "wide"
source = "wide"
namespace = "bi"
credential = "analysts"

[export.templates]
grouped = "{GROUPED}"
point = "{POINT}"
"""


def post(url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", "/query", body=json.dumps(body).encode(),
                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    response = conn.getresponse()
    doc = json.loads(response.read())
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"gateway answered {response.status}: {doc}")
    return doc


def case_records(case: str, rows: int, answer_rows: int, med: dict[str, float]) -> list[dict[str, Any]]:
    """The raw side's median and the gateway's with its ratio to it, in ms."""
    raw = {"series": "duckdb read_parquet", "shape": case, "rows": rows, "answer_rows": answer_rows,
           "ms": round(med["raw"] * 1000, 3)}
    gateway = {**raw, "series": "gateway", "ms": round(med["gateway"] * 1000, 3), "ratio_to": raw["series"],
               "ratio": round(med["gateway"] / med["raw"], 3)}
    return [raw, gateway]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()

    import duckdb
    from contextful.engine.config import load_manifest
    from contextful.engine.export import readers
    from contextful.engine.export.run import run_exports
    from contextful.storage import Store
    from pyiceberg.catalog.sql import SqlCatalog

    from bench.bench_iceberg import make_data

    work = tempfile.mkdtemp(prefix="bench-gateway-")
    with open(os.path.join(work, "contextful.toml"), "w") as f:
        f.write(PROJECT)
    manifest = load_manifest(work)
    data = make_data(args.rows)
    with Store.open(manifest.project.store) as store:
        store.append("wide", data)
        run_exports(store, manifest)
    token = readers.issue(manifest.root, "analysts").token
    catalog = SqlCatalog("contextful", uri=f"sqlite:///{work}/.contextful/iceberg/catalog.sqlite",
                         warehouse=f"file://{work}/.contextful/iceberg/warehouse")
    files = [t.file.file_path.removeprefix("file://") for t in catalog.load_table("bi.wide").scan().plan_files()]
    point_value = int(data.column("i0")[12345].as_py())

    child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", work, "pipeline", "serve", "--http",
                              "127.0.0.1:0"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                             cwd=REPO)
    try:
        assert child.stdout is not None
        match = re.fullmatch(r"listening on (\S+)\n", child.stdout.readline())
        assert match, "serve did not start"
        url = match.group(1)

        def raw(sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
            con = duckdb.connect()
            try:
                listed = ", ".join("'" + p + "'" for p in files)
                con.execute(f"CREATE VIEW wide AS SELECT * FROM read_parquet([{listed}])")
                return con.execute(sql, params or {}).fetchall()
            finally:
                con.close()

        cases = {
            "grouped": ({"table": "wide", "template": "grouped", "max_rows": 1_000_000}, GROUPED, None),
            "point": ({"table": "wide", "template": "point", "params": {"v": point_value}}, POINT,
                      {"v": point_value}),
        }
        found: list[dict[str, Any]] = []
        print(f"gateway: {args.rows:,} rows x {data.num_columns} columns exported, {len(files)} data file(s); "
              f"{args.reps} reps after a warm-up, sides interleaved")
        for name, (request, sql, params) in cases.items():
            answer = post(url, token, request)  # warm-up: catalog loaded, pages cached
            expected = raw(sql, params)
            assert answer["row_count"] == len(expected), (answer["row_count"], len(expected))
            times: dict[str, list[float]] = {"gateway": [], "raw": []}
            for rep in range(args.reps):
                order = ["gateway", "raw"] if rep % 2 == 0 else ["raw", "gateway"]
                for side in order:
                    t0 = time.perf_counter()
                    if side == "gateway":
                        post(url, token, request)
                    else:
                        raw(sql, params)
                    times[side].append(time.perf_counter() - t0)
            med = {side: statistics.median(ts) for side, ts in times.items()}
            print(f"  {name:<8} ({len(expected):,} rows): gateway {med['gateway'] * 1000:.1f} ms, "
                  f"raw {med['raw'] * 1000:.1f} ms, ratio {med['gateway'] / med['raw']:.2f}")
            found += case_records(name, args.rows, len(expected), med)
    finally:
        child.terminate()
        child.wait(timeout=30)
    if args.json:
        records.write(args.json, "gateway", found, reps=args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
