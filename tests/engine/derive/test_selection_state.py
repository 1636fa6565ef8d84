"""Property: the selection's one-scan read of the output table (``engine.derive.select.settled_sql``)
settles exactly the (unit, key) pairs a reader under the supersede rule finds settled, at every
snapshot and across folds (``run.select.anti-join``, ``run.select.key-change``), read whole or
restricted to some units (the revival check of ``run.emit.settled-revived``)."""

from __future__ import annotations

import tempfile
from typing import Any

import pyarrow as pa
from contextful.engine.derive.select import DONE, settled_sql
from contextful.storage import ManualClock, Store
from contextful.storage.snapshot import snapshot_sql
from contextful.storage.supersede import Supersede
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

SCHEMA = pa.schema({"unit_ref": pa.string(), "derivation_key": pa.string(), "cue_seq": pa.int64(),
                    "kind": pa.string(), "unit_status": pa.string(), "retry": pa.bool_(), "attempts": pa.int64()})
row = st.tuples(st.sampled_from(["u0", "u1", "u2"]), st.sampled_from(["A", "B", "C"]), st.integers(-1, 1),
                st.sampled_from(["ok", "empty", "failed", "unavailable"]), st.booleans(), st.integers(1, 3))
operation = st.one_of(st.tuples(st.just("land"), st.lists(row, min_size=1, max_size=5)),
                      st.tuples(st.just("fold"), st.just([])))


def _batch(rows: list[tuple[Any, ...]]) -> pa.Table:
    cols: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for unit, key, cue, status, retry, attempts in rows:
        kind = "marker" if cue == -1 else "passage"
        for name, value in zip(SCHEMA.names, (unit, key, cue, kind, "ok" if kind == "passage" else status,
                                              retry if kind == "marker" else None, attempts)):
            cols[name].append(value)
    return pa.table(cols, schema=SCHEMA)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=6))
@example(ops=[("land", [("u1", "A", -1, "ok", False, 1)]), ("land", [("u1", "A", -1, "failed", True, 1)])])  # merged away
@example(ops=[("land", [("u0", "A", 0, "ok", False, 1)]), ("land", [("u0", "B", 0, "ok", False, 1)]),
              ("land", [("u0", "A", -1, "failed", True, 2)]), ("fold", [])])  # A, B, then A failing
def test_the_one_scan_state_settles_what_a_reader_under_the_rule_finds_settled(ops: list[tuple[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = Store.open(root, clock=ManualClock(1_700_000_000_000_000))
        try:
            table = store.create_table("out", ("unit_ref", "derivation_key", "cue_seq"),
                                       supersede=Supersede(("unit_ref",)))
            for op, rows in ops:
                if op == "land":
                    table.append(_batch(rows))
                else:
                    store.fold("out", min_parts=2)
                snap = store.table("out").snapshot()
                if not snap.parts:
                    continue
                con = store.duckdb()
                try:
                    read = snapshot_sql(snap, con)
                    expected = {(u, k) for u, k, settled in con.sql(
                        f"SELECT unit_ref, derivation_key, bool_or({DONE}) FROM ({read}) GROUP BY ALL").fetchall()
                        if settled}
                    # the selection's own join: every (unit, key) a parent could hold as its current key
                    every = "SELECT u AS unit_ref, k AS derivation_key FROM (VALUES ('u0'), ('u1'), ('u2')) AS a(u), " \
                            "(VALUES ('A'), ('B'), ('C')) AS b(k)"
                    joined = {(u, k) for u, k, settled in con.sql(
                        f"SELECT unit_ref, derivation_key, settled FROM ({settled_sql(every, [], snap, ('unit_ref',), None)})"
                    ).fetchall() if settled}
                    # the revival check reads only the units it asks about
                    some = f"SELECT * FROM ({every}) WHERE unit_ref <> 'u1'"
                    asked = settled_sql(some, [], snap, ("unit_ref",), None, restrict="SELECT 'u0' UNION ALL SELECT 'u2'")
                    restricted = {(u, k) for u, k, settled in con.sql(
                        f"SELECT unit_ref, derivation_key, settled FROM ({asked})").fetchall() if settled}
                finally:
                    con.close()
                assert joined == expected, (ops, joined, expected)
                assert restricted == {(u, k) for u, k in expected if u != "u1"}, (ops, restricted, expected)
        finally:
            store.close()
