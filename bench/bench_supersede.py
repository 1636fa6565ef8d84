"""The supersede rule's read cost: a derive output table read with its rule against the same parts
read by the plain keyed merge (storage.supersede, issue 16).

One table of ``--units`` units x 4 passages under key A (one landing), then ``--changed`` of those
units re-derived under key B (a second landing), then one failed marker each for ``--changed``
other units. The same parts are read as the snapshot with the rule and as the snapshot without it
(``dataclasses.replace(snapshot, supersede=None)``), interleaved, with a query reading every column
(``--narrow``: ``count(*), sum(cue_seq)`` only, which lets the plain read skip the text column). Prints the median seconds, the ratio and
DuckDB's EXPLAIN ANALYZE of the ruled read.

    python bench/bench_supersede.py                  # 250,000 units: 1,000,000 rows + 100,000
    python bench/bench_supersede.py --units 25000    # a smoke run
    python bench/bench_supersede.py --json /tmp/supersede.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from contextful.storage import Store
from contextful.storage.snapshot import snapshot_sql
from contextful.storage.supersede import Supersede

from bench import records

CUES = 4


def landing(units: range, key: str, status: str, kind: str, cues: int) -> pa.Table:
    n = len(units) * cues
    refs = [f"unit-{u:08d}" for u in units for _ in range(cues)]
    return pa.table({"unit_ref": refs, "derivation_key": [key] * n, "cue_seq": list(range(cues)) * len(units),
                     "unit_status": [status] * n, "kind": [kind] * n,
                     "text": [f"passage {i} of {r}" for i, r in enumerate(refs)]})


def read_records(rows_stored: int, medians: dict[str, float], answered: int, narrow: bool
                 ) -> list[dict[str, Any]]:
    """The plain keyed read's median and the ruled read's with its ratio to it."""
    shape = "count(*), sum(cue_seq)" if narrow else "every column"
    plain = {"series": "plain keyed read", "shape": shape, "rows": rows_stored,
             "seconds": round(medians["plain"], 4)}
    ruled = {"series": "with the rule", "shape": shape, "rows": rows_stored,
             "seconds": round(medians["ruled"], 4), "answered_rows": answered, "ratio_to": plain["series"],
             "ratio": round(medians["ruled"] / medians["plain"], 3)}
    return [plain, ruled]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, default=250_000)
    parser.add_argument("--changed", type=int, default=25_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--narrow", action="store_true")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, Store.open(root, durable=False) as store:
        table = store.create_table("passages", ("unit_ref", "derivation_key", "cue_seq"),
                                   supersede=Supersede(("unit_ref",)))
        table.append(landing(range(args.units), "A", "ok", "passage", CUES))
        table.append(landing(range(args.changed), "B", "ok", "passage", CUES))
        table.append(landing(range(args.changed, 2 * args.changed), "A", "failed", "marker", 1))
        ruled = table.snapshot()
        plain = dataclasses.replace(ruled, supersede=None)
        con = store.duckdb()
        measures = ("count(*), sum(cue_seq)" if args.narrow else
                    "count(*), sum(cue_seq), sum(length(text)), max(unit_ref), max(derivation_key),"
                    " max(unit_status), max(kind)")
        queries = {name: f"SELECT {measures} FROM ({snapshot_sql(snap, con)})"
                   for name, snap in (("plain", plain), ("ruled", ruled))}
        times: dict[str, list[float]] = {name: [] for name in queries}
        answers = {}
        for _ in range(args.reps + 1):
            for name, sql in queries.items():
                start = time.perf_counter()
                answers[name] = con.execute(sql).fetchall()
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t[1:]) for name, t in times.items()}
        print(f"rows stored {ruled.rows_stored:,}; answered plain {answers['plain'][0][0]:,},"
              f" ruled {answers['ruled'][0][0]:,}")
        print(f"plain keyed read {medians['plain']:.3f} s; with the rule {medians['ruled']:.3f} s;"
              f" ratio {medians['ruled'] / medians['plain']:.2f}")
        plan = con.execute("EXPLAIN ANALYZE " + queries["ruled"]).fetchall()
        print(plan[0][1])
        con.close()
        found = read_records(ruled.rows_stored, medians, answers["ruled"][0][0], args.narrow)
    if args.json:
        records.write(args.json, "supersede", found, units=args.units, changed=args.changed, reps=args.reps)


if __name__ == "__main__":
    main()
