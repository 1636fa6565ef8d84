"""Selection memory stays independent of archive size (decision "selection-stays-bounded"): past
its pass bound a selection joins its units in passes split by a hash of the unit id, and the passes
answer what one join answers — counted (a dry run), joined once for a run, and streamed — held here
to an oracle computed in Python from what the test landed."""

from __future__ import annotations

import hashlib
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from contextful.engine.derive.config import DeriveConfig
from contextful.engine.derive.keys import SEPARATOR
from contextful.engine.derive.select import Selection, SelectionCounts, counts_sql, settled_sql
from contextful.storage import ManualClock, Store
from contextful.storage.supersede import Supersede
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.derive.test_selection_state import _batch, operation

STATIC = "5" * 64
STALE = "a" * 64
OUTPUT = pa.schema({"unit_ref": pa.string(), "derivation_key": pa.string(), "cue_seq": pa.int64(),
                    "kind": pa.string(), "unit_status": pa.string(), "retry": pa.bool_(), "attempts": pa.int64()})
UNITS = 150_000
ORPHANS = 700


def _key(unit: str, media: str) -> str:
    """The unit's current key by the clause's recipe (engine.derive.keys), computed here."""
    parts = [STATIC, json.dumps(unit), json.dumps(media), "", "", ""]
    return hashlib.sha256(SEPARATOR.join(parts).encode()).hexdigest()


def _url(n: int) -> str:
    return f"https://example.invalid/{n}"


def _landed(store: Store) -> dict[str, int]:
    """Parents u00000... (the first 500 landed twice: one unit each, and one row without an id) and an
    output holding, by n mod 5: 0-2 a passage under the current key (settled; for n mod 10 = 0 a
    passage landed first under a stale key, then again under the current one), 3 a passage under a
    stale key, 4 a failed marker still retrying under the current key (its attempts carried); and
    ORPHANS units no parent names (retiring). Returns the outstanding units' attempts."""
    ids = [f"u{n:06d}" for n in range(UNITS)]
    store.append("docs", pa.table({"id": ids + ids[:500] + [None], "path": [_url(n) for n in range(UNITS)]
                                   + [_url(n) for n in range(500)] + [_url(0)]}))
    out = store.create_table("passages", ("unit_ref", "derivation_key", "cue_seq"),
                             supersede=Supersede(("unit_ref",)))
    rows: dict[str, list[object]] = {name: [] for name in OUTPUT.names}
    first: dict[str, list[object]] = {name: [] for name in OUTPUT.names}

    def add(into: dict[str, list[object]], unit: str, key: str, marker: bool = False, attempts: int = 1) -> None:
        for name, value in zip(OUTPUT.names, (unit, key, -1 if marker else 0, "marker" if marker else "passage",
                                              "failed" if marker else "ok", True if marker else None, attempts)):
            into[name].append(value)

    outstanding: dict[str, int] = {}
    for n, unit in enumerate(ids):
        current = _key(unit, _url(n))
        if n % 5 < 3:
            add(rows, unit, current)
            if n % 10 == 0:
                add(first, unit, STALE)
        elif n % 5 == 3:
            add(rows, unit, STALE)
            outstanding[unit] = 0
        else:
            add(rows, unit, current, marker=True, attempts=1 + n % 3)
            outstanding[unit] = 1 + n % 3
    for n in range(ORPHANS):
        add(rows, f"z{n:06d}", STALE)
    out.append(pa.table(first, schema=OUTPUT))
    out.append(pa.table(rows, schema=OUTPUT))
    return outstanding


def _selection(store: Store, root: Path, **bounds: Any) -> Selection:
    config = DeriveConfig("docs", "id", engine="lines", media_column="path")
    selection = Selection(store, "passages", "passages", config, STATIC, root, **bounds)
    # two threads, whatever the machine, and no spilling: the join state must fit the memory limit
    selection.con.execute("SET threads = 2")
    selection.con.execute("SET max_temp_directory_size = '0KB'")
    return selection


@pytest.mark.clause("run.select.dry-run", "run.select.anti-join")
def test_a_selection_past_its_pass_bound_joins_in_passes_within_a_memory_one_join_exceeds(
        store: Store, tmp_path: Path) -> None:
    outstanding = _landed(store)
    settled = UNITS - len(outstanding)
    with _selection(store, tmp_path, pass_units=6_000, memory_limit="50MB") as parted:
        assert parted.passes == 28  # 165,700 stored output rows, 6,000 units a pass
        counts = parted.counts()
        assert (counts.eligible, counts.derived, counts.outstanding, counts.retiring) == (
            UNITS, settled, len(outstanding), ORPHANS)
        streamed = {u: a for b in parted.outstanding()
                    for u, a in zip(b.column("unit_ref").to_pylist(), b.column("attempts").to_pylist())}
        assert streamed == outstanding
        # a run joins once and keeps the outstanding units (one pass's units at a time besides)
        assert parted.units() == SelectionCounts(UNITS, settled, len(outstanding))  # a run: joined once
        assert parted.counts() == counts
        joined = {u: a for b in parted.outstanding()
                  for u, a in zip(b.column("unit_ref").to_pylist(), b.column("attempts").to_pylist())}
        assert joined == outstanding
    # the same selection joined in one pass needs more than that memory (and may not spill)
    with _selection(store, tmp_path, memory_limit="50MB") as whole:
        assert whole.passes == 1
        with pytest.raises(duckdb.OutOfMemoryException):
            whole.counts()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=6), st.integers(2, 4))
def test_the_passes_settle_and_count_what_one_join_does_on_any_history(ops: list[tuple[str, Any]], passes: int) -> None:
    """Any history of landings and folds (tests/engine/derive/test_selection_state.py's): the units
    each pass settles, and the eligible / settled / retiring counts summed over the passes, are
    those of one join over every unit; the one join is held to a reader under the rule there."""
    every = ("SELECT u AS unit_ref, k AS derivation_key FROM (VALUES ('u0'), ('u1'), ('u3')) AS a(u), "
             "(VALUES ('A'), ('B')) AS b(k)")  # u2 is in the output only: retiring
    with tempfile.TemporaryDirectory() as root, Store.open(root, clock=ManualClock(1_700_000_000_000_000)) as store:
        store.create_table("out", ("unit_ref", "derivation_key", "cue_seq"), supersede=Supersede(("unit_ref",)))
        for op, rows in ops:  # a landing, or a fold of what landed so far
            _ = store.append("out", _batch(rows)) if op == "land" else store.fold("out", min_parts=2)
        snap = store.table("out").snapshot()
        if not snap.parts:
            return
        con = store.duckdb()

        def settled(part: str | None) -> set[tuple[str, str]]:
            keyed = f"SELECT * FROM ({every}) WHERE {part}" if part else every
            sql = settled_sql(keyed, [], snap, ("unit_ref",), None, part=part)
            return {(u, k) for u, k, done in con.sql(f"SELECT unit_ref, derivation_key, settled FROM ({sql})"
                                                     ).fetchall() if done}

        def counts(part: str | None) -> tuple[int, ...]:
            keyed = f"SELECT * FROM ({every}) WHERE {part}" if part else every
            [row] = con.sql(counts_sql(keyed, snap, ("unit_ref",), None, part=part)).fetchall()
            return tuple(row)

        parts = [f"hash(unit_ref) % {passes} = {i}" for i in range(passes)]
        with con:
            whole = settled(None)
            assert set().union(*(settled(p) for p in parts)) == whole, (ops, passes)
            assert tuple(map(sum, zip(*(counts(p) for p in parts)))) == counts(None), (ops, passes)


class _Profiled:
    """A selection's DuckDB connection that sums, over every query it finishes, what DuckDB's own
    counters say its scans read: the row groups scanned and the row groups their files hold."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.scanned = 0
        self.groups: list[int] = []
        con.execute("PRAGMA enable_profiling = 'no_output'")
        con.execute("SET profiling_mode = 'detailed'")

    def execute(self, sql: str) -> _Profiled:
        self.con.execute(sql)
        return self

    def fetchall(self) -> list[Any]:
        rows = self.con.fetchall()
        scans = list(_scans(json.loads(self.con.get_profiling_information(format="json"))))
        self.scanned += sum(int(s.get("row_groups_scanned", 0)) for s in scans)
        self.groups.append(sum(int(s.get("total_row_groups_to_scan", 0)) for s in scans))
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


def _scans(node: dict[str, Any]) -> Any:
    if node.get("type") == "TABLE_SCAN":
        yield node
    for child in node.get("children", node.get("operator", [])):
        yield from _scans(child)


@pytest.mark.clause("run.select.dry-run", "run.select.anti-join")
@pytest.mark.parametrize("order", ["ids in order", "ids shuffled"])
def test_each_pass_reads_only_the_row_groups_that_can_hold_its_units(store: Store, tmp_path: Path, order: str) -> None:
    """Parents landed in four runs and their output in four more, past the pass bound (four passes):
    with ids landed in order (sequential ids, as most sources land them) the passes together read
    each row group about once — a pass skips every group whose id range holds none of its units, by
    DuckDB's own counters — where a pass per hash of the id reads every group each pass; in any
    order the counts, the joined units and the outstanding stream are exact (a Python oracle)."""
    runs, per_run = 4, 3_000
    numbers = list(range(runs * per_run))
    if order == "ids shuffled":
        random.Random(7).shuffle(numbers)
    out = store.create_table("passages", ("unit_ref", "derivation_key", "cue_seq"), supersede=Supersede(("unit_ref",)))
    outstanding: dict[str, int] = {}
    for run in range(runs):
        chunk = numbers[run * per_run:(run + 1) * per_run]
        ids = [f"u{n:06d}" for n in chunk]
        store.append("docs", pa.table({"id": ids, "path": [_url(n) for n in chunk]}))
        rows: dict[str, list[object]] = {name: [] for name in OUTPUT.names}
        for n, unit in zip(chunk, ids):
            marker = n % 3 == 0  # a failed marker still retrying: outstanding, its attempts carried
            for name, value in zip(OUTPUT.names, (unit, _key(unit, _url(n)), -1 if marker else 0,
                                                  "marker" if marker else "passage", "failed" if marker else "ok",
                                                  True if marker else None, 1 + n % 2)):
                rows[name].append(value)
            if marker:
                outstanding[unit] = 1 + n % 2
        out.append(pa.table(rows, schema=OUTPUT))
    eligible, settled = runs * per_run, runs * per_run - len(outstanding)
    with _selection(store, tmp_path, pass_units=per_run) as selection:
        assert selection.passes == runs
        profiled = _Profiled(selection.con)
        selection.con = profiled  # type: ignore[assignment]
        assert selection.counts() == SelectionCounts(eligible, settled, len(outstanding), 0)
        groups = max(profiled.groups)
        assert groups >= 2 * runs  # every run landed a part of its own in each table: nothing to prune otherwise
        if order == "ids in order":
            # each pass's id range crosses at most one boundary between two runs' groups in each table
            assert profiled.scanned <= groups + 2 * (runs - 1), (profiled.scanned, groups)
        streamed = {u: a for b in selection.outstanding()
                    for u, a in zip(b.column("unit_ref").to_pylist(), b.column("attempts").to_pylist())}
        assert streamed == outstanding
        assert selection.units() == SelectionCounts(eligible, settled, len(outstanding))
        joined = {u: a for b in selection.outstanding()
                  for u, a in zip(b.column("unit_ref").to_pylist(), b.column("attempts").to_pylist())}
        assert joined == outstanding


landing = st.lists(st.tuples(st.integers(0, 30), st.booleans(), st.sampled_from(["passage", "ok", "failed", "stop"]),
                             st.integers(1, 3)), min_size=1, max_size=8)


@pytest.mark.clause("run.select.dry-run", "run.select.anti-join")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 24), min_size=1, max_size=12), min_size=1, max_size=3),
       st.lists(landing, max_size=4), st.integers(1, 6))
def test_passes_by_range_count_join_and_stream_what_one_join_does(
        tmp_path: Path, parents: list[list[int]], landings: list[Any], pass_units: int) -> None:
    """Any parents (ids repeated, landed in runs in any order) and any history of output landings (a
    passage, an ok marker, a failed one still retrying or one that stopped, under the unit's current
    key or a stale one, units no parent names among them): a selection split into ranges of ids,
    however many, counts, joins and streams exactly what one join over every unit does."""
    with tempfile.TemporaryDirectory() as root, Store.open(root, clock=ManualClock(1_700_000_000_000_000)) as store:
        for run in parents:
            store.append("docs", pa.table({"id": [f"u{n:02d}" for n in run], "path": [_url(n) for n in run]}))
        out = store.create_table("passages", ("unit_ref", "derivation_key", "cue_seq"), supersede=Supersede(("unit_ref",)))
        for rows in landings:
            cols: dict[str, list[object]] = {name: [] for name in OUTPUT.names}
            for n, current, status, attempts in rows:
                unit = f"u{n:02d}"
                passage = status == "passage"
                for name, value in zip(OUTPUT.names, (unit, _key(unit, _url(n)) if current else STALE,
                                                      0 if passage else -1, "passage" if passage else "marker",
                                                      "ok" if status in ("passage", "ok") else "failed",
                                                      None if passage else status == "failed", attempts)):
                    cols[name].append(value)
            out.append(pa.table(cols, schema=OUTPUT))

        def answers(**bounds: Any) -> tuple[int, SelectionCounts, dict[str, int], SelectionCounts, dict[str, int]]:
            with _selection(store, tmp_path, **bounds) as selection:
                counts = selection.counts()
                streamed = {u: a for b in selection.outstanding()
                            for u, a in zip(b.column("unit_ref").to_pylist(), b.column("attempts").to_pylist())}
                joined = selection.units()
                kept = {u: a for b in selection.outstanding()
                        for u, a in zip(b.column("unit_ref").to_pylist(), b.column("attempts").to_pylist())}
                return selection.passes, counts, streamed, joined, kept

        passes, *parted = answers(pass_units=pass_units)
        one, *whole = answers()
        assert one == 1
        assert parted == whole, (passes, parted, whole)
