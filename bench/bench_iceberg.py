"""Iceberg export: our hand-written overwrite commit vs pyiceberg's ``Table.overwrite``.

Run ``python bench/bench_iceberg.py [--rows N] [--reps R] [--json PATH]``.

1,000,000 rows x 10 columns (int64, float64, string, timestamp) are exported to a SQLite
``SqlCatalog`` with a local warehouse, in one process, sides interleaved: each rep first creates
the table with one export, then times one overwrite of the same table with the same data:

- ``ours``: ``iceberg.commit.export_table`` (data files, manifests and manifest list written by us,
  one ``catalog.commit_table`` with explicit requirements);
- ``pyiceberg``: ``Table.overwrite`` of the same Arrow table.

Reported: median seconds per overwrite, the ratio ours / pyiceberg (target <= 1.0), and the share
of ours spent after the data files are written (manifests, manifest list, commit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import records


def make_data(rows: int) -> Any:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    columns: dict[str, Any] = {}
    for i in range(4):
        columns[f"i{i}"] = pa.array(rng.integers(0, 1_000_000, rows))
    for i in range(3):
        columns[f"f{i}"] = pa.array(rng.random(rows))
    words = np.array([f"w{k:04d}" for k in range(5000)])
    for i in range(2):
        columns[f"s{i}"] = pa.array(words[rng.integers(0, 5000, rows)])
    columns["at"] = pa.array((rng.integers(0, 10**9, rows) * 1_000_000).astype("datetime64[us]"))
    return pa.table(columns)


def overwrite_records(rows: int, times: dict[str, list[float]], tail_share: float) -> list[dict[str, Any]]:
    """pyiceberg's median overwrite and ours with its ratio to it and the share after the data files."""
    med = {side: statistics.median(runs) for side, runs in times.items()}
    theirs = {"series": "pyiceberg overwrite", "rows": rows, "seconds": round(med["pyiceberg"], 4),
              "reps": len(times["pyiceberg"])}
    ours = {"series": "contextful export_table", "rows": rows, "seconds": round(med["ours"], 4),
            "reps": len(times["ours"]), "ratio_to": theirs["series"],
            "ratio": round(med["ours"] / med["pyiceberg"], 3), "after_data_files_share": round(tail_share, 3)}
    return [theirs, ours]


def overwrite_targets(ratio: float) -> list[dict[str, Any]]:
    """The target this benchmark states, as measured."""
    return [{"target": "overwrite time ratio ours / pyiceberg <= 1.0", "value": round(ratio, 3),
             "met": ratio <= 1.0}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    from contextful.iceberg import commit
    from contextful.iceberg.commit import export_table
    from pyiceberg.catalog.sql import SqlCatalog

    data = make_data(args.rows)
    work = tempfile.mkdtemp(prefix="cf-bench-iceberg-")
    times: dict[str, list[float]] = {"ours": [], "pyiceberg": []}
    tail: list[float] = []
    try:
        catalog = SqlCatalog("bench", uri=f"sqlite:///{work}/catalog.db", warehouse=f"file://{work}/wh")
        catalog.create_namespace("b")
        for rep in range(args.reps):
            for side in (("ours", "pyiceberg") if rep % 2 == 0 else ("pyiceberg", "ours")):
                ident = f"b.{side}_{rep}"
                export_table(catalog, ident, data)  # the create, untimed
                if side == "ours":
                    written: list[float] = []
                    original = commit.write_data_files

                    def timed(*a: Any, _original: Any = original, _written: list[float] = written,
                              **k: Any) -> Any:
                        out = _original(*a, **k)
                        _written.append(time.perf_counter())
                        return out

                    commit.write_data_files = timed  # type: ignore[assignment]
                    t0 = time.perf_counter()
                    export_table(catalog, ident, data)
                    t1 = time.perf_counter()
                    commit.write_data_files = original  # type: ignore[assignment]
                    tail.append((t1 - written[0]) / (t1 - t0))
                else:
                    table = catalog.load_table(ident)
                    t0 = time.perf_counter()
                    table.overwrite(data)
                    t1 = time.perf_counter()
                times[side].append(t1 - t0)
                print(f"rep {rep + 1} {side:>9}: {t1 - t0:.3f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["ours"] / med["pyiceberg"]
    print(f"{args.rows:,} rows x 10 columns: ours {med['ours']:.3f} s, pyiceberg {med['pyiceberg']:.3f} s,"
          f" ratio {ratio:.2f} (target <= 1.0: {'met' if ratio <= 1.0 else 'MISSED'});"
          f" manifests + list + commit {statistics.median(tail):.1%} of ours")
    if args.json:
        records.write(args.json, "iceberg", overwrite_records(args.rows, times, statistics.median(tail)),
                      targets=overwrite_targets(ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
