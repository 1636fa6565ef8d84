"""Property: every snapshot of a plain or keyed table answers what the merge rules of docs/store.md
say, before and after every fold, explicit or automatic, however ``order_by`` is declared late
(issues 11 and 26: "an answer once given never changes", "a fold never changes an answer").

Hypothesis draws a table kind (plain, or keyed) and histories of appends and replaces (runs of one
to three parts of different sizes, so one commit's parts fall in different compaction tiers; keys
repeating within a part; stamps with ties and nulls; an ``order_by`` column that some parts of one
run lack, so a run's parts differ in schema), late ``order_by`` declarations (keyed tables), folds of
varying reach and changes of the automatic compaction policy (on throughout, its fanout and size
threshold redrawn). After every operation each snapshot 1..head is read and compared with an oracle
that implements the documented rule in plain Python, from the history alone:

- a snapshot reads the rows committed since the last replace at or below it;
- a plain table answers every one of them;
- below the declaration's commit (or without one) the latest row of a key by commit order wins;
- at or above it, the rows committed before the declaration count only through their commit-order
  winner, which competes with the rows committed after it: the largest ``order_by`` value wins (a
  null loses to any value), then the later by commit order.

Folds are commits that change nothing in the oracle, and every fold takes whole commits.

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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.storage.fold_checks import assert_folds_took_whole_commits, size_cut
from tests.support.soak import soak_long, trials

pytestmark = pytest.mark.slow

Row = dict[str, Any]
SCHEMA = pa.schema({"k": pa.int64(), "ts": pa.int64(), "u": pa.int64(), "id": pa.int64()})

keys = st.integers(0, 2)
stamps = st.none() | st.integers(0, 2)
batch = st.tuples(st.lists(st.tuples(keys, stamps, stamps), min_size=1, max_size=9), st.booleans())
run = st.lists(batch, min_size=1, max_size=3)
operation = st.one_of(
    st.tuples(st.just("append"), run),
    st.tuples(st.just("replace"), run),
    st.tuples(st.just("declare"), st.sampled_from(["ts", "u"])),
    st.tuples(st.just("fold"), st.tuples(st.integers(0, 7), st.integers(1, 2))),
    st.tuples(st.just("policy"), st.tuples(st.integers(0, 7), st.integers(2, 3))),
)


@dataclass
class Oracle:
    """The documented merge rule over the history, in plain Python."""

    keyed: bool = True
    commits: list[list[tuple[tuple[int, int, int], Row]]] = field(default_factory=list)
    """Per commit (seq = index + 1): its rows with their commit-order position, or [] for a
    declaration or a fold."""
    replaces: set[int] = field(default_factory=set)
    declared: tuple[int, str] | None = None

    @property
    def head(self) -> int:
        return len(self.commits)

    def land(self, kind: str, parts: list[list[Row]]) -> None:
        seq = self.head + 1
        self.commits.append([((seq, p, r), row) for p, part in enumerate(parts) for r, row in enumerate(part)])
        if kind == "replace":
            self.replaces.add(seq)

    def declare(self, column: str) -> None:
        if self.declared is None:
            self.declared = (self.head + 1, column)
            self.commits.append([])

    def answer(self, seq: int) -> list[tuple]:
        start = max([r for r in self.replaces if r <= seq], default=1)
        if not self.keyed:
            return sorted((tuple(row[c] for c in SCHEMA.names) for commit in self.commits[start - 1:seq]
                           for _, row in commit), key=by_id)
        by_key: dict[int, list[tuple[tuple[int, int, int], Row]]] = {}
        for commit in self.commits[start - 1:seq]:
            for position, row in commit:
                by_key.setdefault(row["k"], []).append((position, row))
        rule = self.declared if self.declared is not None and self.declared[0] <= seq else None
        winners = []
        for rows in by_key.values():
            rows.sort(key=lambda pr: pr[0])
            if rule is None:
                winners.append(rows[-1][1])
                continue
            declared_at, column = rule
            before = [pr for pr in rows if pr[0][0] < declared_at]
            candidates = before[-1:] + [pr for pr in rows if pr[0][0] > declared_at]
            best = max(candidates, key=lambda pr: (pr[1][column] is not None, pr[1][column] or 0, pr[0]))
            winners.append(best[1])
        return sorted((tuple(row[c] for c in SCHEMA.names) for row in winners), key=by_id)


def by_id(row: tuple) -> int:
    """A row's ``id``: unique to each landed row, so rows sort without comparing nulls."""
    return row[SCHEMA.names.index("id")]


def answered(rows: list[dict[str, Any]]) -> list[tuple]:
    return sorted((tuple(row.get(c) for c in SCHEMA.names) for row in rows), key=by_id)


def read(con: duckdb.DuckDBPyConnection, snapshot: Snapshot) -> list[tuple]:
    """What the snapshot's query answers (one connection for many: opening one costs ~0.1 s)."""
    sql = snapshot_sql(snapshot, con)
    if sql is None:
        return []
    cursor = con.execute(sql)
    names = [d[0] for d in cursor.description]
    return answered([dict(zip(names, row)) for row in cursor.fetchall()])


def to_parts(spec: list[tuple[list[tuple[int, int | None, int | None]], bool]], next_id: int) -> list[list[Row]]:
    parts = []
    for rows, with_u in spec:
        part = []
        for k, ts, u in rows:
            part.append({"k": k, "ts": ts, "u": u if with_u else None, "id": next_id, "_with_u": with_u})
            next_id += 1
        parts.append(part)
    return parts


def arrow(part: list[Row]) -> pa.Table:
    schema = SCHEMA if part[0]["_with_u"] else pa.schema([f for f in SCHEMA if f.name != "u"])
    return pa.table({c: [row[c] for row in part] for c in schema.names}, schema=schema)


def check(store: Store, con: duckdb.DuckDBPyConnection, oracle: Oracle) -> None:
    table = store.table("t")
    assert table.head.commit_seq == oracle.head
    for seq in range(1, oracle.head + 1):
        assert read(con, table.snapshot(seq)) == oracle.answer(seq), f"snapshot {seq} of {oracle.head}"


@pytest.mark.timeout(3600 if soak_long() else 900)
@settings(max_examples=trials(40, 1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(operation, min_size=1, max_size=8))
@example(True, [("append", [([(0, 1, None)], False)]),
                # one commit, a one-row part and a two-row part: tiers 0 and 1 at fanout 2
                ("append", [([(1, 0, None)], False), ([(0, 0, 0), (2, None, 1)], True)]),
                ("declare", "ts"), ("append", [([(0, 2, 2), (1, None, None)], True)])])
def test_every_snapshot_answers_the_documented_rule_before_and_after_every_fold(keyed: bool, ops: list) -> None:
    run_history(ops, keyed)


def run_history(ops: list, keyed: bool = True) -> None:
    """Apply ``ops`` to a table (keyed on ``k``, or plain) in a fresh local store, checking every
    snapshot after each."""
    with tempfile.TemporaryDirectory() as root:
        store = Store.open(root, clock=ManualClock(), durable=False)
        set_policy(store, CompactionPolicy(fanout=2))
        con = store.duckdb()
        key = ("k",) if keyed else ()
        try:
            store.create_table("t", key)
            oracle = Oracle(keyed)
            next_id = 0
            for op, arg in ops:
                if op in ("append", "replace"):
                    parts = to_parts(arg, next_id)
                    next_id += sum(len(p) for p in parts)
                    txn = store.table("t").transaction(op)
                    for part in parts:
                        txn.stage(arrow(part))
                    txn.commit()  # automatic compaction may fold after it
                    oracle.land(op, [[{c: row[c] for c in SCHEMA.names} for row in part] for part in parts])
                elif op == "declare":
                    if not keyed:
                        continue
                    store.create_table("t", key, order_by=arg)
                    oracle.declare(arg)
                elif op == "fold":
                    reach, min_parts = arg
                    store.fold("t", small_bytes=size_cut(store, "t", reach), min_parts=min_parts)
                else:
                    reach, fanout = arg
                    set_policy(store, CompactionPolicy(fanout=fanout, small_bytes=size_cut(store, "t", reach)), table="t")
                oracle.commits.extend([] for _ in range(store.table("t").head.commit_seq - oracle.head))  # folds
                check(store, con, oracle)
            assert_folds_took_whole_commits(store, "t")
            table = store.table("t")  # the public readers answer the head the same way
            assert answered(table.to_arrow().to_pylist()) == oracle.answer(oracle.head)
            assert table.count() == len(oracle.answer(oracle.head))
        finally:
            con.close()
            store.close()
