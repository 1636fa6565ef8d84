"""The reserved ``_items`` table over real stores (SQLite and PostgreSQL catalogs).

``run.items.outcome-record``: one row per terminal item with exactly the listed fields, landing in
the same catalog commit as its receipt and the item's output rows, never lost or doubled across a
crash or a replay. ``run.items.terminal-outcome``: the outcome is an ItemTerminal, ``exhausted`` on
the attempt spending the retry budget, the reason its failure tag and capped message.
``run.items.served-key``: keys land as the input relation served them — a credential the landing
guard masked stays masked, and a key handed over in the clear lands under the same rule.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.read import connect
from contextful.engine.run.items import (
    ERROR_CAP_BYTES,
    ITEMS_SCHEMA,
    ItemOutcomes,
    ItemTerminal,
    terminal_outcome,
)
from contextful.engine.run.retry import RetrySchedule
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store
from contextful.storage.clock import ManualClock
from contextful.storage.commits import AssertHeadSeq
from contextful.storage.errors import ArgumentInvalid, CommitConflict, RateLimited
from contextful.storage.reserved import ITEMS_TABLE

from tests.support.cli import contextful

T0 = 1_900_000_000_000_000
FIELDS = ["job", "logical_key", "entity_namespace", "entity_key", "attempts", "outcome", "reason",
          "attempt_run_id", "execution_id", "ended_at"]
SECRET = "AKIA" + "Z7QX" * 4  # an AWS access key id the guard's catalogue masks


def items(store: Store) -> list[dict]:
    con = connect(store)
    try:
        return con.sql("SELECT * FROM _items ORDER BY attempt_run_id").to_arrow_table().to_pylist()
    finally:
        con.close()


def output_txn(store: Store, rows: list[dict]):
    txn = store.create_table("screen_result", ["pass_id"]).transaction()
    txn.stage(pa.Table.from_pylist(rows))
    return txn


@pytest.mark.clause("run.items.outcome-record")
def test_a_terminal_item_lands_one_row_with_its_receipt_and_output_in_one_commit(store: Store) -> None:
    assert items(store) == []  # the reserved table reads empty before any item ended
    outcomes = ItemOutcomes(store, "stage-screen")
    outcomes.record("p-7", entity=("entity", "e-1"), attempts=2, outcome=ItemTerminal.COMPLETED,
                    attempt_run_id="item-aa01", execution_id="x-7f3a", ended_us=T0)
    results = outcomes.commit(output_txn(store, [{"pass_id": "p-7", "proceed": True}]))
    assert [r.table for r in results] == ["screen_result", ITEMS_TABLE]
    [row] = items(store)
    assert list(row) == FIELDS
    assert {k: v for k, v in row.items() if k != "ended_at"} == {
        "job": "stage-screen", "logical_key": "p-7", "entity_namespace": "entity", "entity_key": "e-1",
        "attempts": 2, "outcome": "completed", "reason": None, "attempt_run_id": "item-aa01",
        "execution_id": "x-7f3a"}
    assert int(row["ended_at"].timestamp() * 1_000_000) == T0
    assert outcomes.receipt("p-7") == {"outcome": "completed", "attempts": 2, "attempt_run_id": "item-aa01",
                                       "execution_id": "x-7f3a"}
    # one catalog commit: the output run and the _items run carry the same transaction time
    out, ledger = store.table("screen_result").commits()[-1], store.table(ITEMS_TABLE).commits()[-1]
    assert out.committed_us == ledger.committed_us

    # an output run that cannot land takes the item's row and receipt with it (and the reverse)
    again = ItemOutcomes(store, "stage-screen")
    again.record("p-8", attempts=1, outcome="completed", attempt_run_id="item-aa02", execution_id="x-7f3b",
                 ended_us=T0)
    doomed = output_txn(store, [{"pass_id": "p-8", "proceed": False}])
    doomed.add_to_commit((AssertHeadSeq(99),))
    with pytest.raises(CommitConflict):
        again.commit(doomed)
    doomed.abort()
    assert [r["logical_key"] for r in items(store)] == ["p-7"] and again.receipt("p-8") is None
    assert store.table("screen_result").count() == 1


@pytest.mark.clause("run.items.outcome-record")
def test_a_crash_before_the_commit_loses_nothing_and_a_replay_doubles_nothing(store: Store) -> None:
    def attempt() -> ItemOutcomes:
        outcomes = ItemOutcomes(store, "score")
        for n in range(3):
            outcomes.record(f"doc-{n}", attempts=1, outcome="completed", attempt_run_id=f"item-{n}",
                            execution_id="x-1", ended_us=T0 + n)
        return outcomes

    # the process dies after staging the _items run, before its commit: nothing is visible
    crashed = attempt()
    staged = store.reserved_table(ITEMS_TABLE, ("job", "attempt_run_id")).transaction(
        "append", run_id=crashed.run_id())
    staged.stage(pa.Table.from_pylist([i.to_row() for i in crashed.pending], schema=ITEMS_SCHEMA))
    assert items(store) == [] and crashed.receipt("doc-0") is None
    # the replayed attempt lands them once; a replay after that landing lands nothing again
    [first] = attempt().commit()
    assert first.table == ITEMS_TABLE and first.run_id == crashed.run_id()
    assert attempt().commit() == []
    more = attempt()  # a later batch repeating landed items beside a new one lands only the new row
    more.record("doc-3", attempts=2, outcome="completed", attempt_run_id="item-3", execution_id="x-2", ended_us=T0)
    [later] = more.commit()
    assert later.rows == 1
    assert [r["logical_key"] for r in items(store)] == ["doc-0", "doc-1", "doc-2", "doc-3"]
    assert len(store.table(ITEMS_TABLE).commits()) == 2


@pytest.mark.clause("run.items.terminal-outcome")
def test_the_attempt_spending_the_retry_budget_is_exhausted_and_the_reason_is_tagged_and_capped(
        local_store: Store) -> None:
    schedule = RetrySchedule(attempts=3, base_s=0.0, jitter=0.0, sleep=lambda _s: None)
    verdicts: list[ItemTerminal | None] = []

    def call(attempt: int) -> None:
        error = RateLimited("stages", 1.0, "429 " + "slow down " * 300)
        verdicts.append(terminal_outcome(error, attempt, schedule.attempts))
        raise error

    with pytest.raises(RateLimited) as failed:
        schedule.run("row/p-7/delegate", call)
    assert verdicts == [None, None, ItemTerminal.EXHAUSTED]  # only the budget-spending attempt is terminal
    outcomes = ItemOutcomes(local_store, "stage-screen")
    spent = outcomes.record("p-7", attempts=3, outcome=verdicts[-1], attempt_run_id="item-3",
                            execution_id="x-1", ended_us=T0, error=failed.value)
    refused = ValueError("subject withdrawn")
    assert terminal_outcome(refused, 1, 3) is ItemTerminal.PERMANENT
    outcomes.record("p-9", attempts=1, outcome=ItemTerminal.PERMANENT, attempt_run_id="item-9",
                    execution_id="x-1", ended_us=T0, error=refused)
    outcomes.commit()
    rows = {r["logical_key"]: r for r in items(local_store)}
    assert rows["p-7"]["outcome"] == "exhausted" and rows["p-9"]["outcome"] == "permanent"
    assert {r["outcome"] for r in rows.values()} <= {t.value for t in ItemTerminal}
    tag, message = rows["p-7"]["reason"].split(": ", 1)
    assert tag == "RateLimited" and message.startswith("stages: rate limited")
    assert len(message.encode()) <= ERROR_CAP_BYTES < len(failed.value.detail.encode()) and message.endswith("…")
    assert rows["p-9"]["reason"] == "ValueError: subject withdrawn" and spent.reason == rows["p-7"]["reason"]
    with pytest.raises(ArgumentInvalid, match="outcome"):
        outcomes.record("p-1", attempts=1, outcome="skipped", attempt_run_id="i", execution_id="x", ended_us=T0)
    with pytest.raises(ArgumentInvalid, match="needs the error"):
        outcomes.record("p-1", attempts=3, outcome="exhausted", attempt_run_id="i", execution_id="x", ended_us=T0)


MANIFEST = """
[project]
name = "items"

[[pipeline]]
id = "due_items"
table = "due_items"
primary_key = ["pass_id"]
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


@pytest.mark.clause("run.items.served-key")
def test_keys_land_as_the_input_relation_served_them_never_in_the_clear(tmp_path: Path, decoder: Decoder) -> None:
    root = tmp_path / "project"
    (root / "raw").mkdir(parents=True)
    (root / "contextful.toml").write_text(MANIFEST)
    rows = [{"pass_id": f"p-{SECRET}", "entity_id": f"token {SECRET}"}, {"pass_id": "p-2", "entity_id": "e-2"}]
    (root / "raw" / "due.ndjson").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = Store.open(root / ".contextful" / "store", clock=ManualClock(T0))
    try:
        run_pipelines(store, load_manifest(root), decoder=decoder)
        con = connect(store)  # the job's input relation: its statement over the landed source
        served = con.sql("SELECT entity_id, pass_id FROM due_items ORDER BY entity_id DESC").fetchall()
        con.close()
        assert SECRET not in repr(served) and "[masked:aws-access-key-id]" in served[0][1]
        outcomes = ItemOutcomes(store, "stage-screen")
        for n, (entity_id, pass_id) in enumerate(served):
            outcomes.record(pass_id, entity=("entity", entity_id), attempts=1, outcome="completed",
                            attempt_run_id=f"item-{n}", execution_id="x-1", ended_us=T0)
        # a writer handed the key in the clear lands it under the source's rule all the same
        outcomes.record(f"p-{SECRET}", entity=("entity", f"token {SECRET}"), attempts=1, outcome="completed",
                        attempt_run_id="item-raw", execution_id="x-2", ended_us=T0)
        outcomes.commit()
        landed = items(store)
        assert [(r["entity_key"], r["logical_key"]) for r in landed[:2]] == served
        assert landed[2]["logical_key"] == served[0][1]  # the same masked, digest-suffixed key
        assert landed[2]["entity_key"].startswith("token [masked:aws-access-key-id]")
        assert outcomes.receipt(served[0][1]) is not None  # the receipt is found under the served key
        for part in store.catalog.live_parts(ITEMS_TABLE, store.table(ITEMS_TABLE).head.commit_seq):
            assert SECRET.encode() not in store.objects.get_bytes(part.path)
    finally:
        store.close()
    answer = contextful(root, "--json", "sql", "SELECT logical_key, entity_key, outcome FROM _items")
    assert SECRET not in answer.stdout and answer.stdout.count("[masked:aws-access-key-id]") == 4
