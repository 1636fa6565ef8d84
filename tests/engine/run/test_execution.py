"""The execution handle over every journal store adapter.

``run.journal.substrate-port``: one handle opens or resumes under a scope and a plan reference,
records step output, caches a cursor, takes a retry schedule and describes its capabilities.
``run.journal.storage-ports``: each adapter (the file tree included) holds what the handle
records, where the adapter says it keeps it. ``run.own.unclosed-execution``: a process killed with
SIGKILL under an open execution leaves its owner pending; the next open is refused while the lease
runs and resumes the same execution, replaying its recorded steps, once the lease lapses.
"""

from __future__ import annotations

import gc
import hashlib
import json
import multiprocessing
import os
import signal
import sqlite3
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from contextful.engine.run.execution import Execution, open_execution, plan_reference
from contextful.engine.run.retry import RetrySchedule
from contextful.storage.awakeables import awakeable_store_beside
from contextful.storage.clock import ManualClock, from_us
from contextful.storage.d1.client import D1Client
from contextful.storage.errors import ExecutionHeld, ExecutionSuspended, JournalConflict, OwnerPlanMismatch
from contextful.storage.journal import CLOSED_FAILED, CLOSED_OK, PENDING, JournalStore
from contextful.storage.journal.files import FileJournalStore

from tests.storage.test_journal_conformance import JournalSite

Opener = Callable[..., Execution]
"""How a scenario opens its executions: ``open_execution`` here; the orchestrator's conformance suite
(``tests/engine/run/test_orchestrate.py``) passes one that opens each as the unit of a provider step."""

T0 = 1_700_000_000_000_000
PLAN = plan_reference({"pipeline": "orders", "source": {"kind": "http", "url": "http://127.0.0.1/orders"}})
OTHER_PLAN = plan_reference({"pipeline": "orders", "source": {"kind": "http", "url": "http://127.0.0.1/v2"}})


def _never() -> bytes:
    raise AssertionError("a replayed step computed its value again")


class Counter:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.value


def test_plan_reference_is_the_sha256_of_the_canonical_json() -> None:
    plan = {"pipeline": "orders", "steps": [{"b": 2, "a": 1}], "v": 1}
    canonical = b'{"pipeline":"orders","steps":[{"a":1,"b":2}],"v":1}'
    assert plan_reference(plan) == hashlib.sha256(canonical).hexdigest()
    assert plan_reference({"v": 1, "steps": [{"a": 1, "b": 2}], "pipeline": "orders"}) == plan_reference(plan)
    assert plan_reference({**plan, "v": 2}) != plan_reference(plan)


# --- run.journal.substrate-port ------------------------------------------------------------------


@pytest.mark.clause("run.journal.substrate-port")
def test_one_handle_opens_records_caches_a_cursor_takes_a_retry_schedule_and_closes(
        journal: JournalStore, open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    ex = open_execution(journal, "host:nightly-report", PLAN, holder="h1", lease_s=30, clock=clock)
    assert (ex.scope, ex.plan_ref, ex.resumed, ex.attempt, ex.cached_cursor) == (
        "host:nightly-report", PLAN, False, 1, None)
    owner = journal.owner("host:nightly-report")
    assert owner is not None
    assert (owner.execution_id, owner.plan_ref, owner.status, owner.holder, owner.lease_expires_us) == (
        ex.execution_id, PLAN, PENDING, "h1", T0 + 30_000_000)

    # Record step output: bytes and JSON objects, each computed once.
    page = Counter(b"\x00raw page\xff")
    assert ex.step("pull page 1", page) == b"\x00raw page\xff"
    summary = Counter({"rows": 2, "next": "tok-2"})
    assert ex.step("pull page 2", summary) == {"rows": 2, "next": "tok-2"}
    assert (page.calls, summary.calls) == (1, 1)
    assert [(s.seq, s.label) for s in journal.steps(ex.execution_id)] == [(0, "pull page 1"), (1, "pull page 2")]

    # Commit a cursor: the owner row caches it while pending.
    ex.cache_cursor({"position": "tok-2", "marker": "m1"})
    assert ex.cached_cursor == {"position": "tok-2", "marker": "m1"}
    owner = journal.owner("host:nightly-report")
    assert owner is not None and json.loads(owner.cursor or "null") == {"position": "tok-2", "marker": "m1"}

    # Suspend on an awakeable with a timeout: the token goes out, the resolved payload comes back.
    tokens: list[str] = []
    with pytest.raises(ExecutionSuspended):
        ex.suspend("approve", timeout_s=60, on_token=tokens.append, wait_s=0)
    ex.awakeables = awakeable_store_beside(journal)
    ex.awakeables.resolve(tokens[0], b"approved", "alice", clock.now_us())
    assert ex.suspend("approve", timeout_s=60) == b"approved"
    assert [(s.seq, s.label) for s in journal.steps(ex.execution_id)][-1] == (2, "approve")
    ex.awakeables.close_store()

    # Attach a retry schedule; describe capabilities.
    schedule = RetrySchedule(attempts=3)
    assert ex.retry is None
    ex.attach_retry(schedule)
    assert ex.retry is schedule
    assert ex.capabilities() == {"journal": True, "blobs": True, "awakeables": True, "conditional_writes": True}

    clock.advance(5)
    ex.renew()
    owner = journal.owner("host:nightly-report")
    assert owner is not None and owner.lease_expires_us == T0 + 35_000_000 == ex.lease_expires_us

    ex.close(ok=True)
    owner = journal.owner("host:nightly-report")
    assert owner is not None and (owner.status, owner.closed_us) == (CLOSED_OK, T0 + 5_000_000)
    with pytest.raises(JournalConflict) as info:
        ex.step("after close", page)
    assert info.value.reason == "the execution is closed"

    # A closed owner pins nothing: the next open starts a fresh execution.
    fresh = open_execution(journal, "host:nightly-report", OTHER_PLAN, holder="h2", clock=clock)
    assert fresh.execution_id != ex.execution_id
    assert (fresh.resumed, fresh.attempt, fresh.cached_cursor) == (False, 1, None)
    fresh.close(ok=False)
    owner = journal.owner("host:nightly-report")
    assert owner is not None and owner.status == CLOSED_FAILED


@pytest.mark.clause("run.journal.substrate-port")
def test_open_resumes_under_the_same_plan_and_refuses_another(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    first = open_execution(journal, "table:orders", PLAN, holder="h1", lease_s=30, clock=clock)
    first.step("pull", lambda: {"page": 1})
    with pytest.raises(OwnerPlanMismatch) as info:
        open_execution(journal, "table:orders", OTHER_PLAN, holder="h1", clock=clock)
    assert (info.value.scope, info.value.execution, info.value.pinned, info.value.offered) == (
        "table:orders", first.execution_id, PLAN, OTHER_PLAN)
    again = open_execution(journal, "table:orders", PLAN, holder="h1", lease_s=30, clock=clock)
    assert (again.execution_id, again.resumed, again.attempt) == (first.execution_id, True, 2)
    assert again.step("pull", _never) == {"page": 1}


@pytest.mark.clause("run.journal.substrate-port")
def test_a_resumed_step_under_another_label_is_a_journal_conflict(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    first = open_execution(journal, "table:orders", PLAN, holder="h1", clock=clock)
    first.step("pull page 1", lambda: b"1")
    again = open_execution(journal, "table:orders", PLAN, holder="h1", clock=clock)
    with pytest.raises(JournalConflict) as info:
        again.step("pull page 7", _never)
    assert (info.value.execution, info.value.step) == (first.execution_id, 0)
    assert "'pull page 1'" in info.value.reason and "'pull page 7'" in info.value.reason


@pytest.mark.clause("run.journal.substrate-port")
def test_a_checkpoint_cursor_makes_a_resumption_replay_from_after_it(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    ex = open_execution(journal, "table:events", PLAN, holder="h1", lease_s=30, clock=clock)
    ex.step("pull 1", lambda: b"p1")
    ex.step("pull 2", lambda: b"p2")
    ex.cache_cursor({"position": 2})
    ex.step("pull 3", lambda: b"p3")
    del ex  # crashed before collecting: the steps the cursor covers are still there

    clock.advance(30)
    again = open_execution(journal, "table:events", PLAN, holder="h2", lease_s=30, clock=clock)
    assert (again.resumed, again.cached_cursor, again.next_seq) == (True, {"position": 2}, 2)
    assert again.step("pull 3", _never) == b"p3"
    assert again.collect_steps() == 2
    assert [(s.seq, s.label) for s in journal.steps(again.execution_id)] == [(2, "pull 3")]
    assert again.step("pull 4", lambda: b"p4") == b"p4"


# --- run.journal.storage-ports -------------------------------------------------------------------


def _stored_steps(site: JournalSite, execution: str) -> dict[int, tuple[str, bytes]]:
    """What the adapter holds for ``execution``, read behind its back in its own format."""
    if site.kind == "files":
        root = Path(site.location) / "journal" / execution
        out = {}
        for path in sorted(root.iterdir()):
            doc = json.loads(path.read_text())
            out[int(path.stem)] = (doc["label"], doc["value"])
        return out
    if site.kind == "sqlite":
        with sqlite3.connect(site.location) as conn:
            rows = conn.execute("SELECT seq, label, value FROM cf_journal_steps WHERE execution_id = ?",
                                (execution,)).fetchall()
    elif site.kind == "d1":
        rows = D1Client(site.location, site.token, site.schema).query(
            "SELECT seq, label, value FROM cf_journal_steps WHERE execution_id = ?", (execution,))
    else:
        with psycopg.connect(site.location) as conn:
            rows = conn.execute(f'SELECT seq, label, value FROM "{site.schema}".cf_journal_steps'
                                " WHERE execution_id = %s", (execution,)).fetchall()
    return {int(seq): (label, bytes(value)) for seq, label, value in rows}


@pytest.mark.clause("run.journal.storage-ports")
def test_each_adapter_holds_the_journal_an_execution_records(site: JournalSite, journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    ex = open_execution(journal, "table:orders", PLAN, holder="h1", lease_s=30, clock=clock)
    assert ex.step("pull page 1", lambda: b"page one") == b"page one"
    assert ex.step("pull page 2", lambda: {"rows": 3}) == {"rows": 3}
    ex.cache_cursor({"position": 2})

    stored = _stored_steps(site, ex.execution_id)
    assert sorted(stored) == [0, 1]
    if site.kind == "files":  # the file tree's layout: journal/<execution>/<seq:08d>.json
        assert (Path(site.location) / FileJournalStore.step_key(ex.execution_id, 0)).is_file()
        assert [label for label, _ in stored.values()] == ["pull page 1", "pull page 2"]
    else:
        assert stored == {0: ("pull page 1", b"bpage one"), 1: ("pull page 2", b'j{"rows":3}')}

    # Another handle on the same adapter (another connection, a fresh process's view) resumes it.
    reopened = site.open()
    try:
        clock.advance(30)
        again = open_execution(reopened, "table:orders", PLAN, holder="h2", lease_s=30, clock=clock)
        assert (again.execution_id, again.resumed, again.cached_cursor) == (ex.execution_id, True, {"position": 2})
        assert again.collect_steps() == 2
        assert _stored_steps(site, ex.execution_id) == {}
        again.close(ok=True)
        owner = journal.owner("table:orders")
        assert owner is not None and owner.status == CLOSED_OK
    finally:
        reopened.close_store()


# --- run.own.unclosed-execution ------------------------------------------------------------------

LEASE_S = 30.0


def _open_and_die(site: JournalSite, report: Any) -> None:
    """Open an execution at T0, record two steps whose values only this process could compute,
    report them, then wait to be killed: no close, no clean exit."""
    try:
        journal = site.open()
        ex = open_execution(journal, "host:crawl", PLAN, holder="child", lease_s=LEASE_S, clock=ManualClock(T0))
        values = [ex.step("fetch index", lambda: {"pid": os.getpid(), "nonce": uuid.uuid4().hex}),
                  ex.step("fetch page", lambda: os.urandom(16))]
        report.put(("ok", ex.execution_id, values))
    except BaseException:  # noqa: BLE001 - the child reports every failure to the test
        report.put(("error", traceback.format_exc(), None))
        return
    time.sleep(600)


@pytest.mark.clause("run.own.unclosed-execution")
def test_a_killed_execution_stays_pending_and_resumes_once_its_lease_lapses(
        site: JournalSite, journal: JournalStore) -> None:
    ctx = multiprocessing.get_context("spawn")
    report = ctx.Queue()
    child = ctx.Process(target=_open_and_die, args=(site, report))
    child.start()
    try:
        status, execution, values = report.get(timeout=120)
        assert status == "ok", execution
    finally:
        child.kill()  # SIGKILL: the process runs no destructor, no finally, no atexit
        child.join(60)
    assert child.exitcode == -signal.SIGKILL

    # The handle died unclosed: no status was recorded, the owner stays pending under the child.
    owner = journal.owner("host:crawl")
    assert owner is not None
    assert (owner.execution_id, owner.status, owner.closed_us, owner.holder, owner.attempts) == (
        execution, PENDING, None, "child", 1)
    assert len(journal.steps(execution)) == 2

    # Before the lease lapses the next open is refused, naming the holder and the expiry.
    clock = ManualClock(T0)
    clock.advance(LEASE_S - 0.001)
    with pytest.raises(JournalConflict) as info:
        open_execution(journal, "host:crawl", PLAN, holder="next", lease_s=LEASE_S, clock=clock)
    assert info.value.execution == execution
    assert isinstance(info.value, ExecutionHeld) and (info.value.holder, info.value.until_us) == (
        "child", T0 + int(LEASE_S * 1_000_000))
    assert f"holder 'child' since {from_us(T0).isoformat(timespec='seconds').replace('+00:00', 'Z')}" in str(info.value)
    assert journal.owner("host:crawl") == owner

    # Once it lapses the next open resumes the same execution and replays what the child recorded.
    clock.advance(0.001)
    resumed = open_execution(journal, "host:crawl", PLAN, holder="next", lease_s=LEASE_S, clock=clock)
    assert (resumed.execution_id, resumed.resumed, resumed.attempt) == (execution, True, 2)
    assert resumed.step("fetch index", _never) == values[0]
    assert resumed.step("fetch page", _never) == values[1]
    assert resumed.step("fetch page 2", lambda: b"new") == b"new"
    resumed.close(ok=True)
    owner = journal.owner("host:crawl")
    assert owner is not None and (owner.execution_id, owner.status) == (execution, CLOSED_OK)


@pytest.mark.clause("run.own.unclosed-execution")
def test_dropping_a_handle_without_close_records_no_status(journal: JournalStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    ex: Execution | None = open_execution(journal, "host:crawl", PLAN, holder="h1", lease_s=LEASE_S, clock=clock)
    assert ex is not None
    execution = ex.execution_id
    ex.step("fetch", lambda: b"x")
    before = journal.owner("host:crawl")
    ex = None
    gc.collect()
    assert journal.owner("host:crawl") == before
    assert before is not None and (before.status, before.closed_us) == (PENDING, None)
    clock.advance(LEASE_S)
    resumed = open_execution(journal, "host:crawl", PLAN, holder="h2", lease_s=LEASE_S, clock=clock)
    assert (resumed.execution_id, resumed.resumed) == (execution, True)
    assert resumed.step("fetch", _never) == b"x"
