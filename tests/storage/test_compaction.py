"""Automatic compaction (``storage.compaction``): bounded parts, unchanged answers, writers unharmed.

- Over many one-row commits the live part count stays logarithmic and each row is rewritten a
  logarithmic number of times.
- Two stores receive the same history, one with the policy on and one with it off: every table
  (plain, keyed, keyed with a late ``order_by``, supersede-ruled) answers the same at the head and as
  of every earlier instant.
- A fold that loses a race to another writer is dropped: the other writer's commit lands, and so
  does the committing writer's own (SQLite and PostgreSQL).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.compaction import (
    STORE_KEY,
    CompactionPolicy,
    due_group,
    policy_for,
    set_policy,
    table_key,
)
from contextful.storage.snapshot import snapshot_sql
from contextful.storage.supersede import Supersede

from tests.storage.catalog_place import CatalogPlace
from tests.storage.hooked_catalog import Hooks


def live(store: Store, name: str) -> int:
    table = store.table(name)
    return len(store.catalog.live_parts(name, table.head.commit_seq))


def test_parts_stay_logarithmic_and_rows_are_rewritten_logarithmically(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s", clock=ManualClock(), durable=False)
    fanout, commits = 3, 150
    set_policy(store, CompactionPolicy(fanout=fanout))
    try:
        tiers = math.floor(math.log(commits, fanout)) + 1
        for i in range(commits):
            store.append("t", pa.table({"id": [i]}))
            assert live(store, "t") <= (fanout - 1) * tiers + fanout  # a pass folds one stretch
        assert store.table("t").to_arrow().column("id").to_pylist() == list(range(commits))
        rewritten = sum(c.rows for c in store.table("t").commits() if c.kind == "fold")
        assert rewritten <= commits * tiers
        assert live(store, "t") <= (fanout - 1) * tiers
    finally:
        store.close()


def test_policy_settings_per_store_and_table(tmp_path: Path) -> None:
    with Store.open(tmp_path / "s") as store:
        assert policy_for(store, "t") == CompactionPolicy()
        set_policy(store, CompactionPolicy(fanout=4))
        set_policy(store, CompactionPolicy(enabled=False, fanout=4), "quiet")
        assert policy_for(store, "t") == CompactionPolicy(fanout=4)
        assert policy_for(store, "quiet").enabled is False
        assert set(store.catalog.settings([STORE_KEY, table_key("quiet"), table_key("t")])) == {
            STORE_KEY, table_key("quiet")}
        for i in range(6):
            store.append("quiet", pa.table({"n": [i]}))
            store.append("t", pa.table({"n": [i]}))
        assert live(store, "quiet") == 6
        assert live(store, "t") < 6
        set_policy(store, None, "quiet")
        store.append("quiet", pa.table({"n": [6]}))
        assert live(store, "quiet") < 7
    with pytest.raises(ValueError):
        CompactionPolicy(fanout=1)


def test_due_group_folds_the_lowest_tier_first_and_leaves_large_parts() -> None:
    from contextful.storage.catalog import PartRow

    def part(i: int, rows: int, size: int = 100) -> PartRow:
        return PartRow(f"p{i}", rows, size, i, None, i, 0, None, 1)

    policy = CompactionPolicy(fanout=2, small_bytes=1_000)
    assert due_group([part(1, 5), part(2, 1)], policy) is None  # one part of each tier
    parts = [part(1, 4), part(2, 4), part(3, 1), part(4, 1)]
    assert [p.path for p in due_group(parts, policy) or []] == ["p3", "p4"]
    big = [part(1, 1), part(2, 1, 5_000), part(3, 1)]
    assert due_group(big, policy) is None  # a large part splits the runs


def test_a_stretch_never_ends_inside_a_commit() -> None:
    """A commit is of the tier of its largest part and is folded whole or not at all, whatever its
    parts' tiers or sizes (issue 26: part of a commit folded with older commits moved their landings
    level with the rest of it)."""
    from contextful.storage.catalog import PartRow

    def part(name: str, seq: int, idx: int, rows: int, size: int = 100) -> PartRow:
        return PartRow(name, rows, size, seq, None, seq, idx, None, 1)

    policy = CompactionPolicy(fanout=2, small_bytes=1_000)
    mixed = [part("c1", 1, 0, 1), part("c2a", 2, 0, 1), part("c2b", 2, 1, 2)]  # c2: tiers 0 and 1
    assert due_group(mixed, policy) is None  # tier 0: one commit; tier 1: one commit
    three = [*mixed, part("c3", 3, 0, 2)]
    assert [p.path for p in due_group(three, policy) or []] == ["c1", "c2a", "c2b", "c3"]
    with_large = [part("c1", 1, 0, 1), part("c2a", 2, 0, 1), part("c2b", 2, 1, 1, 5_000), part("c3", 3, 0, 1)]
    assert due_group(with_large, policy) is None  # c2 stays out whole: c1 and c3 are not consecutive


def test_the_parts_of_one_commit_are_left_as_their_writer_sized_them(tmp_path: Path) -> None:
    from contextful.storage.catalog import PartRow

    def part(i: int, seq: int) -> PartRow:
        return PartRow(f"p{i}", 100, 100, seq, None, seq, i, None, 1)

    policy = CompactionPolicy(fanout=4, small_bytes=1_000)
    assert due_group([part(i, 1) for i in range(10)], policy) is None  # one bulk commit, ten parts
    three_commits = [part(i, 1) for i in range(10)] + [part(10, 2), part(11, 3)]
    assert due_group(three_commits, policy) is None
    four_commits = [*three_commits, part(12, 4)]
    assert [p.path for p in due_group(four_commits, policy) or []] == [f"p{i}" for i in range(13)]

    # through the store: a landing of ten small parts in one commit is not folded after it lands
    with Store.open(tmp_path / "s", durable=False) as store:
        set_policy(store, CompactionPolicy(fanout=4))
        table = store.create_table("bulk")
        with table.transaction() as txn:
            for i in range(10):
                txn.stage(pa.table({"id": [i]}))
        assert live(store, "bulk") == 10
        assert [c.kind for c in store.table("bulk").commits()] == ["append"]
        for i in range(3):
            store.append("bulk", pa.table({"id": [10 + i]}))
        assert live(store, "bulk") == 1  # four commits of tier-0 parts: one fold of all thirteen
        assert sorted(store.table("bulk").to_arrow().column("id").to_pylist()) == list(range(13))



def test_parts_a_writer_made_a_mebibyte_or_larger_are_never_rewritten(tmp_path: Path) -> None:
    """The default policy leaves mid-size appends as they landed (no row written twice), and still
    folds the small commits between them."""
    rng = np.random.default_rng(7)
    rows = 20_000

    def mid_size(i: int) -> pa.Table:  # incompressible bytes: the part encodes to over 1 MiB
        data = [rng.bytes(64) for _ in range(rows)]
        return pa.table({"i": [i] * rows, "s": data})

    with Store.open(tmp_path / "s", durable=False) as store:
        assert policy_for(store, "t").small_bytes == 1 << 20
        for i in range(12):
            store.append("t", mid_size(i))
        assert [c.kind for c in store.table("t").commits()] == ["append"] * 12
        head = store.catalog.load_head("t")
        assert head is not None
        parts = store.catalog.live_parts("t", head.commit_seq)
        assert len(parts) == 12 and min(p.bytes for p in parts) >= 1 << 20
        for i in range(8):  # eight one-row commits after them: one tier, folded once due
            store.append("t", pa.table({"i": [100 + i], "s": [b"x"]}))
        kinds = [c.kind for c in store.table("t").commits()]
        assert kinds.count("fold") == 1
        head = store.catalog.load_head("t")
        assert head is not None
        assert len(store.catalog.live_parts("t", head.commit_seq)) == 13  # the twelve, and the fold of eight
        assert store.table("t").to_arrow().num_rows == 12 * rows + 8

KEY = ("k",)
RULE = Supersede(("unit_ref",))
RULED_KEY = ("unit_ref", "derivation_key", "cue_seq")


def land(store: Store, step: int) -> None:
    """One step of a history exercising every kind of table."""
    k = step % 5
    store.append("plain", pa.table({"n": [step], "s": [f"v{step}"]}))
    store.create_table("keyed", KEY).append(pa.table({"k": [k], "v": [step]}))
    ordered = store.create_table("ordered", KEY)
    if step == 8:
        ordered.declare_order_by("ts")
    ordered.append(pa.table({"k": [k, (k + 1) % 5], "ts": [(step * 7) % 11, None], "v": [step, -step]}))
    status = "ok" if step % 3 else "failed"
    store.create_table("ruled", RULED_KEY, supersede=RULE).append(pa.table({
        "unit_ref": [f"u{step % 3}"], "derivation_key": ["AB"[step % 2]], "cue_seq": [step % 2],
        "unit_status": [status], "kind": ["passage" if step % 4 else "marker"], "v": [step]}))
    if step == 14:
        store.table("plain").replace(pa.table({"n": [-1], "s": ["reset"]}))


def rows(store: Store, con: duckdb.DuckDBPyConnection, name: str, as_of: int | None = None) -> list[tuple[Any, ...]]:
    sql = snapshot_sql(store.table(name).snapshot(as_of=as_of), con)
    return sorted(con.sql(sql).fetchall(), key=repr) if sql is not None else []


def test_answers_are_those_of_the_uncompacted_table_at_head_and_as_of_every_instant(tmp_path: Path) -> None:
    on, off = ManualClock(), ManualClock()
    with Store.open(tmp_path / "on", clock=on, durable=False) as compacted, \
            Store.open(tmp_path / "off", clock=off, durable=False) as plain:
        set_policy(compacted, CompactionPolicy(fanout=2))
        set_policy(plain, CompactionPolicy(enabled=False))
        instants = []
        for step in range(20):
            for store in (compacted, plain):
                land(store, step)
            on.advance(1)
            off.advance(1)
            instants.append(on.now_us())
        names = ("plain", "keyed", "ordered", "ruled")
        assert all(any(c.kind == "fold" for c in compacted.table(n).commits()) for n in names)
        assert not any(c.kind == "fold" for n in names for c in plain.table(n).commits())
        con = compacted.duckdb()
        for name in names:
            assert live(compacted, name) < live(plain, name)
            assert rows(compacted, con, name) == rows(plain, con, name)
            for instant in instants:
                assert rows(compacted, con, name, instant) == rows(plain, con, name, instant), (name, instant)
        con.close()


@pytest.mark.parametrize("rival", ["replace", "append"])
def test_a_fold_losing_a_race_is_dropped_and_no_writer_fails(place: CatalogPlace, rival: str) -> None:
    """Store A's commit makes a fold due; as A's pass begins the fold's commit, store B commits on
    its own connection: a replace (the fold's parts are gone: the fold is dropped, A's append still
    returns) or an append (nothing the fold needs moved: it lands after B's)."""
    hooks = Hooks()
    a = place.store(ManualClock(), hooks)
    b = place.store(ManualClock())
    try:
        set_policy(a, CompactionPolicy(fanout=3))
        a.append("t", pa.table({"n": [0]}))
        a.append("t", pa.table({"n": [1]}))
        landed: list[int] = []

        def rival_commits() -> None:  # the fold's parts are written just before its commit
            if any("/fold-" in o.key for o in a.objects.list("tables/t/parts/")):
                hooks.before_write = None
                table, data = b.table("t"), pa.table({"n": [100]})
                landed.append((table.replace(data) if rival == "replace" else table.append(data)).commit_seq)

        hooks.before_write = rival_commits
        result = a.append("t", pa.table({"n": [2]}))  # lands, then its pass folds the three parts
        assert landed == [4], "the rival did not commit during the fold"
        assert result.commit_seq == 3
        kinds = [c.kind for c in a.table("t").commits()]
        answer = sorted(a.table("t").to_arrow().column("n").to_pylist())
        if rival == "replace":
            assert kinds == ["append", "append", "append", "replace"]  # the fold was dropped
            assert answer == [100]
        else:
            assert kinds == ["append", "append", "append", "append", "fold"]
            assert answer == [0, 1, 2, 100]
    finally:
        a.close()
        b.close()


def test_folded_parts_hold_row_groups_of_many_rows_not_one_per_commit(tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    from contextful.storage.parts import ROW_GROUP_ROWS, write_part

    with Store.open(tmp_path / "s", durable=False) as store:
        set_policy(store, CompactionPolicy(fanout=4))
        for i in range(100):
            store.append("t", pa.table({"id": [i], "s": [f"v{i}"]}))
        table = store.table("t")
        live_parts = store.catalog.live_parts("t", table.head.commit_seq)
        assert any(p.rows > 1 for p in live_parts)  # the policy folded
        for part in live_parts:  # a DuckDB scan of one-row parts hands over one-row batches
            assert pq.ParquetFile(store.objects.path(part.path)).metadata.num_row_groups == 1, part
        assert sorted(table.to_arrow().column("id").to_pylist()) == list(range(100))

        rows = ROW_GROUP_ROWS * 2 + 5
        batches = (pa.record_batch({"id": list(range(start, min(start + 1000, rows)))})
                   for start in range(0, rows, 1000))
        part = write_part(store.objects, "tables/x/parts/r-00000.parquet", batches, pa.schema({"id": pa.int64()}),
                          durable=False)
        meta = pq.ParquetFile(store.objects.path(part.path)).metadata
        assert (part.rows, meta.num_row_groups) == (rows, 3)
        assert [meta.row_group(i).num_rows for i in range(3)] == [ROW_GROUP_ROWS, ROW_GROUP_ROWS, 5]
