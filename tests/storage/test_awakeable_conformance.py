"""The awakeable store port's behaviour suite, run against every adapter, and the execution's
suspension over each.

Mirrors tests/storage/test_journal_conformance.py, whose sites it reuses: the awakeable store lives
beside the journal (the same local root, SQLite file or PostgreSQL schema). Covers minting (a
pending row with an opaque token, idempotent per step), resolution (payload and subject recorded,
the same payload again idempotent, another payload AwakeableAlreadyResolved with the recorded value
untouched, AwakeableTimedOut past the deadline, AwakeableUnknown), concurrent resolvers across real
OS processes, and :meth:`Execution.suspend` on each adapter: blocking until resolved, replaying
without minting, a suspended execution dropped without close and resumed by another holder, a
deadline passed while suspended, and a resolution made by another process.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import multiprocessing
import queue
import shutil
import sqlite3
import string
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from contextful.engine.run.execution import Execution, open_execution, plan_reference
from contextful.engine.run.keeper import Keeper
from contextful.storage.awakeables import (
    PENDING,
    RESOLVED,
    TIMED_OUT,
    AwakeableRow,
    AwakeableStore,
    awakeable_store_beside,
    open_awakeable_store,
)
from contextful.storage.awakeables.files import FileAwakeableStore
from contextful.storage.awakeables.postgres import PostgresAwakeableStore
from contextful.storage.awakeables.sqlite import SqliteAwakeableStore
from contextful.storage.clock import ManualClock, SystemClock
from contextful.storage.d1.awakeables import D1AwakeableStore
from contextful.storage.d1.client import D1Client
from contextful.storage.errors import (
    AwakeableAlreadyResolved,
    AwakeableTimedOut,
    AwakeableUnknown,
    ConditionalWriteUnsupported,
    ExecutionSuspended,
    JournalConflict,
    StorageProfileUnknown,
)
from contextful.storage.journal import JournalStore
from contextful.storage.objects import ObjectStore

from tests.storage.test_journal_conformance import KINDS, JournalSite, journal_site

Opener = Callable[..., Execution]
"""How a scenario opens its executions: ``open_execution`` here; the orchestrator's conformance suite
(``tests/engine/run/test_orchestrate.py``) passes one that opens each as the unit of a provider step."""

T0 = 1_700_000_000_000_000
DEADLINE = T0 + 60_000_000
PLAN = plan_reference({"pipeline": "approvals", "v": 1})
LEASE_S = 30


def open_awakeables(site: JournalSite) -> AwakeableStore:
    """The awakeable store at ``site``, opened by profile (a child process opens it the same way)."""
    if site.kind == "files":
        return open_awakeable_store("files", root=site.location)
    if site.kind == "sqlite":
        return open_awakeable_store("sqlite", path=site.location)
    if site.kind == "d1":
        return open_awakeable_store("d1", url=site.location, token=site.token, namespace=site.schema)
    return open_awakeable_store("postgres", dsn=site.location, schema=site.schema)


@pytest.fixture(params=KINDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> JournalSite:
    return journal_site(request.param, request, tmp_path)


@pytest.fixture
def awakeables(site: JournalSite) -> Iterator[AwakeableStore]:
    store = open_awakeables(site)
    yield store
    store.close_store()


@pytest.fixture
def other(site: JournalSite) -> Iterator[AwakeableStore]:
    """A second, independent handle on the same store (another connection or another reader)."""
    store = open_awakeables(site)
    yield store
    store.close_store()


@pytest.fixture
def journal(site: JournalSite) -> Iterator[JournalStore]:
    store = site.open()
    yield store
    store.close_store()


def _stored(site: JournalSite, token: str) -> tuple[str, bytes | None]:
    """The row's state and payload read behind the adapter's back, in its own format."""
    if site.kind == "files":
        store = FileAwakeableStore(ObjectStore(site.location))
        settled = Path(site.location) / store.settled_key(token)
        assert (Path(site.location) / store.token_key(token)).is_file()
        if not settled.is_file():
            return PENDING, None
        outcome = json.loads(settled.read_bytes())
        return outcome["state"], None if outcome["payload"] is None else base64.b64decode(outcome["payload"])
    if site.kind == "sqlite":
        with sqlite3.connect(site.location) as conn:
            row = conn.execute("SELECT state, payload FROM cf_awakeables WHERE token = ?", (token,)).fetchone()
    elif site.kind == "d1":
        row = D1Client(site.location, site.token, site.schema).query(
            "SELECT state, payload FROM cf_awakeables WHERE token = ?", (token,))[0]
    else:
        with psycopg.connect(site.location) as conn:
            row = conn.execute(f'SELECT state, payload FROM "{site.schema}".cf_awakeables WHERE token = %s',
                               (token,)).fetchone()
    return row[0], None if row[1] is None else bytes(row[1])


# --- the port and its adapters -------------------------------------------------------------------


@pytest.mark.clause("run.journal.storage-ports")
def test_open_awakeable_store_picks_the_adapter_beside_the_journal(site: JournalSite, journal: JournalStore,
                                                                   awakeables: AwakeableStore) -> None:
    expected = {"files": FileAwakeableStore, "sqlite": SqliteAwakeableStore, "postgres": PostgresAwakeableStore,
                "d1": D1AwakeableStore}
    assert type(awakeables) is expected[site.kind]
    beside = awakeable_store_beside(journal)
    try:
        assert type(beside) is expected[site.kind]
        row = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
        assert beside.get(row.token) == row  # the same place: the journal's root, file or schema
    finally:
        beside.close_store()
    with pytest.raises(StorageProfileUnknown) as info:
        open_awakeable_store("dynamo", path="x")
    assert info.value.known == ("files", "sqlite", "postgres", "d1")
    with pytest.raises(ConditionalWriteUnsupported):
        FileAwakeableStore(ObjectStore("memory://awakeable-root"))


@pytest.mark.clause("run.journal.storage-ports")
def test_a_local_store_keeps_awakeables_in_its_catalog_file(tmp_path: Path) -> None:
    from contextful.storage import Store

    with Store.open(tmp_path / "store") as store:
        assert type(store.awakeables) is SqliteAwakeableStore
        row = store.awakeables.mint("e1", 0, "approve", DEADLINE, T0)
        catalog = store.catalog.path  # type: ignore[attr-defined]
    with sqlite3.connect(catalog) as conn:
        assert conn.execute("SELECT token, state FROM cf_awakeables").fetchall() == [(row.token, PENDING)]
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"cf_awakeables", "cf_journal_owners"} <= tables


@pytest.mark.clause("run.journal.postgres-stores")
@pytest.mark.postgres
def test_postgres_keeps_awakeables_in_the_catalogs_schema(pg_dsn: str, pg_schema: str, tmp_path: Path) -> None:
    from contextful.storage import Store
    from contextful.storage.catalog.postgres import PostgresCatalog

    with Store.open(tmp_path / "machine-a", catalog=PostgresCatalog(pg_dsn, pg_schema)) as store:
        assert type(store.awakeables) is PostgresAwakeableStore
        row = store.awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    # Every local disk replaced: nothing local is left, and the catalog's schema still resolves the token.
    shutil.rmtree(tmp_path / "machine-a")
    fresh = open_awakeable_store("postgres", dsn=pg_dsn, schema=pg_schema)
    try:
        assert fresh.resolve(row.token, b"yes", "alice", T0 + 1).payload == b"yes"
    finally:
        fresh.close_store()
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT state, payload FROM "{pg_schema}".cf_awakeables').fetchall() == [
            (RESOLVED, b"yes")]


# --- run.suspend.awakeable: minting --------------------------------------------------------------


@pytest.mark.clause("run.suspend.awakeable", "run.journal.storage-ports")
def test_mint_persists_a_pending_row_under_an_opaque_token(site: JournalSite, awakeables: AwakeableStore,
                                                           other: AwakeableStore) -> None:
    row = awakeables.mint("e1", 3, "approve", DEADLINE, T0)
    assert row == AwakeableRow(token=row.token, execution_id="e1", seq=3, label="approve", state=PENDING,
                               created_us=T0, deadline_us=DEADLINE, payload=None, resolved_us=None, subject=None)
    assert len(row.token) >= 43 and set(row.token) <= set(string.ascii_letters + string.digits + "-_")
    assert other.get(row.token) == row  # persisted: another handle reads it
    assert _stored(site, row.token) == (PENDING, None)
    tokens = {row.token} | {awakeables.mint(e, s, "approve", DEADLINE, T0).token
                            for e, s in (("e1", 4), ("e2", 3), ("e2", 4))}
    assert len(tokens) == 4  # one token per suspension, none derived from the step
    assert [r.seq for r in other.rows_of("e1")] == [3, 4]
    assert other.pending_for("e1", T0) == other.rows_of("e1")


@pytest.mark.clause("run.suspend.awakeable")
def test_mint_is_idempotent_per_step(awakeables: AwakeableStore, other: AwakeableStore) -> None:
    first = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    # A replaying attempt gets the same row back: same token, the first deadline.
    assert other.mint("e1", 0, "approve", DEADLINE + 99, T0 + 5) == first
    assert awakeables.rows_of("e1") == [first]
    with pytest.raises(JournalConflict) as info:  # the replay diverged from what was minted
        other.mint("e1", 0, "deny", DEADLINE, T0)
    assert (info.value.execution, info.value.step) == ("e1", 0) and "'approve'" in info.value.reason


def test_pending_under_lists_a_family_s_open_rows_only(awakeables: AwakeableStore, other: AwakeableStore) -> None:
    rows = [awakeables.mint(e, seq, "step", DEADLINE, T0)
            for e, seq in (("relay/r1/b", 2), ("relay/r1/a", 1), ("relay/r1/b", 1), ("relay/r2/a", 1),
                           ("relay0/x", 1), ("relay", 1), ("relax/y", 1), ("e1", 0))]
    other.resolve(rows[2].token, b"done", None, T0 + 1)
    assert [(r.execution_id, r.seq) for r in other.pending_under("relay")] == [
        ("relay/r1/a", 1), ("relay/r1/b", 2), ("relay/r2/a", 1)]
    assert other.pending_under("relay/r1") == [rows[1], rows[0]]
    assert other.pending_under("nothing") == []


# --- resolution ----------------------------------------------------------------------------------


@pytest.mark.clause("run.suspend.awakeable")
def test_resolve_records_the_payload_and_the_same_payload_again_is_idempotent(
        site: JournalSite, awakeables: AwakeableStore, other: AwakeableStore) -> None:
    row = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    resolved = other.resolve(row.token, b"\x00yes\xff", "alice", T0 + 7)
    assert resolved == AwakeableRow(token=row.token, execution_id="e1", seq=0, label="approve", state=RESOLVED,
                                    created_us=T0, deadline_us=DEADLINE, payload=b"\x00yes\xff",
                                    resolved_us=T0 + 7, subject="alice")
    assert awakeables.get(row.token) == resolved
    assert awakeables.pending_for("e1", T0) == []
    # The same payload again (a retried POST), even past the deadline: the row as first resolved.
    assert awakeables.resolve(row.token, b"\x00yes\xff", "bob", DEADLINE + 1) == resolved
    assert _stored(site, row.token)[0] == RESOLVED


@pytest.mark.clause("run.suspend.conflicting-resolution")
def test_a_second_resolution_with_another_payload_is_refused_and_the_recorded_value_stays(
        site: JournalSite, awakeables: AwakeableStore, other: AwakeableStore) -> None:
    row = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    resolved = awakeables.resolve(row.token, b"yes", "alice", T0 + 1)
    stored = _stored(site, row.token)
    for payload in (b"no", b"", b"yes "):
        with pytest.raises(AwakeableAlreadyResolved) as info:
            other.resolve(row.token, payload, "mallory", T0 + 2)
        assert (info.value.token, info.value.execution, info.value.label) == (row.token, "e1", "approve")
        assert info.value.http_status == 409 and info.value.category == "conflict"
    assert other.get(row.token) == resolved
    assert _stored(site, row.token) == stored  # untouched, byte for byte


@pytest.mark.clause("run.suspend.expired-token")
def test_resolving_past_the_deadline_raises_awakeable_timed_out(site: JournalSite, awakeables: AwakeableStore,
                                                               other: AwakeableStore) -> None:
    row = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    for now in (DEADLINE, DEADLINE + 3_600_000_000):  # at the deadline already
        with pytest.raises(AwakeableTimedOut) as info:
            other.resolve(row.token, b"late", "alice", now)
        assert (info.value.token, info.value.execution, info.value.label, info.value.deadline_us) == (
            row.token, "e1", "approve", DEADLINE)
        assert info.value.http_status == 410 and info.value.category == "expired"
        # What the late resolver was told is the row's outcome: settled timed-out, for every reader.
        settled = awakeables.get(row.token)
        assert settled == dataclasses.replace(row, state=TIMED_OUT) and settled.timed_out(T0)
        assert _stored(site, row.token) == (TIMED_OUT, None)
    assert awakeables.pending_for("e1", T0) == []
    # A resolver whose clock lags now is told the same, instead of resolving what was refused.
    with pytest.raises(AwakeableTimedOut):
        other.resolve(row.token, b"late", "alice", T0 + 1)
    # Lazy: a deadline passing writes nothing; a pending row past it reads timed out until someone looks.
    lazy = awakeables.mint("e1", 1, "approve", DEADLINE, T0)
    assert lazy.timed_out(DEADLINE) and not lazy.timed_out(DEADLINE - 1)
    assert awakeables.pending_for("e1", DEADLINE - 1) == [lazy] and awakeables.pending_for("e1", DEADLINE) == []
    assert _stored(site, lazy.token) == (PENDING, None)
    # One microsecond before the deadline still resolves.
    assert other.resolve(lazy.token, b"in time", None, DEADLINE - 1).payload == b"in time"


def after_first_read(store: AwakeableStore, hook: Callable[[], None]) -> None:
    """Run ``hook`` once, right after ``store``'s next read of a row returns (the real adapter's
    read and writes otherwise untouched): the moment between a settler's look and its write."""
    read = store.get
    fired: list[bool] = []

    def get(token: str) -> AwakeableRow | None:
        row = read(token)
        if not fired:
            fired.append(True)
            hook()
        return row

    setattr(store, "get", get)  # noqa: B010 - an instance hook over the adapter's own method


@pytest.mark.clause("run.suspend.expired-token")
def test_expire_settles_a_pending_row_past_its_deadline_and_never_a_resolved_one(
        site: JournalSite, awakeables: AwakeableStore, other: AwakeableStore) -> None:
    row = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    assert other.expire(row.token, DEADLINE - 1) == row  # before the deadline: nothing to settle
    assert _stored(site, row.token) == (PENDING, None)
    timed_out = other.expire(row.token, DEADLINE)
    assert timed_out == dataclasses.replace(row, state=TIMED_OUT) == awakeables.get(row.token)
    assert _stored(site, row.token) == (TIMED_OUT, None)
    assert awakeables.expire(row.token, DEADLINE + 1) == timed_out  # settled once
    resolved = awakeables.mint("e1", 1, "approve", DEADLINE, T0)
    awakeables.resolve(resolved.token, b"yes", "alice", T0 + 1)
    assert other.expire(resolved.token, DEADLINE).state == RESOLVED  # the first settlement stays
    with pytest.raises(AwakeableUnknown):
        other.expire("nope", DEADLINE)


def _suspended(journal: JournalStore, clock: ManualClock) -> tuple[Execution, str]:
    """An execution suspended on "approve" (60 s), returned without waiting: it and its token."""
    ex = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=3600, clock=clock,
                        keeper=Keeper(clock, start=False))
    with pytest.raises(ExecutionSuspended) as info:
        ex.suspend("approve", timeout_s=60, wait_s=0)
    return ex, info.value.token


@pytest.mark.clause("run.suspend.expired-token")
def test_a_resolver_that_read_in_time_loses_to_the_waiters_timeout_and_is_told_so(
        site: JournalSite, journal: JournalStore, other: AwakeableStore) -> None:
    """The resolver reads the row pending before the deadline; before it writes, the waiting
    execution looks past the deadline and records the timeout; then the resolver writes. It is
    told AwakeableTimedOut, and the row, the step and every replay say timed out."""
    clock = ManualClock(T0)
    ex, token = _suspended(journal, clock)
    waiter: dict[str, BaseException] = {}

    def waiter_times_out() -> None:
        clock.advance(60)
        with pytest.raises(AwakeableTimedOut) as timed_out:
            ex.suspend("approve", timeout_s=60)
        waiter["error"] = timed_out.value

    after_first_read(other, waiter_times_out)
    with pytest.raises(AwakeableTimedOut) as told:
        other.resolve(token, b"approved", "alice", T0 + 1)  # its instant is before the deadline
    assert "error" in waiter and (told.value.token, told.value.deadline_us) == (token, DEADLINE)
    row = other.get(token)
    assert row is not None and (row.state, row.payload, row.subject) == (TIMED_OUT, None, None)
    assert _stored(site, token) == (TIMED_OUT, None)
    [step] = journal.steps(ex.execution_id)
    assert step.value.startswith(b"t")  # the timeout, as the resolver was told
    clock.advance(3600)
    resumed = open_execution(journal, "host:approvals", PLAN, holder="h2", lease_s=60, clock=clock,
                             keeper=Keeper(clock, start=False))
    with pytest.raises(AwakeableTimedOut):
        resumed.suspend("approve", timeout_s=60)


@pytest.mark.clause("run.suspend.awakeable", "run.suspend.expired-token")
def test_a_waiter_that_read_pending_past_the_deadline_loses_to_a_resolution_in_time(
        site: JournalSite, journal: JournalStore, awakeables: AwakeableStore, other: AwakeableStore) -> None:
    """The waiter reads the row pending past the deadline; before it settles the timeout, a resolver
    whose instant is before the deadline resolves it (answered 200). The waiter records the payload
    the resolver was told, not a timeout."""
    clock = ManualClock(T0)
    ex, token = _suspended(journal, clock)
    answered: list[bytes | None] = []
    after_first_read(awakeables, lambda: answered.append(other.resolve(token, b"approved", "alice", T0 + 1).payload))
    ex.awakeables = awakeables
    clock.advance(60)
    assert ex.suspend("approve", timeout_s=60) == b"approved"
    assert answered == [b"approved"]
    row = other.get(token)
    assert row is not None and (row.state, row.payload) == (RESOLVED, b"approved")
    assert [s.value for s in journal.steps(ex.execution_id)] == [b"rapproved"]


@pytest.mark.clause("run.journal.storage-ports")
def test_an_unknown_token_raises_awakeable_unknown(awakeables: AwakeableStore) -> None:
    awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    for token in ("nope", "", "../../awakeables/minted/e1/00000000", "x" * 500):
        assert awakeables.get(token) is None
        with pytest.raises(AwakeableUnknown) as info:
            awakeables.resolve(token, b"yes", "alice", T0)
        assert info.value.token == token and info.value.http_status == 404


# --- concurrent resolvers across processes ---------------------------------------------------------

PROCESSES = 4
TIMEOUT_S = 120.0


def _resolver(site: JournalSite, contested: str, agreed: str, tag: int, start: Any, results: Any) -> None:
    """Resolve ``contested`` with this child's own payload and ``agreed`` with the one every child
    sends; report what each resolution answered."""
    try:
        store = open_awakeables(site)
        try:
            start.wait(TIMEOUT_S)
            try:
                row = store.resolve(contested, f"payload {tag}".encode(), f"subject {tag}", T0 + tag)
                first: tuple[str, bytes | None] = ("resolved", row.payload)
            except AwakeableAlreadyResolved:
                first = ("refused", None)
            second = store.resolve(agreed, b"approved", f"subject {tag}", T0 + tag).payload
        finally:
            store.close_store()
        results.put((tag, first, second))
    except BaseException:  # noqa: BLE001 - a child reports every failure to the test
        start.abort()
        results.put((tag, "error", traceback.format_exc()))


@pytest.mark.clause("run.suspend.conflicting-resolution", "run.suspend.awakeable", "run.journal.storage-ports")
def test_concurrent_resolvers_of_one_token_converge_on_one_payload(site: JournalSite,
                                                                   awakeables: AwakeableStore) -> None:
    contested = awakeables.mint("e1", 0, "approve", DEADLINE, T0)
    agreed = awakeables.mint("e1", 1, "countersign", DEADLINE, T0)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=_resolver, args=(site, contested.token, agreed.token, tag, start, results))
             for tag in range(PROCESSES)]
    for proc in procs:
        proc.start()
    outcomes = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=TIMEOUT_S))
    except queue.Empty:
        pytest.fail("a child process reported nothing in time")
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [o[2] for o in outcomes if o[1] == "error"]
    assert not errors, "\n".join(errors)
    # Differing payloads: exactly one wins, every other resolver is told AwakeableAlreadyResolved.
    won = [(tag, first) for tag, first, _ in outcomes if first[0] == "resolved"]
    assert len(won) == 1, outcomes
    winner, (_, payload) = won[0]
    assert payload == f"payload {winner}".encode()
    assert sorted(first for _, first, _ in outcomes) == [("refused", None)] * (PROCESSES - 1) + [("resolved", payload)]
    stored = awakeables.get(contested.token)
    assert stored is not None
    assert (stored.payload, stored.subject, stored.resolved_us) == (payload, f"subject {winner}", T0 + winner)
    # One payload sent by all: every resolver succeeds and reads it.
    assert [second for _, _, second in outcomes] == [b"approved"] * PROCESSES
    settled = awakeables.get(agreed.token)
    assert settled is not None and settled.payload == b"approved"


# --- Execution.suspend over each adapter -------------------------------------------------------------


@pytest.mark.clause("run.suspend.awakeable", "run.journal.substrate-port")
def test_a_suspended_execution_blocks_until_the_token_is_posted_back(journal: JournalStore,
                                                                    other: AwakeableStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    ex = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=LEASE_S, clock=clock)
    ex.step("prepare", lambda: b"draft")
    tokens: queue.Queue[str] = queue.Queue()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["payload"] = ex.suspend("approve", timeout_s=60, on_token=tokens.put)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc
            tokens.put("")

    waiter = threading.Thread(target=run)
    waiter.start()
    token = tokens.get(timeout=TIMEOUT_S)
    assert token and waiter.is_alive()  # pending: the execution waits
    row = other.get(token)
    assert row is not None and (row.execution_id, row.seq, row.label, row.state, row.deadline_us) == (
        ex.execution_id, 1, "approve", PENDING, T0 + 60_000_000)
    other.resolve(token, b"approved", "alice", T0 + 1)  # in this process: the waiter wakes at once
    waiter.join(TIMEOUT_S)
    assert outcome == {"payload": b"approved"}
    assert [(s.seq, s.label) for s in journal.steps(ex.execution_id)] == [(0, "prepare"), (1, "approve")]
    assert ex.step("publish", lambda: b"done") == b"done" and ex.next_seq == 3
    ex.close(ok=True)


@pytest.mark.clause("run.suspend.awakeable", "run.own.unclosed-execution")
def test_a_suspended_execution_dropped_without_close_resumes_under_another_holder(
        journal: JournalStore, other: AwakeableStore, open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    first = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=LEASE_S, clock=clock)
    first.step("prepare", lambda: b"draft")
    with pytest.raises(ExecutionSuspended) as info:
        first.suspend("approve", timeout_s=3600, wait_s=0)
    token, execution_id = info.value.token, first.execution_id
    assert (info.value.execution, info.value.label) == (execution_id, "approve")
    assert [s.label for s in journal.steps(execution_id)] == ["prepare"]  # nothing recorded for the wait
    del first  # dropped without close, as a killed process leaves it
    other.resolve(token, b"approved", "alice", clock.now_us())
    clock.advance(LEASE_S)  # the lease lapses
    second = open_execution(journal, "host:approvals", PLAN, holder="h2", lease_s=LEASE_S, clock=clock)
    told: list[str] = []
    assert (second.execution_id, second.resumed) == (execution_id, True)
    assert second.step("prepare", lambda: b"recomputed") == b"draft"
    assert second.suspend("approve", timeout_s=3600, on_token=told.append) == b"approved"
    assert told == []  # resolved already: nobody is handed the token again
    assert [(r.token, r.state) for r in other.rows_of(execution_id)] == [(token, RESOLVED)]  # not re-minted
    assert [s.label for s in journal.steps(execution_id)] == ["prepare", "approve"]
    # Replay reads what the first resumption saw, without the awakeable store.
    clock.advance(LEASE_S)
    third = open_execution(journal, "host:approvals", PLAN, holder="h3", lease_s=LEASE_S, clock=clock)
    third.step("prepare", lambda: b"recomputed")
    third.awakeables = _Unreachable()  # a recorded suspension reads no awakeable store
    assert third.suspend("approve", timeout_s=1) == b"approved"
    with pytest.raises(JournalConflict):  # a suspension replayed under another label diverged
        open_execution(journal, "host:approvals", PLAN, holder="h3", lease_s=LEASE_S, clock=clock).suspend(
            "prepare", timeout_s=1)


class _Unreachable(AwakeableStore):
    """An awakeable store every read or write of fails: what a replay must never touch."""

    def _insert_pending(self, row: AwakeableRow) -> AwakeableRow:
        raise AssertionError("a replayed suspension minted")

    def _settle(self, token: str, state: str, payload: bytes | None, subject: str | None,
                resolved_us: int | None) -> None:
        raise AssertionError("a replayed suspension settled an awakeable")

    def get(self, token: str) -> AwakeableRow | None:
        raise AssertionError("a replayed suspension read the awakeable store")

    def rows_of(self, execution_id: str) -> list[AwakeableRow]:
        raise AssertionError("a replayed suspension read the awakeable store")

    def pending_under(self, prefix: str) -> list[AwakeableRow]:
        raise AssertionError("a replayed suspension read the awakeable store")


@pytest.mark.clause("run.suspend.awakeable")
def test_a_resumption_of_a_pending_suspension_waits_on_the_same_token(journal: JournalStore,
                                                                     other: AwakeableStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    first = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=LEASE_S, clock=clock)
    with pytest.raises(ExecutionSuspended) as info:
        first.suspend("approve", timeout_s=3600, wait_s=0)
    clock.advance(LEASE_S)
    second = open_execution(journal, "host:approvals", PLAN, holder="h2", lease_s=LEASE_S, clock=clock)
    told: list[str] = []
    with pytest.raises(ExecutionSuspended) as again:
        second.suspend("approve", timeout_s=3600, on_token=told.append, wait_s=0)
    assert told == [info.value.token] == [again.value.token]  # minting is idempotent per step
    assert again.value.deadline_us == info.value.deadline_us == T0 + 3_600_000_000  # the first mint's deadline
    assert len(other.rows_of(first.execution_id)) == 1


@pytest.mark.clause("run.suspend.expired-token")
def test_a_suspension_past_its_deadline_times_out_and_replays_the_timeout(journal: JournalStore,
                                                                         other: AwakeableStore,
        open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    first = open_execution(journal, "host:approvals", PLAN, holder="h1", lease_s=LEASE_S, clock=clock)
    with pytest.raises(ExecutionSuspended) as info:
        first.suspend("approve", timeout_s=60, wait_s=0)
    clock.advance(60)  # the deadline passes while nobody resolves the token
    with pytest.raises(AwakeableTimedOut) as timed_out:
        first.suspend("approve", timeout_s=60)  # the same handle looks again: lazily timed out
    assert (timed_out.value.token, timed_out.value.deadline_us) == (info.value.token, T0 + 60_000_000)
    assert first.next_seq == 1  # the timeout is the step's recorded outcome
    assert other.get(info.value.token).state == TIMED_OUT  # type: ignore[union-attr]  # and the row's
    with pytest.raises(AwakeableTimedOut):
        other.resolve(info.value.token, b"late", "alice", clock.now_us())
    clock.advance(LEASE_S)
    resumed = open_execution(journal, "host:approvals", PLAN, holder="h2", lease_s=LEASE_S, clock=clock)
    with pytest.raises(AwakeableTimedOut) as replayed:
        resumed.suspend("approve", timeout_s=60)
    assert replayed.value.token == info.value.token


def _suspend_in_child(site: JournalSite, report: Any) -> None:
    try:
        journal = site.open()
        ex = open_execution(journal, "host:approvals", PLAN, holder="child", lease_s=600)
        payload = ex.suspend("approve", timeout_s=600, on_token=lambda token: report.put(("token", token)),
                             poll_s=0.05)
        ex.close(ok=True)
        journal.close_store()
        report.put(("payload", payload))
    except BaseException:  # noqa: BLE001 - the child reports every failure to the test
        report.put(("error", traceback.format_exc()))


@pytest.mark.clause("run.suspend.awakeable", "run.journal.storage-ports")
def test_another_process_resolving_the_token_resumes_the_waiting_execution(
        site: JournalSite, journal: JournalStore, awakeables: AwakeableStore) -> None:
    ctx = multiprocessing.get_context("spawn")
    report = ctx.Queue()
    child = ctx.Process(target=_suspend_in_child, args=(site, report))
    child.start()
    try:
        kind, token = report.get(timeout=TIMEOUT_S)
        assert kind == "token", token
        awakeables.resolve(token, b"from the parent", "alice", SystemClock().now_us())
        assert report.get(timeout=TIMEOUT_S) == ("payload", b"from the parent")
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
            child.join()
    row = awakeables.get(token)
    assert row is not None
    assert [s.value for s in journal.steps(row.execution_id)] == [b"rfrom the parent"]
