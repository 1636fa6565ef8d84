"""Property: a table with a supersede rule answers what docs/store.md ("Supersede rules") says at
every snapshot, before and after every fold, explicit or automatic (issues 16 and 26,
``run.emit.stale-supersedes``, ``run.emit.version-retained``).

Hypothesis draws a rule — per unit, or per unit and task version (``retain_versions``) — and
histories of landings: commits of one to three parts of rows of a few units under a few derivation
keys, passages and markers, statuses ok, empty, failed, unavailable and retired, primary keys repeating
within and across commits, parts of different sizes in one commit (some padded with rows of another
unit, so they fall in another compaction tier or count as too large to fold) and parts of one commit
that differ in schema (a column only some of them bring). Automatic compaction is on throughout, its
fanout and size threshold redrawn along the way, and explicit folds of varying reach come between
the landings. After every operation each snapshot 1..head is read and compared with a tiny model of
the rule in plain Python, from the landings alone:

- the key merge answers, per primary key, the latest row by commit order;
- a commit *settles* a unit under a key when it stored a row of the unit with status ok, empty or
  retired;
- an answered row is withheld when a later commit settled its unit under another key, when it is
  a marker whose status is not settling and a later commit settled its unit under any key, or when
  its status is retired (a retirement is never answered).

Folds are commits that change nothing in the model, and every fold takes whole commits.

Short form in the ordinary suite; ``CONTEXTFUL_SOAK=1`` draws many more histories.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.snapshot import Snapshot, snapshot_sql
from contextful.storage.supersede import RETIRED, SETTLING, Supersede
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.storage.fold_checks import assert_folds_took_whole_commits, size_cut
from tests.support.soak import soak_long, trials

pytestmark = pytest.mark.slow

Row = dict[str, Any]
KEY = ("unit_ref", "derivation_key", "cue_seq")
RULES = {"unit": Supersede(("unit_ref",)), "versions": Supersede(("unit_ref", "task_version"))}
"""The rule of a derive output table, and of one declaring ``retain_versions``."""
SCHEMA = pa.schema({"unit_ref": pa.string(), "derivation_key": pa.string(), "cue_seq": pa.int64(),
                    "unit_status": pa.string(), "kind": pa.string(), "task_version": pa.string(),
                    "id": pa.int64(), "note": pa.string()})
COLUMNS = tuple(SCHEMA.names)

row = st.tuples(st.sampled_from(["u0", "u1", "u2"]), st.sampled_from(["A", "B", "C"]), st.integers(0, 2),
                st.sampled_from(["ok", "empty", "failed", "unavailable", RETIRED]), st.sampled_from(["passage", "marker"]),
                st.sampled_from(["v1", "v2"]))
part = st.tuples(st.lists(row, min_size=1, max_size=4), st.booleans(), st.booleans())
"""A part's rows, whether it is padded (rows of another unit making it larger), whether it brings
the ``note`` column."""
landing = st.lists(part, min_size=1, max_size=3)
PADDING = [("w", "A", cue, "ok", "passage", "v1") for cue in range(40)]
operation = st.one_of(
    st.tuples(st.just("land"), landing),
    st.tuples(st.just("fold"), st.tuples(st.integers(0, 7), st.integers(1, 2))),
    st.tuples(st.just("policy"), st.tuples(st.integers(0, 7), st.integers(2, 3))),
)


def key_of(rule: Supersede) -> tuple[str, ...]:
    return KEY + tuple(u for u in rule.unit if u not in KEY)


@dataclass
class Model:
    """The documented rule over the landings, in plain Python."""

    rule: Supersede
    commits: list[list[tuple[tuple[int, int, int], Row]]] = field(default_factory=list)
    """Per commit (seq = index + 1): its rows with their commit-order position ([] for a fold)."""

    @property
    def head(self) -> int:
        return len(self.commits)

    def land(self, parts: list[list[Row]]) -> None:
        seq = self.head + 1
        self.commits.append([((seq, p, r), row) for p, part in enumerate(parts) for r, row in enumerate(part)])

    def answer(self, seq: int) -> list[tuple]:
        key = key_of(self.rule)
        stored = [(position, row) for commit in self.commits[:seq] for position, row in commit]
        merged: dict[tuple, tuple[tuple[int, int, int], Row]] = {}
        for position, row in sorted(stored, key=lambda pr: pr[0]):
            merged[tuple(row[k] for k in key)] = (position, row)

        def unit(row: Row) -> tuple:
            return tuple(row[u] for u in self.rule.unit)

        settled = [(position[0], unit(row), row["derivation_key"]) for position, row in stored
                   if row["unit_status"] in SETTLING]
        answered = []
        for (at, _, _), row in merged.values():
            later = [k for s, u, k in settled if u == unit(row) and s > at]
            by_other_key = any(k != row["derivation_key"] for k in later)
            open_marker = row["kind"] == "marker" and row["unit_status"] not in SETTLING and bool(later)
            if not (by_other_key or open_marker or row["unit_status"] == RETIRED):
                answered.append(row)
        return rows_of(answered)


def rows_of(rows: list[Row]) -> list[tuple]:
    return sorted(tuple(row.get(c) for c in COLUMNS) for row in rows)


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


@pytest.mark.timeout(3600 if soak_long() else 900)
@settings(max_examples=trials(30, 1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(RULES)), st.lists(operation, min_size=1, max_size=8))
@example("unit", [("land", [([("u0", "A", 0, "ok", "passage", "v1"), ("u0", "A", 1, "ok", "passage", "v1")],
                             False, False)]),
                  ("land", [([("u0", "B", 0, "ok", "passage", "v1"), ("u1", "A", 0, "failed", "marker", "v1")],
                             False, False)]),
                  ("fold", (1, 1)),
                  ("land", [([("u0", "A", 0, "empty", "marker", "v1")], False, False),
                            ([("u1", "A", 0, "ok", "passage", "v1")], False, False)]),
                  ("land", [([("u0", "C", 0, "unavailable", "marker", "v1"), ("u1", "B", 1, "ok", "passage", "v1")],
                             False, False)]),
                  ("fold", (2, 1))])
@example("unit", [("land", [([("u0", "A", 0, "ok", "passage", "v1")], False, False)]),
                  # one commit, a one-row part and a two-row part: tiers 0 and 1 at fanout 2
                  ("land", [([("u1", "A", 0, "ok", "passage", "v1")], False, False),
                            ([("u0", "B", 0, "ok", "passage", "v1"), ("u0", "B", 1, "ok", "passage", "v1")],
                             False, True)])])
@example("versions", [("land", [([("u0", "A", 0, "ok", "passage", "v1"), ("u0", "A", 1, "ok", "passage", "v2")],
                                 True, False)]),
                      ("land", [([("u0", "B", 0, "ok", "passage", "v1")], False, False)]),
                      ("land", [([("u0", "A", 0, "ok", "passage", "v1")], False, True)]),
                      ("fold", (1, 2)), ("fold", (7, 1))])
@example("unit", [("policy", (7, 2)),
                  # A (two passages, padded: larger than the rest), then B, then A again with one: B is
                  # superseded yet withholds the first A's second passage, which a fold leaving the
                  # padded part out must keep withheld
                  ("land", [([("u0", "A", 0, "ok", "passage", "v1"), ("u0", "A", 1, "ok", "passage", "v1")],
                             True, False)]),
                  ("land", [([("u0", "B", 0, "ok", "passage", "v1")], False, False)]),
                  ("land", [([("u0", "A", 0, "ok", "passage", "v1")], False, False)]),
                  ("fold", (1, 1)), ("fold", (2, 1)), ("fold", (7, 1))])
@example("unit", [("land", [([("u0", "A", 0, "ok", "passage", "v1"), ("u0", "A", 1, "ok", "passage", "v1")],
                             True, False)]),
                  ("land", [([("u0", "B", 0, "failed", "marker", "v1")], False, False)]),
                  ("land", [([("u0", "C", 0, RETIRED, "marker", "v1")], False, False)]),  # the parent left
                  ("fold", (1, 1)),  # the retirement folds after a larger part holding u0's rows
                  ("land", [([("u0", "A", 0, "ok", "passage", "v1")], False, False)]),  # the parent came back
                  ("fold", (7, 1))])
def test_every_snapshot_answers_the_supersede_rule_before_and_after_every_fold(rule: str, ops: list) -> None:
    run_history(RULES[rule], ops)


def run_history(rule: Supersede, ops: list) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = Store.open(root, clock=ManualClock(), durable=False)
        set_policy(store, CompactionPolicy(fanout=2))
        con = store.duckdb()
        try:
            store.create_table("t", key_of(rule), supersede=rule)
            model = Model(rule)
            next_id = 0
            for op, arg in ops:
                if op == "land":
                    parts, tables = [], []
                    for spec, padded, noted in arg:
                        rows = [*spec, *PADDING] if padded else spec
                        part = [dict(zip(COLUMNS, (*r, next_id + i, f"n{next_id + i}" if noted else None)))
                                for i, r in enumerate(rows)]
                        next_id += len(part)
                        parts.append(part)
                        schema = SCHEMA if noted else pa.schema([f for f in SCHEMA if f.name != "note"])
                        tables.append(pa.Table.from_pylist(part, schema=schema))
                    txn = store.table("t").transaction("append")
                    for table in tables:
                        txn.stage(table)
                    txn.commit()  # automatic compaction may fold after it
                    model.land(parts)
                elif op == "fold":
                    reach, min_parts = arg
                    store.fold("t", small_bytes=size_cut(store, "t", reach), min_parts=min_parts)
                else:
                    reach, fanout = arg
                    set_policy(store, CompactionPolicy(fanout=fanout, small_bytes=size_cut(store, "t", reach)), table="t")
                model.commits.extend([] for _ in range(store.table("t").head.commit_seq - model.head))  # folds
                check(store, con, model)
            assert_folds_took_whole_commits(store, "t")
            table = store.table("t")  # the public readers answer the head the same way
            assert rows_of(table.to_arrow().to_pylist()) == model.answer(model.head)
            assert table.count() == len(model.answer(model.head))
        finally:
            con.close()
            store.close()
