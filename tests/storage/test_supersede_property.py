"""Property: a table with a supersede rule answers what docs/store.md ("Supersede rules") says at
every snapshot, before and after every fold (issue 16, ``run.emit.stale-supersedes``).

Hypothesis draws histories of landings — runs of one or two parts of rows of a few units under a few
derivation keys, passages and markers, statuses ok, empty, failed, unavailable and retired, primary keys
repeating within and across commits — and folds of varying reach (so some runs fold with larger
parts before them, whose units the fold must keep exact). After every operation each snapshot
1..head is read and compared with a tiny model of the rule in plain Python, from the history alone:

- the key merge answers, per (unit_ref, derivation_key, cue_seq), the latest row by commit order;
- a commit *settles* a unit under a key when it stored a row of the unit with status ok, empty or
  retired;
- an answered row is withheld when a later commit settled its unit under another key, when it is
  a marker whose status is not settling and a later commit settled its unit under any key, or when
  its status is retired (a retirement is never answered).

Folds are commits that change nothing in the model, and the head answers the same rows across each.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
from contextful.storage import ManualClock, Store
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.snapshot import Snapshot, snapshot_sql
from contextful.storage.supersede import RETIRED, SETTLING, Supersede
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

Row = dict[str, Any]
KEY = ("unit_ref", "derivation_key", "cue_seq")
RULE = Supersede(("unit_ref",))
SCHEMA = pa.schema({"unit_ref": pa.string(), "derivation_key": pa.string(), "cue_seq": pa.int64(),
                    "unit_status": pa.string(), "kind": pa.string(), "id": pa.int64()})

row = st.tuples(st.sampled_from(["u0", "u1", "u2"]), st.sampled_from(["A", "B", "C"]), st.integers(0, 2),
                st.sampled_from(["ok", "empty", "failed", "unavailable", RETIRED]), st.sampled_from(["passage", "marker"]))
landing = st.lists(st.lists(row, min_size=1, max_size=4), min_size=1, max_size=2)
PADDING = [("w", "A", cue, "ok", "passage") for cue in range(40)]
"""Rows of another unit making a landing's first part larger than the rest, so folds of some reach
leave it out and fold the runs after it (whose units may have rows in it)."""
operation = st.one_of(
    st.tuples(st.just("land"), landing),
    st.tuples(st.just("land"), landing.map(lambda parts: [parts[0] + PADDING, *parts[1:]])),
    st.tuples(st.just("fold"), st.tuples(st.integers(0, 7), st.integers(1, 2))),
)


@dataclass
class Model:
    """The documented rule over the history, in plain Python."""

    commits: list[list[tuple[tuple[int, int, int], Row]]] = field(default_factory=list)
    """Per commit (seq = index + 1): its rows with their commit-order position ([] for a fold)."""

    @property
    def head(self) -> int:
        return len(self.commits)

    def land(self, parts: list[list[Row]]) -> None:
        seq = self.head + 1
        self.commits.append([((seq, p, r), row) for p, part in enumerate(parts) for r, row in enumerate(part)])

    def answer(self, seq: int) -> list[tuple]:
        stored = [(position, row) for commit in self.commits[:seq] for position, row in commit]
        merged: dict[tuple, tuple[tuple[int, int, int], Row]] = {}
        for position, row in sorted(stored, key=lambda pr: pr[0]):
            merged[tuple(row[k] for k in KEY)] = (position, row)
        settled = [(position[0], row["unit_ref"], row["derivation_key"]) for position, row in stored
                   if row["unit_status"] in SETTLING]
        answered = []
        for (at, _, _), row in merged.values():
            later = [key for s, unit, key in settled if unit == row["unit_ref"] and s > at]
            by_other_key = any(key != row["derivation_key"] for key in later)
            open_marker = row["kind"] == "marker" and row["unit_status"] not in SETTLING and bool(later)
            if not (by_other_key or open_marker or row["unit_status"] == RETIRED):
                answered.append(row)
        return rows_of(answered)


def rows_of(rows: list[Row]) -> list[tuple]:
    return sorted(tuple(row[c] for c in SCHEMA.names) for row in rows)


def read(con: duckdb.DuckDBPyConnection, snapshot: Snapshot) -> list[tuple]:
    sql = snapshot_sql(snapshot, con)
    if sql is None:
        return []
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return rows_of([dict(zip(names, r)) for r in cursor.fetchall()])


def check(store: Store, con: duckdb.DuckDBPyConnection, model: Model) -> None:
    table = store.table("t")
    assert table.head.commit_seq == model.head
    for seq in range(1, model.head + 1):
        assert read(con, table.snapshot(seq)) == model.answer(seq), f"snapshot {seq} of {model.head}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=8))
@example([("land", [[("u0", "A", 0, "ok", "passage"), ("u0", "A", 1, "ok", "passage")]]),
          ("land", [[("u0", "B", 0, "ok", "passage"), ("u1", "A", 0, "failed", "marker")]]),
          ("fold", (1, 1)),
          ("land", [[("u0", "A", 0, "empty", "marker")], [("u1", "A", 0, "ok", "passage")]]),
          ("land", [[("u0", "C", 0, "unavailable", "marker"), ("u1", "B", 1, "ok", "passage")]]),
          ("fold", (2, 1))])
@example([("land", [[("u0", "A", 0, "ok", "passage"), ("u0", "A", 1, "ok", "passage")] + PADDING]),
          ("land", [[("u0", "B", 0, "failed", "marker")]]),
          ("land", [[("u0", "C", 0, RETIRED, "marker")]]),  # the parent left: nothing of u0 answers
          ("fold", (1, 1)),  # the retirement folds after a larger part holding u0's rows: held
          ("land", [[("u0", "A", 0, "ok", "passage")]]),  # the parent came back
          ("fold", (7, 1))])
def test_every_snapshot_answers_the_supersede_rule_before_and_after_every_fold(ops: list) -> None:
    run_history(ops)


def run_history(ops: list) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = Store.open(root, clock=ManualClock(), durable=False)
        set_policy(store, CompactionPolicy(enabled=False))  # the oracle counts commits: only explicit folds
        con = store.duckdb()
        try:
            store.create_table("t", KEY, supersede=RULE)
            model = Model()
            next_id = 0
            for op, arg in ops:
                if op == "land":
                    parts = []
                    for spec in arg:
                        part = [dict(zip(SCHEMA.names, (*r, next_id + i))) for i, r in enumerate(spec)]
                        next_id += len(part)
                        parts.append(part)
                    txn = store.table("t").transaction("append")
                    for part in parts:
                        txn.stage(pa.Table.from_pylist(part, schema=SCHEMA))
                    txn.commit()
                    model.land(parts)
                else:
                    reach, min_parts = arg
                    sizes = sorted({p.bytes for p in store.table("t").snapshot().parts})
                    if not sizes:
                        continue
                    cuts = [*sizes, sizes[-1] + 1]
                    before = read(con, store.table("t").snapshot())
                    if store.fold("t", small_bytes=cuts[reach % len(cuts)], min_parts=min_parts) is not None:
                        model.commits.append([])
                        assert read(con, store.table("t").snapshot()) == before
                check(store, con, model)
            table = store.table("t")  # the public readers answer the head the same way
            assert rows_of(table.to_arrow().to_pylist()) == model.answer(model.head)
            assert table.count() == len(model.answer(model.head))
        finally:
            con.close()
            store.close()
