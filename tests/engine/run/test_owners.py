"""Owner scopes and pins on every journal adapter, and the apply side's retirement of superseded
pending owners (``run.own.host-scope``, ``run.own.apply-retires-superseded``,
``run.own.apply-retire-refused``)."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest
from contextful.engine.run.bodies import IMPLEMENTATION_PIN, INPUT_PIN
from contextful.engine.run.execution import open_execution
from contextful.engine.run.owners import CHUNK, HOST, TABLE, AppliedDeclarations, Scope, retire_superseded
from contextful.storage import Store
from contextful.storage.clock import ManualClock
from contextful.storage.errors import ArgumentInvalid, OwnerPinsMismatch, OwnerPlanMismatch
from contextful.storage.journal import PENDING, RETIRED, JournalStore, open_journal_store

from tests.engine.run.test_rewind import MANIFEST
from tests.storage.test_journal_conformance import JournalSite
from tests.support.cli import contextful

PLAN, OTHER_PLAN, THIRD_PLAN = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.clause("run.own.host-scope")
def test_scopes_of_three_kinds_cannot_pass_for_one_another() -> None:
    stored = "pipeline:Orders/ü 2026\t#1"
    assert Scope.table(stored).key == stored and Scope.table(stored).kind == TABLE  # byte for byte
    host, chunk = Scope.host(stored), Scope.backfill_chunk(stored, "2026-01")
    assert {host.kind, chunk.kind} == {HOST, CHUNK}
    assert len({Scope.table(stored).key, host.key, chunk.key}) == 3  # same text, three owners
    assert Scope.parse(host.key) == host and Scope.parse(chunk.key) == chunk and Scope.parse(stored).kind == TABLE
    for bad in (lambda: Scope.table(host.key), lambda: Scope.table(chunk.key), lambda: Scope(TABLE, host.key),
                lambda: Scope(HOST, stored), lambda: Scope.host(""), lambda: Scope.backfill_chunk(stored, "")):
        with pytest.raises(ArgumentInvalid):
            bad()


@pytest.mark.clause("run.own.host-scope")
def test_a_host_owner_pins_its_plan_and_the_identities_the_host_supplies(journal: JournalStore, site: JournalSite,
                                                                         ) -> None:
    clock = ManualClock()
    pins = {"body.implementation": "d" * 64, "input": "orders@17"}
    first = open_execution(journal, Scope.host("nightly digest"), PLAN, holder="a", lease_s=30, clock=clock,
                           pins=pins)
    table = open_execution(journal, Scope.table("pipeline:Orders/ü"), PLAN, holder="a", lease_s=30, clock=clock)
    reopened = site.open()  # what another process reads from the catalog
    try:
        row = reopened.owner("host:nightly digest")
        assert row is not None and row.plan_ref == PLAN and row.pin_map() == pins
        assert row.execution_id == first.execution_id
        assert [o.scope for o in reopened.owners()] == ["host:nightly digest", "pipeline:Orders/ü"]
        assert reopened.owner("pipeline:Orders/ü").execution_id == table.execution_id  # type: ignore[union-attr]
    finally:
        reopened.close_store()

    clock.advance(31)  # the lease lapsed: a claim under other pins still refuses, naming both values
    with pytest.raises(OwnerPinsMismatch) as info:
        open_execution(journal, Scope.host("nightly digest"), PLAN, holder="b", lease_s=30, clock=clock,
                       pins={**pins, "input": "orders@18"})
    assert info.value.execution == first.execution_id
    assert "orders@17" in str(info.value) and "orders@18" in str(info.value)
    with pytest.raises(OwnerPlanMismatch):  # the plan reference is pinned as before
        open_execution(journal, Scope.host("nightly digest"), OTHER_PLAN, holder="b", lease_s=30, clock=clock,
                       pins=pins)
    resumed = open_execution(journal, Scope.host("nightly digest"), PLAN, holder="b", lease_s=30, clock=clock,
                             pins=dict(reversed(pins.items())))  # same pins, any order: the same execution
    assert resumed.execution_id == first.execution_id and resumed.attempt == 2


@pytest.mark.clause("run.own.host-scope")
def test_a_journal_made_before_pins_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("""CREATE TABLE cf_journal_owners (
            scope TEXT PRIMARY KEY, execution_id TEXT NOT NULL UNIQUE, plan_ref TEXT NOT NULL, status TEXT NOT NULL,
            holder TEXT, lease_expires_us BIGINT NOT NULL, opened_us BIGINT NOT NULL, closed_us BIGINT,
            cursor TEXT, attempts BIGINT NOT NULL, replay_from BIGINT NOT NULL)""")
        conn.execute("INSERT INTO cf_journal_owners VALUES ('pipeline:x', 'e1', ?, 'pending', 'h', 1, 0, NULL, NULL,"
                      " 1, 0)", (PLAN,))
    conn.close()
    journal = open_journal_store("sqlite", path=str(path))
    try:
        old = journal.owner("pipeline:x")
        assert old is not None and old.pin_map() == {} and old.execution_id == "e1"
        assert journal.claim("pipeline:x", PLAN, "h2", 10, 5).attempts == 2  # resumable with no pins, as before
    finally:
        journal.close_store()


@pytest.mark.clause("run.own.host-scope")
def test_run_executions_lists_each_owners_scope_kind_and_pins(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    with Store.open(tmp_path / ".contextful" / "store") as store:
        table = open_execution(store.journal, Scope.table("pipeline:events"), PLAN, holder="h")
        open_execution(store.journal, Scope.host("digest"), PLAN, holder="h", pins={"input": "events@1"})
        open_execution(store.journal, Scope.backfill_chunk("pipeline:events", "2026-01"), PLAN, holder="h")
    listing = {o["scope"]: o for o in json.loads(contextful(tmp_path, "--json", "run", "executions").stdout)}
    assert listing["pipeline:events"]["execution"] == table.execution_id  # the table's key, byte for byte
    assert listing["pipeline:events"]["kind"] == TABLE and listing["pipeline:events"]["pins"] == {}
    assert listing["host:digest"]["kind"] == HOST and listing["host:digest"]["pins"] == {"input": "events@1"}
    assert listing['backfill:["pipeline:events","2026-01"]']["kind"] == CHUNK


# --- apply-side retirement ------------------------------------------------------------------------


def _pending(journal: JournalStore, clock: ManualClock, scope: Scope, plan: str, holder: str = "gone",
             **pins: str) -> str:
    return open_execution(journal, scope, plan, holder=holder, lease_s=30, clock=clock, pins=pins).execution_id


@pytest.mark.clause("run.own.apply-retires-superseded")
def test_an_apply_retires_pending_owners_its_snapshot_no_longer_produces(tmp_path: Path) -> None:
    journal = open_journal_store("sqlite", path=str(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    kept = _pending(journal, clock, Scope.host("build:daily"), PLAN)
    stale = _pending(journal, clock, Scope.host("build:weekly"), OTHER_PLAN)
    body_kept = _pending(journal, clock, Scope.host("job:summaries"), THIRD_PLAN,
                         **{IMPLEMENTATION_PIN: "d" * 64, INPUT_PIN: "in-1"})  # matches on input, not plan
    body_stale = _pending(journal, clock, Scope.host("job:labels"), PLAN, **{IMPLEMENTATION_PIN: "d" * 64,
                                                                             INPUT_PIN: "in-0"})
    clock.advance(31)  # every attempt is gone: nothing makes a retirement unsafe
    err = io.StringIO()
    outcome = retire_superseded(journal, journal.owners(), AppliedDeclarations(frozenset({PLAN}), frozenset({"in-1"})),
                                clock=clock, stderr=err)
    assert sorted(o.execution_id for o in outcome.retired) == sorted([stale, body_stale])
    assert not outcome.claimed and err.getvalue() == ""
    status = {o.execution_id: o.status for o in journal.owners()}
    assert status == {kept: PENDING, stale: RETIRED, body_kept: PENDING, body_stale: RETIRED}
    fresh = open_execution(journal, Scope.host("build:weekly"), PLAN, holder="next", clock=clock)
    assert fresh.execution_id != stale and fresh.attempt == 1  # the scope's next fire claims afresh
    journal.close_store()


@pytest.mark.clause("run.own.apply-retire-refused")
def test_an_unsafe_retirement_leaves_the_owner_pending_and_names_the_execution_and_rewind(tmp_path: Path) -> None:
    journal = open_journal_store("sqlite", path=str(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    live = _pending(journal, clock, Scope.host("build:weekly"), OTHER_PLAN, holder="other-host:1:alive")
    lapsed = _pending(journal, clock, Scope.host("build:monthly"), OTHER_PLAN)
    clock.advance(10)
    journal.renew(lapsed, "gone", clock.now_us() - 31_000_000, 30_000_000)  # its lease ran out a second ago
    err = io.StringIO()
    outcome = retire_superseded(journal, journal.owners(), AppliedDeclarations(frozenset({PLAN})), clock=clock,
                                stderr=err)
    assert outcome.claimed  # the snapshot stays claimed
    assert [exc.execution for exc in outcome.refused] == [live]  # type: ignore[attr-defined]
    assert [o.execution_id for o in outcome.retired] == [lapsed]
    assert {o.execution_id: o.status for o in journal.owners()} == {live: PENDING, lapsed: RETIRED}
    line = err.getvalue()
    assert line.count("\n") == 1 and live in line and f"contextful run rewind {live}" in line
    journal.close_store()
