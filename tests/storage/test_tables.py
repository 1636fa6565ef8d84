"""Store table behaviours, run against every store kind: a local root with the SQLite catalog,
the PostgreSQL catalog, and an S3 root through s3fs (moto on loopback)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store, run_record
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.errors import (
    ModalityInvalid,
    SchemaIrreconcilable,
    SnapshotCollected,
    SnapshotNotFound,
    StagingFailed,
    TableNameInvalid,
)
from contextful.storage.manifest import manifest_key
from contextful.storage.reserved import RUNS_TABLE


def rows(table: pa.Table, *keys: str) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: tuple(r[k] for k in keys))


def test_append_runs_land_in_order_and_read_back(store: Store) -> None:
    first = store.append("events", pa.table({"id": [1, 2], "name": ["a", "b"]}))
    second = store.append("events", pa.table({"id": [3], "name": ["c"]}))
    assert (first.commit_seq, second.commit_seq) == (1, 2)
    assert (first.rows, second.rows) == (2, 1)
    table = store.table("events")
    assert rows(table.to_arrow(), "id") == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
    assert [c.run_id for c in table.commits()] == [first.run_id, second.run_id]


def test_manifest_holds_parts_schema_cursor_and_events(store: Store) -> None:
    store.append("events", pa.table({"id": pa.array([1], pa.int64())}))
    table = store.table("events")
    txn = table.transaction()
    txn.stage(pa.table({"id": pa.array([2.5]), "extra": ["x"]}))
    txn.stage(pa.table({"id": pa.array([3.5])}))
    txn.set_cursor("pipeline:events", {"field": "updated_at", "value": "2026-01-01"})
    result = txn.commit()
    manifest = table.manifest(result.run_id)
    assert manifest.run_id == result.run_id
    assert [p.rows for p in manifest.parts] == [1, 1]
    assert all(p.bytes > 0 and store.objects.exists(p.path) for p in manifest.parts)
    assert manifest.cursor == {"scope": "pipeline:events", "value": {"field": "updated_at", "value": "2026-01-01"}}
    assert [(e.path, e.source_type, e.landed_type) for e in manifest.downgrade_events] == [
        ("id", "double", "double")]
    assert table.cursor("pipeline:events") == ({"field": "updated_at", "value": "2026-01-01"}, result.commit_seq)
    assert [c["name"] for c in manifest.to_json()["columns"]] == ["id", "extra"]


@pytest.mark.clause("run.record.schema-diff-home")
def test_run_history_reads_downgrade_events_under_the_run_id(store: Store) -> None:
    store.append("events", pa.table({"n": pa.array([1], pa.int64())}))
    widened = store.append("events", pa.table({"n": pa.array([1.5], pa.float64())}))
    doc = store.table("events").manifest(widened.run_id).to_json()
    assert doc["run_id"] == widened.run_id
    assert doc["parts"] and doc["downgrade_events"] == [
        {"table": "events", "path": "n", "source_type": "double", "landed_type": "double",
         "reason": "column widened from int64 to double", "kind": "downgrade", "table_type": "int64"}]
    history = store.runs.history().to_pylist()
    commit_row = next(r for r in history if r["run_id"] == widened.run_id and r["phase"] == "commit")
    assert commit_row["downgrade_events"] == 1
    assert store.table("events").manifest(commit_row["run_id"]).downgrade_events == widened.downgrade_events


@pytest.mark.clause("run.record.schema-diff-shape")
def test_downgrade_event_names_table_path_types_and_reason_and_uncommitted_stage_adds_none(store: Store) -> None:
    base = pa.table({"payload": pa.array([{"n": 1, "items": [{"v": 1}]}],
                                         pa.struct([("n", pa.int32()), ("items", pa.list_(pa.struct([("v", pa.int32())])))]))})
    store.append("nested", base)
    table = store.table("nested")
    arriving = pa.table({"payload": pa.array([{"n": 2**40, "items": [{"v": 2.5}]}],
                                             pa.struct([("n", pa.int64()), ("items", pa.list_(pa.struct([("v", pa.float64())])))]))})

    abandoned = table.transaction()
    abandoned.stage(arriving)
    abandoned.abort()
    assert not store.objects.exists(manifest_key("nested", abandoned.run_id))
    assert all(r["phase"] == "plan" for r in store.runs.history().to_pylist() if r["run_id"] == abandoned.run_id)

    result = table.append(arriving)
    events = {(e.table, e.path, e.source_type, e.landed_type): e.reason for e in result.downgrade_events}
    assert events == {
        ("nested", "payload.n", "int64", "int64"): "column widened from int32 to int64",
        ("nested", "payload.items[].v", "double", "double"): "column widened from int32 to double",
    }
    all_events = [e for c in table.commits() for e in table.manifest(c.run_id).downgrade_events]
    assert len(all_events) == 2  # the aborted stage contributed none
    assert table.count() == 2


@pytest.mark.clause("run.land.irreconcilable-schema")
def test_irreconcilable_schema_fails_the_batch_as_incompatible_and_lands_nothing(store: Store) -> None:
    store.append("events", pa.table({"id": [1], "tags": [["a"]]}))
    table = store.table("events")
    with pytest.raises(SchemaIrreconcilable) as info:
        table.append(pa.table({"id": [2], "tags": ["not-a-list"]}))
    assert info.value.category == "incompatible"
    assert info.value.table == "events" and info.value.path == "tags"
    assert "large_string" in info.value.arriving_type or "string" in info.value.arriving_type
    assert table.refresh().commit_seq == 1
    assert table.count() == 1
    parts = store.objects.list("tables/events/parts")
    assert len(parts) == 1  # the failed batch staged nothing


def test_new_columns_join_nullable_and_old_rows_read_null(store: Store) -> None:
    store.append("t", pa.table({"a": [1]}))
    store.append("t", pa.table({"a": [2], "b": [{"x": "q"}]}))
    store.append("t", pa.table({"a": [3], "b": [{"x": "r", "y": 5}]}))
    table = store.table("t")
    assert [f.nullable for f in table.schema] == [True, True]
    assert rows(table.to_arrow(), "a") == [
        {"a": 1, "b": None}, {"a": 2, "b": {"x": "q", "y": None}}, {"a": 3, "b": {"x": "r", "y": 5}}]


def test_replace_run_answers_only_its_rows_and_keeps_history(store: Store) -> None:
    store.append("dim", pa.table({"k": [1, 2]}))
    store.append("dim", pa.table({"k": [3]}))
    table = store.table("dim")
    replaced = table.replace(pa.table({"k": [9]}))
    assert table.to_arrow().to_pylist() == [{"k": 9}]
    assert sorted(table.to_arrow(commit_seq=2).column("k").to_pylist()) == [1, 2, 3]
    assert replaced.commit_seq == 3


def test_primary_key_resolves_latest_per_key_by_commit_order_and_fold_keeps_answers(store: Store) -> None:
    table = store.create_table("users", primary_key=["id"])
    table.append(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    table.append(pa.table({"id": [2, 4], "v": ["B", "d"]}))
    table.append(pa.table({"id": [1, 1], "v": ["x", "A"]}))  # within a run, the later row wins
    expected = [{"id": 1, "v": "A"}, {"id": 2, "v": "B"}, {"id": 3, "v": "c"}, {"id": 4, "v": "d"}]
    assert rows(table.to_arrow(), "id") == expected
    before = {seq: rows(table.to_arrow(commit_seq=seq), "id") for seq in (1, 2, 3)}
    folded = store.fold("users")
    assert folded is not None and folded.parts_removed == 3 and folded.parts_added == 1
    assert len(table.snapshot().parts) == 1
    assert rows(table.to_arrow(), "id") == expected
    assert {seq: rows(table.to_arrow(commit_seq=seq), "id") for seq in (1, 2, 3)} == before
    table.append(pa.table({"id": [3], "v": ["C"]}))
    assert rows(table.to_arrow(), "id")[2] == {"id": 3, "v": "C"}


def test_snapshots_at_head_seq_and_as_of(make_store, store_kind: str) -> None:
    clock = ManualClock()
    store = make_store(clock=clock)
    store.append("t", pa.table({"n": [1]}))
    clock.advance(60)
    after_first = clock.now_us()
    clock.advance(60)
    store.append("t", pa.table({"n": [2]}))
    table = store.table("t")
    assert table.to_arrow(as_of=after_first).column("n").to_pylist() == [1]
    assert sorted(table.to_arrow().column("n").to_pylist()) == [1, 2]
    assert table.to_arrow(commit_seq=1).column("n").to_pylist() == [1]
    with pytest.raises(SnapshotNotFound):
        table.snapshot(as_of=after_first - 3_600_000_000)
    with pytest.raises(SnapshotNotFound):
        table.snapshot(commit_seq=5)


def test_fold_compacts_small_parts_and_collection_removes_them_past_retention(make_store, store_kind: str) -> None:
    clock = ManualClock()
    store = make_store(clock=clock)
    for i in range(5):
        store.append("t", pa.table({"n": [i]}))
    table = store.table("t")
    old_parts = [p.path for p in table.snapshot().parts]
    store.fold("t")
    assert sorted(table.to_arrow().column("n").to_pylist()) == [0, 1, 2, 3, 4]
    assert store.collect(retain_seconds=3600, grace_seconds=0).removed_parts == []
    assert sorted(table.to_arrow(commit_seq=5).column("n").to_pylist()) == [0, 1, 2, 3, 4]
    clock.advance(7200)
    result = store.collect(retain_seconds=3600, grace_seconds=0)
    assert sorted(result.removed_parts) == sorted(old_parts)
    assert not any(store.objects.exists(p) for p in old_parts)
    assert sorted(table.to_arrow().column("n").to_pylist()) == [0, 1, 2, 3, 4]
    with pytest.raises(SnapshotCollected):
        table.to_arrow(commit_seq=5)


def test_collection_keeps_a_staging_run_and_removes_it_once_abandoned(store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, ManualClock)
    store.append("t", pa.table({"n": [1]}))
    txn = store.table("t").transaction()
    txn.stage(pa.table({"n": [2]}))
    assert txn.staged_rows == 1 and txn.staged_bytes > 0  # staged_bytes waits for the part written behind
    orphan = f"tables/t/parts/{txn.run_id}-00000.parquet"
    assert store.objects.exists(orphan)
    # A run still staging is known to the catalog: no grace period is needed to spare its parts.
    assert orphan not in store.collect(grace_seconds=0).orphans
    clock.advance(3 * 3600)  # hours of staging: each stage renews the lease
    txn.stage(pa.table({"n": [3]}))
    assert orphan not in store.collect(grace_seconds=0).orphans and store.objects.exists(orphan)
    # The process "died": it stages no more, and past its lease the parts are orphans.
    clock.advance(2 * 3600)
    result = store.collect(grace_seconds=0)
    assert orphan in result.orphans and not store.objects.exists(orphan)
    assert store.table("t").to_arrow().column("n").to_pylist() == [1]
    assert store.catalog.staging_runs("t") == []


@pytest.mark.clause("run.record.reserved-table")
def test_runs_holds_a_plan_and_a_commit_row_per_run_latest_per_phase_wins(store: Store) -> None:
    first = store.append("t", pa.table({"n": [1]}))
    second = store.append("t", pa.table({"n": [2, 3]}))
    assert store.runs.flush() == 4  # the cache holds both rows of both runs until the flush
    durable = store.table(RUNS_TABLE).to_arrow().to_pylist()
    by_key = {(r["run_id"], r["phase"]): r for r in durable}
    for result in (first, second):
        assert by_key[(result.run_id, "plan")]["status"] == "planned"
        commit = by_key[(result.run_id, "commit")]
        assert (commit["status"], commit["commit_seq"], commit["rows"]) == ("committed", result.commit_seq, result.rows)
    assert len(durable) == 4
    # the store's own record is an ordinary table with a reserved name, keyed on (run_id, phase)
    assert store.table(RUNS_TABLE).primary_key == ("run_id", "phase")
    # a newer row for the same run and phase wins over the older one
    store.catalog.record_run(first.run_id, "plan", "t", {"kind": "append", "status": "replanned",
                                                         "recorded_us": store.clock.now_us() + 1}, 0)
    store.runs.flush()
    plan_rows = [r for r in store.table(RUNS_TABLE).to_arrow().to_pylist()
                 if r["run_id"] == first.run_id and r["phase"] == "plan"]
    assert [r["status"] for r in plan_rows] == ["replanned"]


@pytest.mark.clause("run.record.reserved-table")
def test_catalog_cache_answers_before_the_record_is_flushed(store: Store) -> None:
    txn = store.create_table("t").transaction()  # the plan row is in the catalog cache only
    assert RUNS_TABLE not in store.table_names(include_reserved=True) or all(
        r["run_id"] != txn.run_id for r in store.table(RUNS_TABLE).to_arrow().to_pylist())
    history = store.runs.history().to_pylist()
    assert [(r["run_id"], r["phase"]) for r in history] == [(txn.run_id, "plan")]
    txn.stage(pa.table({"n": [1]}))
    txn.commit()
    assert store.runs.history().num_rows == 2
    assert store.runs.flush() == 2
    durable = {(r["run_id"], r["phase"]) for r in store.table(RUNS_TABLE).to_arrow().to_pylist()}
    assert durable == {(txn.run_id, "plan"), (txn.run_id, "commit")}


@pytest.mark.clause("run.record.reserved-table")
def test_closing_the_store_flushes_the_cache_and_age_triggers_a_flush(tmp_path) -> None:
    clock = ManualClock()
    store = Store.open(tmp_path / "s", clock=clock)
    first = store.append("t", pa.table({"n": [1]}))
    assert RUNS_TABLE not in store.table_names(include_reserved=True)  # batched: still cached
    clock.advance(store.runs.flush_age_seconds)
    store.append("t", pa.table({"n": [2]}))  # the oldest cached row is due: this append flushes
    assert store.table(RUNS_TABLE).count() == 4
    third = store.append("t", pa.table({"n": [3]}))
    store.close()
    reopened = Store.open(tmp_path / "s", clock=clock)
    durable = {(r["run_id"], r["phase"]) for r in reopened.table(RUNS_TABLE).to_arrow().to_pylist()}
    assert {(first.run_id, "commit"), (third.run_id, "plan"), (third.run_id, "commit")} <= durable
    assert len(durable) == 6
    reopened.close()


@pytest.mark.clause("run.record.record-folds")
def test_record_fold_failure_leaves_the_append_succeeding_and_the_next_append_retries(
        local_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store = local_store
    calls = {"failed": 0}
    real_fold = run_record.fold_table

    def failing_fold(*args, **kwargs):
        calls["failed"] += 1
        raise OSError("disk said no")

    store.runs.flush_rows = 1  # every append flushes its run's rows: one _runs part per run
    set_policy(store, CompactionPolicy(enabled=False), "t")  # t's own folds would add commits to count
    for i in range(run_record.FOLD_TRIGGER_PARTS - 1):
        store.append("t", pa.table({"n": [i]}))
    runs_parts = len(store.table(RUNS_TABLE).snapshot().parts)
    assert runs_parts == run_record.FOLD_TRIGGER_PARTS - 1
    monkeypatch.setattr(run_record, "fold_table", failing_fold)
    result = store.append("t", pa.table({"n": [99]}))  # this flush fires the trigger; the pass fails
    assert calls["failed"] == 1
    assert result.commit_seq == run_record.FOLD_TRIGGER_PARTS
    assert 99 in store.table("t").to_arrow().column("n").to_pylist()
    assert len(store.table(RUNS_TABLE).snapshot().parts) == run_record.FOLD_TRIGGER_PARTS
    assert (result.run_id, "commit") in {(r["run_id"], r["phase"]) for r in store.table(RUNS_TABLE).to_arrow().to_pylist()}
    monkeypatch.setattr(run_record, "fold_table", real_fold)
    store.append("t", pa.table({"n": [100]}))  # the next append retries the pass
    runs = store.table(RUNS_TABLE)
    assert len(runs.snapshot().parts) == 1
    assert runs.count() == 2 * (run_record.FOLD_TRIGGER_PARTS + 1)


@pytest.mark.clause("store.reserve.modality")
def test_modality_outside_the_five_fails_the_batch(store: Store) -> None:
    ok = pa.table({"text": ["a", "b", "c", "d", "e"], "_modality": ["text", "image", "audio", "structured", "mixed"]})
    store.append("passages", ok)
    table = store.table("passages")
    for bad in (["text", "video"], ["text", None]):
        with pytest.raises(ModalityInvalid) as info:
            table.append(pa.table({"text": ["x", "y"], "_modality": bad}))
        assert info.value.category == "spec-invalid"
        assert ("video" if "video" in bad else "null") in info.value.values
    assert table.count() == 5
    assert table.refresh().commit_seq == 1


def test_user_tables_cannot_take_reserved_or_odd_names(store: Store) -> None:
    for name in ("_runs", "_mine", "1abc", "a-b", ""):
        with pytest.raises(TableNameInvalid):
            store.create_table(name)


def test_polars_frames_land_as_arrow(store: Store) -> None:
    pl = pytest.importorskip("polars")
    store.append("t", pl.DataFrame({"a": [1, 2], "s": ["x", None]}))
    assert rows(store.table("t").to_arrow(), "a") == [{"a": 1, "s": "x"}, {"a": 2, "s": None}]


def test_parts_written_behind_stage_fail_at_commit_and_leave_nothing(local_store: Store) -> None:
    from contextful.storage.parts import part_key

    store = local_store
    assert store.writer_pool() is not None  # a local store writes parts behind the caller
    store.append("t", pa.table({"n": [0]}))
    txn = store.table("t").transaction()
    # A directory where the second part goes: its rename fails, the others are written.
    blocked = store.objects.path(part_key("t", txn.run_id, 1))
    os.makedirs(os.path.join(blocked, "x"))
    with pytest.raises(StagingFailed) as info:  # from a later stage call or the commit
        for n in range(4):
            txn.stage(pa.table({"n": [n + 1] * 10}))
        txn.commit()
    assert info.value.run_id == txn.run_id and info.value.key.endswith("-00001.parquet")
    txn.abort()
    written = [part_key("t", txn.run_id, i) for i in (0, 2, 3)]
    assert not any(store.objects.exists(k) for k in written)
    assert store.table("t").to_arrow().column("n").to_pylist() == [0]
    # Staged parts in order, each one written once it is asked for.
    txn = store.table("t").transaction()
    for n in range(6):
        txn.stage(pa.table({"n": [n] * 3}))
    assert txn.staged_rows == 18
    assert txn.commit().parts == 6
    assert store.table("t").to_arrow().column("n").to_pylist()[1:] == sorted([n for n in range(6)] * 3)


def test_a_table_with_order_by_merges_a_key_to_its_largest_stamp_then_commit_order(store: Store) -> None:
    t = store.create_table("m", ("k",), order_by="ts")
    assert t.head.order_by == "ts"
    t.append(pa.table({"k": [1, 2, 3], "ts": [5, 5, None], "v": ["a", "b", "c"]}))
    t.append(pa.table({"k": [1, 2, 3], "ts": [3, 5, 1], "v": ["older", "tie", "stamped"]}))
    want = {1: "a", 2: "tie", 3: "stamped"}  # larger stamp wins; a tie goes to the later commit; null loses
    assert {r["k"]: r["v"] for r in store.table("m").to_arrow().to_pylist()} == want
    assert store.table("m").count() == 3
    store.fold("m", small_bytes=1 << 30)  # a fold merges the same way and changes no answer
    assert {r["k"]: r["v"] for r in store.table("m").to_arrow().to_pylist()} == want
    # Without order_by the later commit wins, as before.
    plain = store.create_table("p", ("k",))
    plain.append(pa.table({"k": [1], "ts": [5], "v": ["a"]}))
    plain.append(pa.table({"k": [1], "ts": [3], "v": ["older"]}))
    assert store.table("p").to_arrow().column("v").to_pylist() == ["older"]
    # Declaring order_by later fills it once; a different one later does not replace it. The rows
    # before the declaration count through their commit-order winner (tests/storage/test_order_by.py).
    assert store.create_table("p", ("k",), order_by="ts").head.order_by == "ts"
    assert store.table("p").to_arrow().column("v").to_pylist() == ["older"]
    assert store.create_table("p", ("k",), order_by="v").head.order_by == "ts"
    # A reopened catalog reads the declaration back.
    assert store.catalog.load_head("m").order_by == "ts"
