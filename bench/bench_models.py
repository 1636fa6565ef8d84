"""Side by side: a model build over the store vs the same SQL run by DuckDB directly over the same
Parquet files, writing its result as zstd Parquet (``COPY … TO``).

Run ``python bench/bench_models.py [--rows N] [--reps N] [--json PATH]`` (default 10,000,000 rows
in 10 parts, 3 timed reps after a warm-up, interleaved). Three models: ``grouped`` (a GROUP BY down
to a few thousand rows), ``wide`` (a filter keeping about half the rows, so the build streams millions
of rows into parts) and ``wide_contract`` (``wide`` under a contract declaring two columns in
other types, each value checked exact). Ratio = our build time / DuckDB's time; figures go to bench/README.md.
Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from contextful.engine.model.build import BuildResult, build_model
from contextful.engine.model.spec import ColumnContract, Contract, ModelSpec
from contextful.storage import Store

from bench import records

QUERIES = {
    "grouped": "SELECT cat, month, count(*) AS n, sum(x) AS x, avg(y) AS y FROM events GROUP BY cat, month",
    "wide": "SELECT id, cat, x * 2 AS x2, y FROM events WHERE y > 0.5",
    "wide_contract": "SELECT id, cat, x * 2 AS x2, y FROM events WHERE y > 0.5",
}
CONTRACTS = {  # two columns declared in another type than the result's: each is checked exact
    "wide_contract": Contract("1.0", (), {"id": ColumnContract("decimal(20, 0)"), "cat": ColumnContract("string"),
                                          "x2": ColumnContract("double"), "y": ColumnContract("double")}),
}


def batch(start: int, rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": np.arange(start, start + rows, dtype=np.int64),
        "cat": pa.array(np.array([f"cat-{i:03d}" for i in range(200)])[rng.integers(0, 200, rows)]),
        "month": rng.integers(1, 13, rows, dtype=np.int64),
        "x": rng.integers(0, 1_000, rows, dtype=np.int64),
        "y": rng.random(rows),
    })


def model_records(name: str, rows: int, built: BuildResult, ours: float, theirs: float, reps: int
                  ) -> list[dict[str, Any]]:
    """DuckDB's median COPY and our build's with its ratio to it, for model ``name``."""
    copy = {"series": "duckdb COPY", "shape": name, "rows": rows, "seconds": round(theirs, 4), "reps": reps}
    build = {"series": "contextful build", "shape": name, "rows": rows, "seconds": round(ours, 4),
             "reps": reps, "result_rows": built.rows, "result_parts": built.parts, "ratio_to": copy["series"],
             "ratio": round(ours / theirs, 3)}
    return [copy, build]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-models-")
    store = Store.open(os.path.join(work, "store"))
    per = args.rows // args.parts
    for i in range(args.parts):
        store.append("events", batch(i * per, per, i))
    snap = store.table("events").snapshot()
    files = "[" + ", ".join(f"'{u}'" for u in snap.uris) + "]"
    raw = duckdb.connect()
    raw.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet({files})")
    print(f"{args.rows:,} rows in {len(snap.uris)} parts")
    found: list[dict[str, Any]] = []
    for name, sql in QUERIES.items():
        spec = ModelSpec(name=f"m_{name}", sql=sql, referenced=("events",), contract=CONTRACTS.get(name),
                         record=False)
        ours, theirs = [], []
        for rep in range(args.reps + 1):  # interleaved; rep 0 warms up
            t0 = time.perf_counter()
            result = build_model(store, spec, {"events"})
            t1 = time.perf_counter()
            out = os.path.join(work, f"raw-{name}-{rep}.parquet")
            raw.execute(f"COPY ({sql}) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")
            t2 = time.perf_counter()
            if rep:
                ours.append(t1 - t0)
                theirs.append(t2 - t1)
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{name}: build {a:.3f} s ({result.rows:,} rows, {result.parts} parts); duckdb COPY {b:.3f} s;"
              f" ratio {a / b:.2f}")
        found += model_records(name, args.rows, result, a, b, args.reps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB (both sides and the input generation, one process)")
    if args.json:
        records.write(args.json, "models", found, parts=len(snap.uris),
                      process_peak_rss_bytes=round(peak * 2**20))
    store.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
