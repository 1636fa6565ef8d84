"""Side-by-side benchmarks of the store against the raw libraries doing the least possible work.

Run ``python bench/bench_store.py [--quick] [--only NAME,...] [--json PATH]``. Each benchmark runs
in a child process of its own so its peak RSS (``resource.getrusage``) is its own; inside the
child both sides run in the same process on the same input, interleaved, and the ratio is printed.

- ``append``: 1,000,000 rows x 20 columns (int64/float64/string/timestamp) landed as 100 runs of
  10,000 rows through ``Store.append`` vs the same 100 batches written with
  ``pyarrow.parquet.write_table`` (zstd). Ratio = our throughput / direct throughput.
- ``commit-sqlite`` / ``commit-postgres``: per-commit latency of 1,000 one-row runs on each
  catalog vs the raw minimum (one one-row Parquet file + one catalog-database insert transaction).
  Ratio = our p50 / raw p50.
- ``query``: a GROUP BY aggregate and a filtered count over a 1,000-part table through the
  snapshot view (``snapshot_sql`` in a ``store.duckdb()`` connection) vs DuckDB ``read_parquet``
  over the same files. Ratio = our time / raw time.

Figures and how to read them: ``bench/README.md``. Benchmarks are not tests: nothing here asserts
a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from contextful.storage import Store
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.parts import dictionary_columns
from contextful.storage.snapshot import snapshot_sql

from bench import records

BENCHMARKS = ("append", "commit-sqlite", "commit-postgres", "query")
TS_BASE_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
CATEGORIES = np.array([f"cat-{i:03d}" for i in range(100)])

FULL = {"append_rows": 1_000_000, "append_runs": 100, "append_reps": 7,
        "commits": 1_000, "query_parts": 1_000, "query_part_rows": 1_000, "query_reps": 15}
QUICK = {"append_rows": 100_000, "append_runs": 10, "append_reps": 3,
         "commits": 100, "query_parts": 100, "query_part_rows": 1_000, "query_reps": 5}


# --- input --------------------------------------------------------------------------------------


def make_batch(seed: int, rows: int, start_id: int = 0) -> pa.Table:
    """20 columns, 5 each of int64, float64, string and timestamp[us, UTC]; same seed, same table."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {"id": pa.array(np.arange(start_id, start_id + rows, dtype=np.int64))}
    for i in range(1, 5):
        cols[f"i{i}"] = pa.array(rng.integers(-1_000_000_000, 1_000_000_000, rows, dtype=np.int64))
    for i in range(5):
        cols[f"f{i}"] = pa.array(rng.random(rows))
    cols["cat"] = pa.array(CATEGORIES[rng.integers(0, len(CATEGORIES), rows)], pa.string())
    for i in range(1, 5):
        names = np.char.add("name-", rng.integers(0, 1_000_000, rows).astype(str))
        cols[f"s{i}"] = pa.array(names, pa.string())
    for i in range(5):
        us = TS_BASE_US + rng.integers(0, 365 * 86_400 * 1_000_000, rows, dtype=np.int64)
        cols[f"ts{i}"] = pa.array(us, pa.timestamp("us", tz="UTC"))
    return pa.table(cols)


def make_row(i: int) -> pa.Table:
    """One row, one column of each kind (the commit-latency input)."""
    return pa.table({
        "id": pa.array([i], pa.int64()),
        "value": pa.array([i * 0.5], pa.float64()),
        "name": pa.array([f"name-{i}"], pa.string()),
        "ts": pa.array([TS_BASE_US + i], pa.timestamp("us", tz="UTC")),
    })


# --- helpers ------------------------------------------------------------------------------------


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(table: pa.Table, path: str) -> None:
    """write_table, then fsync the file and its directory (what a durable publish needs at least)."""
    with open(path, "wb") as fh:
        pq.write_table(table, fh, compression="zstd")
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(os.path.dirname(path))


def same_answer(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    """Equal rows, floats compared to 1e-9 relative (parallel sums add in varying order)."""
    def close(x: Any, y: Any) -> bool:
        return math.isclose(x, y, rel_tol=1e-9) if isinstance(x, float) else x == y
    return len(a) == len(b) and all(len(r) == len(s) and all(map(close, r, s)) for r, s in zip(a, b))


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# --- (a) append throughput ----------------------------------------------------------------------


def bench_append(work: str, size: dict[str, int]) -> dict[str, Any]:
    rows, runs, reps = size["append_rows"], size["append_runs"], size["append_reps"]
    per = rows // runs
    batches = [make_batch(seed=i, rows=per, start_id=i * per) for i in range(runs)]
    mib = sum(b.nbytes for b in batches) / 2**20
    print(f"append: {rows:,} rows x {batches[0].num_columns} columns in {runs} runs of {per:,}"
          f" ({mib:.0f} MiB in Arrow), {reps} reps, sides interleaved")

    def ours(root: str) -> None:
        store = Store.open(root)
        for batch in batches:
            store.append("t", batch)
        store.close()

    def ours_no_fsync(root: str) -> None:
        store = Store.open(root, durable=False)  # the same commit protocol, parts/manifests not fsynced
        for batch in batches:
            store.append("t", batch)
        store.close()

    def direct(root: str) -> None:
        for i, batch in enumerate(batches):
            pq.write_table(batch, os.path.join(root, f"part-{i:05d}.parquet"), compression="zstd")

    def direct_fsync(root: str) -> None:
        for i, batch in enumerate(batches):
            write_durable(batch, os.path.join(root, f"part-{i:05d}.parquet"))

    def direct_same_encoding(root: str) -> None:  # the encoding choice ours makes, without the store
        for i, batch in enumerate(batches):
            pq.write_table(batch, os.path.join(root, f"part-{i:05d}.parquet"), compression="zstd",
                           use_dictionary=list(dictionary_columns(batch.schema)))

    sides: dict[str, Callable[[str], None]] = {"ours": ours, "ours-nofsync": ours_no_fsync, "direct": direct,
                                               "direct+fsync": direct_fsync, "direct-same-enc": direct_same_encoding}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(reps + 1):  # rep 0 warms up and is not counted
        order = list(sides) if rep % 2 else list(reversed(sides))
        for name in order:
            root = fresh(os.path.join(work, f"append-{name}"))
            os.sync()  # no dirty pages of the previous side to write back on this side's time
            t0 = time.perf_counter()
            sides[name](root)
            elapsed = time.perf_counter() - t0
            if rep:
                times[name].append(elapsed)
        if rep == 0:
            with Store.open(os.path.join(work, "append-ours")) as store:
                landed = store.table("t").count()
            assert landed == rows, f"landed {landed} rows, not {rows}"

    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"  {name:>13}: median {med[name]:.3f} s  ({rows / med[name] / 1e6:.2f} M rows/s,"
              f" {mib / med[name]:.0f} MiB/s)  runs {', '.join(f'{t:.3f}' for t in ts)}")
    pairs = [d / o for o, d in zip(times["ours"], times["direct"])]
    ratio = med["direct"] / med["ours"]
    ratio_fsync = med["direct+fsync"] / med["ours"]
    print(f"  ratio ours/direct throughput = {ratio:.2f} (pairwise median {statistics.median(pairs):.2f};"
          f" target >= 0.8: {'met' if ratio >= 0.8 else 'MISSED'})")
    print(f"  ratio ours/direct+fsync throughput = {ratio_fsync:.2f}")
    print(f"  ratio ours/direct-same-enc throughput = {med['direct-same-enc'] / med['ours']:.2f} "
          f"(direct written with ours' encoding: dictionary on string columns only)")
    ratio_nofsync = med["direct"] / med["ours-nofsync"]
    print(f"  ratio ours(durable=False)/direct throughput = {ratio_nofsync:.2f} (neither side fsyncs)")
    overhead_ms = (med["ours"] - med["direct"]) / runs * 1000
    print(f"  our cost beyond the direct write: {overhead_ms:.1f} ms per run"
          f" ({med['direct'] / runs * 1000:.1f} ms per direct write)")
    return {"rows": rows, "runs": runs, "columns": batches[0].num_columns, "arrow_mib": round(mib, 1),
            "median_s": {k: round(v, 4) for k, v in med.items()}, "ratio": round(ratio, 3),
            "ratio_pairwise": round(statistics.median(pairs), 3), "ratio_vs_fsync": round(ratio_fsync, 3),
            "ratio_nofsync": round(ratio_nofsync, 3),
            "overhead_ms_per_run": round(overhead_ms, 2), "target_met": ratio >= 0.8}


# --- (b) commit latency -------------------------------------------------------------------------


class RawSqlite:
    """The least a catalog publish needs: one INSERT transaction in a WAL, synchronous=FULL file."""

    def __init__(self, path: str) -> None:
        self.con = sqlite3.connect(path, isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=FULL")
        self.con.execute("CREATE TABLE parts (path TEXT PRIMARY KEY, rows_count INTEGER, bytes INTEGER)")

    def insert(self, path: str, rows: int, size: int) -> None:
        self.con.execute("BEGIN IMMEDIATE")
        self.con.execute("INSERT INTO parts VALUES (?, ?, ?)", (path, rows, size))
        self.con.execute("COMMIT")

    def close(self) -> None:
        self.con.close()


class RawPostgres:
    """The same insert transaction on PostgreSQL."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.con = psycopg.connect(dsn, autocommit=True)
        self.con.execute("CREATE SCHEMA raw_bench")
        self.con.execute(
            "CREATE TABLE raw_bench.parts (path TEXT PRIMARY KEY, rows_count BIGINT, bytes BIGINT)")

    def insert(self, path: str, rows: int, size: int) -> None:
        with self.con.transaction():
            self.con.execute("INSERT INTO raw_bench.parts VALUES (%s, %s, %s)", (path, rows, size))

    def close(self) -> None:
        self.con.close()


def _commit_latency(label: str, store: Store, raw: Any, raw_dir: str, commits: int) -> dict[str, Any]:
    warmup = 5
    times: dict[str, list[float]] = {"ours": [], "raw": [], "raw+fsync": []}

    def ours(i: int, row: pa.Table) -> None:
        store.append("t", row)

    def plain(i: int, row: pa.Table) -> None:
        path = os.path.join(raw_dir, f"p-{i:06d}.parquet")
        pq.write_table(row, path, compression="zstd")
        raw.insert(path, row.num_rows, os.path.getsize(path))

    def durable(i: int, row: pa.Table) -> None:
        path = os.path.join(raw_dir, f"d-{i:06d}.parquet")
        write_durable(row, path)
        raw.insert(path, row.num_rows, os.path.getsize(path))

    sides = {"ours": ours, "raw": plain, "raw+fsync": durable}
    for i in range(warmup + commits):
        row = make_row(i)
        order = list(sides) if i % 2 else list(reversed(sides))
        for name in order:
            t0 = time.perf_counter()
            sides[name](i, row)
            elapsed = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(elapsed)
    assert store.table("t").count() == warmup + commits

    print(f"{label}: {commits:,} one-row runs (4 columns), {warmup} warm-up, sides interleaved")
    out: dict[str, Any] = {"commits": commits}
    for name, ts in times.items():
        p50, p90, p99 = pct(ts, 50), pct(ts, 90), pct(ts, 99)
        mean = statistics.mean(ts)
        print(f"  {name:>10}: p50 {ms(p50)}  p90 {ms(p90)}  p99 {ms(p99)}  max {ms(max(ts))}"
              f"  mean {ms(mean)}")
        out[name] = {"p50_ms": round(p50 * 1000, 3), "p90_ms": round(p90 * 1000, 3),
                     "p99_ms": round(p99 * 1000, 3), "max_ms": round(max(ts) * 1000, 3),
                     "mean_ms": round(mean * 1000, 3)}
    for ref in ("raw", "raw+fsync"):
        out[f"ratio_p50_vs_{ref}"] = round(out["ours"]["p50_ms"] / out[ref]["p50_ms"], 2)
        out[f"ratio_p90_vs_{ref}"] = round(out["ours"]["p90_ms"] / out[ref]["p90_ms"], 2)
        p50_ratio, p90_ratio = out[f"ratio_p50_vs_{ref}"], out[f"ratio_p90_vs_{ref}"]
        print(f"  ratio ours/{ref}: p50 {p50_ratio:.2f}  p90 {p90_ratio:.2f}")
    return out


def bench_commit_sqlite(work: str, size: dict[str, int]) -> dict[str, Any]:
    root = fresh(os.path.join(work, "commit-sqlite"))
    raw_dir = fresh(os.path.join(work, "commit-sqlite-raw"))
    store = Store.open(root)
    raw = RawSqlite(os.path.join(raw_dir, "raw.sqlite"))
    try:
        return _commit_latency("commit-sqlite (catalog.sqlite, WAL, synchronous=FULL)", store, raw, raw_dir,
                               size["commits"])
    finally:
        store.close()
        raw.close()


def bench_commit_postgres(work: str, size: dict[str, int]) -> dict[str, Any]:
    from contextful.storage.catalog.postgres import PostgresCatalog

    from tests.support.postgres_server import PostgresServer

    server = PostgresServer(fsync=True).start()
    try:
        root = fresh(os.path.join(work, "commit-postgres"))
        raw_dir = fresh(os.path.join(work, "commit-postgres-raw"))
        store = Store.open(root, catalog=PostgresCatalog(server.dsn, "bench_store"))
        raw = RawPostgres(server.dsn)
        try:
            label = "commit-postgres (PostgreSQL on loopback, fsync=on)"
            return _commit_latency(label, store, raw, raw_dir, size["commits"])
        finally:
            store.close()
            raw.close()
    finally:
        server.stop()


# --- (c) query over many parts ------------------------------------------------------------------

QUERIES = {
    "group-by": ("SELECT cat, count(*) AS n, sum(f0) AS f0, avg(i1) AS i1, max(ts0) AS ts0"
                 " FROM {src} GROUP BY cat ORDER BY cat"),
    "filtered-count": "SELECT count(*) FROM {src} WHERE f1 > 0.5 AND s1 LIKE 'name-1%'",
}


def bench_query(work: str, size: dict[str, int]) -> dict[str, Any]:
    parts, per, reps = size["query_parts"], size["query_part_rows"], size["query_reps"]
    store = Store.open(fresh(os.path.join(work, "query")))
    t0 = time.perf_counter()
    # one append per part: the table a long-running pipeline leaves behind without compaction
    # (bench_history measures the policy; here the parts are what is queried)
    set_policy(store, CompactionPolicy(enabled=False))
    for i in range(parts):
        store.append("t", make_batch(seed=100_000 + i, rows=per, start_id=i * per))
    build_s = time.perf_counter() - t0
    table = store.table("t")
    print(f"query: {parts:,} parts x {per:,} rows x 20 columns, built by {parts:,} appends in {build_s:.1f} s"
          f" ({build_s / parts * 1000:.1f} ms per append); {reps} reps, sides interleaved")

    def open_view() -> duckdb.DuckDBPyConnection:
        con = store.duckdb()
        sql = snapshot_sql(table.snapshot(), con)
        con.execute(f"CREATE VIEW t AS {sql}")
        return con

    ours_con = open_view()
    uris = list(table.snapshot().uris)
    assert len(uris) == parts
    raw_con = duckdb.connect()
    raw_src = "read_parquet([" + ", ".join("'" + u.replace("'", "''") + "'" for u in uris) + "])"

    setup: list[float] = []
    for _ in range(reps):  # resolving the snapshot and opening the view, once per reader session
        t0 = time.perf_counter()
        open_view().close()
        setup.append(time.perf_counter() - t0)

    out: dict[str, Any] = {"parts": parts, "rows_per_part": per, "build_s": round(build_s, 2),
                           "setup_ms": round(statistics.median(setup) * 1000, 2)}
    print(f"  snapshot + view setup: median {ms(statistics.median(setup))}")
    for qname, template in QUERIES.items():
        sides = {"ours": (ours_con, template.format(src="t")), "raw": (raw_con, template.format(src=raw_src))}
        answers = {name: con.execute(q).fetchall() for name, (con, q) in sides.items()}  # warm-up
        assert same_answer(answers["ours"], answers["raw"]), f"{qname}: the view answers differently"
        times: dict[str, list[float]] = {name: [] for name in sides}
        for rep in range(reps):
            order = list(sides) if rep % 2 else list(reversed(sides))
            for name in order:
                con, q = sides[name]
                t0 = time.perf_counter()
                con.execute(q).fetchall()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        ratio = med["ours"] / med["raw"]
        with_setup = (med["ours"] + statistics.median(setup)) / med["raw"]
        print(f"  {qname}: ours {ms(med['ours'])}  raw {ms(med['raw'])}  ratio ours/raw = {ratio:.2f}"
              f" (target <= 1.2: {'met' if ratio <= 1.2 else 'MISSED'}); with setup {with_setup:.2f}")
        out[qname] = {"ours_ms": round(med["ours"] * 1000, 2), "raw_ms": round(med["raw"] * 1000, 2),
                      "ratio": round(ratio, 3), "ratio_with_setup": round(with_setup, 3),
                      "target_met": ratio <= 1.2}
    ours_con.close()
    raw_con.close()
    store.close()
    return out


RUNNERS: dict[str, Callable[[str, dict[str, int]], dict[str, Any]]] = {
    "append": bench_append,
    "commit-sqlite": bench_commit_sqlite,
    "commit-postgres": bench_commit_postgres,
    "query": bench_query,
}


# --- driver -------------------------------------------------------------------------------------


def run_child(name: str, quick: bool, workdir: str) -> None:
    work = tempfile.mkdtemp(prefix=f"bench-{name}-", dir=workdir)
    try:
        result = RUNNERS[name](work, QUICK if quick else FULL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["peak_rss_mib"] = round(peak_rss_mib(), 1)
    print(f"  peak RSS {result['peak_rss_mib']:.0f} MiB")
    print("RESULT " + json.dumps({"benchmark": name, **result}), flush=True)


def store_records(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results as bench/records.py records: one per benchmark (per query for ``query``)."""
    out: list[dict[str, Any]] = []
    for r in results:
        name, rss = r["benchmark"], r.get("peak_rss_mib", 0) * 2**20
        if name == "append":
            out.append({"series": name, "rows": r["rows"], "seconds": r["median_s"]["ours"], "peak_rss_bytes": rss,
                        "ratio_to": "write_table", "ratio": r["ratio"], "target": ">= 0.8", "met": r["target_met"]})
        elif name.startswith("commit-"):
            out.append({"series": name, "p50_ms": r["ours"]["p50_ms"], "p99_ms": r["ours"]["p99_ms"],
                        "peak_rss_bytes": rss, "ratio_to": "raw INSERT + Parquet write (p50)",
                        "ratio": r["ratio_p50_vs_raw"]})
        else:
            out.extend({"series": f"{name} {q}", "ms": v["ours_ms"], "peak_rss_bytes": rss,
                        "ratio_to": "DuckDB read_parquet (time)", "ratio": v["ratio"], "target": "<= 1.2",
                        "met": v["target_met"]} for q, v in r.items() if isinstance(v, dict))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--only", default=",".join(BENCHMARKS),
                        help="comma-separated: " + ", ".join(BENCHMARKS))
    parser.add_argument("--json", help="also write every result to this file")
    parser.add_argument("--workdir", default=None,
                        help="where the stores are written (default: the temp dir)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child, args.quick, args.workdir or tempfile.gettempdir())
        return 0
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNNERS]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}")
    results, failed = [], []
    for name in names:  # one child per benchmark, so each peak RSS is its own
        argv = [sys.executable, os.path.abspath(__file__), "--child", name]
        argv += ["--quick"] if args.quick else []
        argv += ["--workdir", args.workdir] if args.workdir else []
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("RESULT "):
                results.append(json.loads(line[len("RESULT "):]))
            else:
                print(line, end="", flush=True)
        if proc.wait() != 0:
            failed.append(name)
    if args.json:
        records.write(args.json, "store", store_records(results), quick=args.quick, results=results)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
