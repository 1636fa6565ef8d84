"""The journal store port's behaviour suite, run against every adapter.

Adapters: :class:`FileJournalStore` on a local root, :class:`SqliteJournalStore` on its own file,
:class:`PostgresJournalStore` on the session's real server (a fresh schema per test),
:class:`D1JournalStore` on the D1 profile's Worker under miniflare (a fresh namespace per test). Covers the
owner lifecycle (claim, resume by the holder, takeover once the lease lapses, refusal while another
holder's lease runs, plan mismatch, renew, cursor cache, close, retire), conditional step records
converging on the first value, collection, and the races across real OS processes: recorders of
one step all read one value with no error, claimers of one scope elect exactly one holder, and
processes opening a lapsed scope through the execution handle resume it exactly once.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.run.execution import open_execution
from contextful.storage.clock import ManualClock
from contextful.storage.d1.journal import D1JournalStore
from contextful.storage.errors import (
    ConditionalWriteUnsupported,
    ExecutionHeld,
    JournalConflict,
    OwnerPinsMismatch,
    OwnerPlanMismatch,
    StorageProfileUnknown,
)
from contextful.storage.journal import (
    CLOSED_FAILED,
    CLOSED_OK,
    PENDING,
    RETIRED,
    JournalStore,
    OwnerRow,
    StepRow,
    open_journal_store,
)
from contextful.storage.journal.files import FileJournalStore
from contextful.storage.journal.postgres import PostgresJournalStore
from contextful.storage.journal.sqlite import SqliteJournalStore
from contextful.storage.objects import ObjectStore

KINDS = ["files", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
         pytest.param("d1", marks=pytest.mark.d1)]

T0 = 1_700_000_000_000_000
LEASE = 30_000_000
PLAN = "a" * 64
OTHER_PLAN = "b" * 64


@dataclass(frozen=True)
class JournalSite:
    """Where one adapter keeps its journal; picklable, so a child process opens the same store."""

    kind: str
    location: str
    """The local root (files), the SQLite file, the PostgreSQL DSN, or the Worker's URL (d1)."""
    schema: str = ""
    """The PostgreSQL schema, or the D1 namespace."""
    token: str = ""
    """The Worker's token (d1)."""

    def open(self) -> JournalStore:
        if self.kind == "files":
            return open_journal_store("files", root=self.location)
        if self.kind == "sqlite":
            return open_journal_store("sqlite", path=self.location)
        if self.kind == "d1":
            return open_journal_store("d1", url=self.location, token=self.token, namespace=self.schema)
        return open_journal_store("postgres", dsn=self.location, schema=self.schema)


def journal_site(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> JournalSite:
    if kind == "files":
        return JournalSite(kind, str(tmp_path / "root"))
    if kind == "sqlite":
        return JournalSite(kind, str(tmp_path / "journal.sqlite"))
    if kind == "d1":
        binding = request.getfixturevalue("d1_binding")
        return JournalSite(kind, binding.url, binding.namespace, binding.token)
    return JournalSite(kind, request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"))


@pytest.fixture(params=KINDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> JournalSite:
    return journal_site(request.param, request, tmp_path)


@pytest.fixture
def journal(site: JournalSite) -> Iterator[JournalStore]:
    store = site.open()
    yield store
    store.close_store()


@pytest.fixture
def other(site: JournalSite) -> Iterator[JournalStore]:
    """A second, independent handle on the same journal (another connection or another reader)."""
    store = site.open()
    yield store
    store.close_store()


def test_open_journal_store_picks_the_adapter_by_profile(site: JournalSite, journal: JournalStore) -> None:
    expected = {"files": FileJournalStore, "sqlite": SqliteJournalStore, "postgres": PostgresJournalStore,
                "d1": D1JournalStore}
    assert type(journal) is expected[site.kind]
    with pytest.raises(StorageProfileUnknown) as info:
        open_journal_store("dynamo", path="x")
    assert info.value.profile == "dynamo"
    assert info.value.known == ("files", "sqlite", "postgres", "d1")


def test_the_file_tree_refuses_a_root_without_a_local_lock(tmp_path: Path) -> None:
    objects = ObjectStore("memory://journal-root")
    with pytest.raises(ConditionalWriteUnsupported) as info:
        FileJournalStore(objects)
    assert "flock" in info.value.reason


# --- owners ------------------------------------------------------------------------------------


def test_claim_opens_a_pending_execution_keyed_on_its_scope(journal: JournalStore, other: JournalStore) -> None:
    assert journal.owner("orders") is None
    row = journal.claim("orders", PLAN, "h1", T0, LEASE)
    assert row == OwnerRow(scope="orders", execution_id=row.execution_id, plan_ref=PLAN, status=PENDING,
                           holder="h1", lease_expires_us=T0 + LEASE, opened_us=T0, closed_us=None, cursor=None,
                           attempts=1, replay_from=0, held_since_us=T0)
    assert len(row.execution_id) == 32
    assert other.owner("orders") == row
    second = journal.claim("orders/chunk 2", PLAN, "h1", T0, LEASE)
    assert second.execution_id != row.execution_id
    assert [o.scope for o in other.owners()] == ["orders", "orders/chunk 2"]


def test_scopes_are_kept_byte_for_byte(journal: JournalStore, other: JournalStore) -> None:
    scopes = ["table:orders", "table:Orders", "backfill/orders/2024-01-01..2024-02-01", "host:ünïcode ✓",
              "x" * 600, "a/../b"]
    rows = {scope: journal.claim(scope, PLAN, "h1", T0, LEASE) for scope in scopes}
    assert len({row.execution_id for row in rows.values()}) == len(scopes)
    for scope in scopes:
        assert other.owner(scope) == rows[scope]
    assert [o.scope for o in other.owners()] == sorted(scopes)


def test_the_holder_reclaiming_its_owner_resumes_it(journal: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    again = journal.claim("orders", PLAN, "h1", T0 + 1_000_000, LEASE)
    assert again == replace(first, lease_expires_us=T0 + 1_000_000 + LEASE, attempts=2)


def test_another_holder_is_refused_while_the_lease_runs(journal: JournalStore, other: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    with pytest.raises(ExecutionHeld) as info:  # a JournalConflict, with its own category (exit 11)
        other.claim("orders", PLAN, "h2", T0 + LEASE - 1, LEASE)
    assert isinstance(info.value, JournalConflict) and info.value.exit_code == 11
    assert info.value.execution == first.execution_id
    assert info.value.step == 0
    assert (info.value.scope, info.value.holder, info.value.host, info.value.pid) == ("orders", "h1", None, None)
    assert (info.value.since_us, info.value.until_us) == (T0, T0 + LEASE)
    assert "holder 'h1' since 2023-11-14T22:13:20Z" in str(info.value)
    assert journal.owner("orders") == first


def test_a_refused_claim_names_the_holders_process_host_and_since_when(journal: JournalStore,
                                                                       other: JournalStore) -> None:
    holder = "db-1:4242:0a1b2c3d;boot=8591c925-af75-48ba-b443-808ac9b6e891;pidns=4026531836;start=41055"
    journal.claim("orders", PLAN, holder, T0, LEASE)
    kept = journal.claim("orders", PLAN, holder, T0 + 7_000_000, LEASE)  # the same holder again: still since T0
    assert kept.held_since_us == T0
    with pytest.raises(ExecutionHeld) as info:
        other.claim("orders", PLAN, "h2", T0 + 8_000_000, LEASE)
    assert (info.value.host, info.value.pid, info.value.since_us) == ("db-1", 4242, T0)
    assert "process 4242 on host db-1 since 2023-11-14T22:13:20Z" in str(info.value)
    taken = other.claim("orders", PLAN, "h2", T0 + 7_000_000 + LEASE, LEASE)  # lapsed: h2 holds it from now
    assert taken.held_since_us == T0 + 7_000_000 + LEASE


def test_a_lapsed_lease_is_taken_over_by_the_next_claim(journal: JournalStore, other: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    journal.record(first.execution_id, 0, "pull", b"page 1", T0)
    taken = other.claim("orders", PLAN, "h2", T0 + LEASE, LEASE)  # lapsed at exactly its expiry
    assert taken == replace(first, holder="h2", lease_expires_us=T0 + 2 * LEASE, attempts=2, held_since_us=T0 + LEASE)
    assert [s.value for s in other.steps(taken.execution_id)] == [b"page 1"]
    # The first holder lost it: renewing, caching a cursor, closing all refuse.
    for lost in (lambda: journal.renew(first.execution_id, "h1", T0 + LEASE, LEASE),
                 lambda: journal.cache_cursor(first.execution_id, "h1", '{"p":1}'),
                 lambda: journal.close(first.execution_id, "h1", CLOSED_OK, T0 + LEASE)):
        with pytest.raises(JournalConflict) as info:
            lost()
        assert info.value.execution == first.execution_id
        assert "lease lost: held by h2" in info.value.reason
    assert journal.owner("orders") == taken
    again = journal.claim("orders", PLAN, "h3", T0 + 2 * LEASE + 1, LEASE)
    assert (again.execution_id, again.holder, again.attempts) == (first.execution_id, "h3", 3)


def test_a_pending_owner_under_another_plan_refuses_the_claim(journal: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    for now in (T0, T0 + 10 * LEASE):  # a lapsed lease does not unpin the plan
        with pytest.raises(OwnerPlanMismatch) as info:
            journal.claim("orders", OTHER_PLAN, "h2", now, LEASE)
        assert (info.value.scope, info.value.execution, info.value.pinned, info.value.offered) == (
            "orders", first.execution_id, PLAN, OTHER_PLAN)
    assert journal.owner("orders") == first


def test_release_ends_the_lease_now_and_the_next_claim_resumes_the_execution(journal: JournalStore,
                                                                              other: JournalStore) -> None:
    """What a transient failure leaves (docs/journal.md): pending, held by nobody, resumable at once."""
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    journal.record(first.execution_id, 0, "unit a", b"answer", T0)
    with pytest.raises(JournalConflict):
        other.release(first.execution_id, "h2", T0 + 1)
    released = journal.release(first.execution_id, "h1", T0 + 5)
    assert released == replace(first, holder=None, lease_expires_us=T0 + 5, held_since_us=None)
    with pytest.raises(JournalConflict) as info:  # a late renewal by the releasing holder finds it lost
        journal.renew(first.execution_id, "h1", T0 + 6, LEASE)
    assert "lease lost" in info.value.reason
    resumed = other.claim("orders", PLAN, "h2", T0 + 5, LEASE)  # not waiting out the lease it had
    assert (resumed.execution_id, resumed.status, resumed.holder, resumed.attempts) == (
        first.execution_id, PENDING, "h2", 2)
    assert [s.value for s in other.steps(resumed.execution_id)] == [b"answer"]


def test_renew_extends_the_holders_lease(journal: JournalStore, other: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    renewed = journal.renew(first.execution_id, "h1", T0 + LEASE - 1, LEASE)
    assert renewed == replace(first, lease_expires_us=T0 + 2 * LEASE - 1)
    with pytest.raises(JournalConflict):
        other.claim("orders", PLAN, "h2", T0 + LEASE, LEASE)  # would have lapsed without the renewal
    with pytest.raises(JournalConflict) as info:
        journal.renew(first.execution_id, "h2", T0, LEASE)
    assert "lease lost: held by h1" in info.value.reason
    with pytest.raises(JournalConflict) as info:
        journal.renew("0" * 32, "h1", T0, LEASE)
    assert info.value.execution == "0" * 32


def test_cache_cursor_writes_the_pending_owners_cursor(journal: JournalStore, other: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    cached = journal.cache_cursor(first.execution_id, "h1", '{"position":5}', replay_from=3)
    assert cached == replace(first, cursor='{"position":5}', replay_from=3)
    assert journal.cache_cursor(first.execution_id, "h1", '{"position":6}') == replace(cached, cursor='{"position":6}')
    with pytest.raises(JournalConflict):
        other.cache_cursor(first.execution_id, "h2", '{"position":7}')
    resumed = other.claim("orders", PLAN, "h2", T0 + LEASE, LEASE)
    assert (resumed.cursor, resumed.replay_from) == ('{"position":6}', 3)


@pytest.mark.parametrize("status", [CLOSED_OK, CLOSED_FAILED])
def test_close_settles_the_owner_and_the_next_claim_opens_a_new_execution(
        journal: JournalStore, other: JournalStore, status: str) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    with pytest.raises(JournalConflict):
        other.close(first.execution_id, "h2", status, T0 + 1)
    closed = journal.close(first.execution_id, "h1", status, T0 + 5)
    assert closed == replace(first, status=status, closed_us=T0 + 5)
    assert other.owner("orders") == closed
    with pytest.raises(JournalConflict) as info:
        journal.close(first.execution_id, "h1", status, T0 + 6)
    assert info.value.reason == f"the owner of scope orders is {status}, not pending"
    # A settled owner pins nothing: another plan and another holder open a fresh execution at once.
    fresh = other.claim("orders", OTHER_PLAN, "h2", T0 + 7, LEASE)
    assert fresh.execution_id != first.execution_id
    assert (fresh.status, fresh.plan_ref, fresh.attempts, fresh.cursor) == (PENDING, OTHER_PLAN, 1, None)
    with pytest.raises(JournalConflict) as info:
        journal.renew(first.execution_id, "h1", T0 + 8, LEASE)
    assert info.value.reason == "no owner holds this execution any more"
    with pytest.raises(ValueError):
        journal.close(fresh.execution_id, "h2", RETIRED, T0 + 9)


def test_retire_retires_a_pending_owner_whoever_holds_it(journal: JournalStore, other: JournalStore) -> None:
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    retired = other.retire(first.execution_id, T0 + 3)
    assert retired == replace(first, status=RETIRED, closed_us=T0 + 3)
    assert journal.owner("orders") == retired
    with pytest.raises(JournalConflict):
        journal.renew(first.execution_id, "h1", T0 + 4, LEASE)
    with pytest.raises(JournalConflict) as info:
        other.retire(first.execution_id, T0 + 5)
    assert info.value.reason == "the owner of scope orders is retired, not pending"
    fresh = journal.claim("orders", OTHER_PLAN, "h1", T0 + 6, LEASE)
    assert fresh.execution_id != first.execution_id and fresh.attempts == 1


# --- steps -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [b"", b"page 1", bytes(range(256)) * 1024], ids=["empty", "small", "256KiB"])
def test_record_stores_a_step_and_is_idempotent(journal: JournalStore, other: JournalStore, value: bytes) -> None:
    execution = journal.claim("orders", PLAN, "h1", T0, LEASE).execution_id
    assert journal.record(execution, 0, "pull", value, T0 + 1) == value
    assert other.record(execution, 0, "pull", value, T0 + 2) == value
    assert other.steps(execution) == [StepRow(execution, 0, "pull", value, T0 + 1)]


def test_a_second_value_for_a_recorded_step_converges_on_the_first(journal: JournalStore,
                                                                   other: JournalStore) -> None:
    execution = journal.claim("orders", PLAN, "h1", T0, LEASE).execution_id
    assert journal.record(execution, 0, "pull", b"first", T0) == b"first"
    assert other.record(execution, 0, "pull", b"second", T0 + 1) == b"first"
    assert journal.record(execution, 0, "pull", b"third", T0 + 2) == b"first"
    assert other.steps(execution) == [StepRow(execution, 0, "pull", b"first", T0)]


def test_a_recorded_step_under_another_label_is_a_journal_conflict(journal: JournalStore) -> None:
    execution = journal.claim("orders", PLAN, "h1", T0, LEASE).execution_id
    journal.record(execution, 4, "pull page 1", b"x", T0)
    with pytest.raises(JournalConflict) as info:
        journal.record(execution, 4, "pull page 2", b"x", T0)
    assert (info.value.execution, info.value.step) == (execution, 4)
    assert "'pull page 1'" in info.value.reason and "'pull page 2'" in info.value.reason
    assert journal.steps(execution) == [StepRow(execution, 4, "pull page 1", b"x", T0)]


def test_steps_are_per_execution_and_in_sequence_order(journal: JournalStore, other: JournalStore) -> None:
    a = journal.claim("a", PLAN, "h1", T0, LEASE).execution_id
    b = journal.claim("b", PLAN, "h1", T0, LEASE).execution_id
    for seq in (2, 0, 11, 1):
        journal.record(a, seq, f"s{seq}", f"a{seq}".encode(), T0 + seq)
    journal.record(b, 0, "s0", b"b0", T0)
    assert [(s.seq, s.label, s.value) for s in other.steps(a)] == [
        (0, "s0", b"a0"), (1, "s1", b"a1"), (2, "s2", b"a2"), (11, "s11", b"a11")]
    assert [s.value for s in other.steps(b)] == [b"b0"]
    assert other.steps("0" * 32) == []


def test_collect_deletes_an_executions_steps(journal: JournalStore, other: JournalStore) -> None:
    a = journal.claim("a", PLAN, "h1", T0, LEASE).execution_id
    b = journal.claim("b", PLAN, "h1", T0, LEASE).execution_id
    for seq in range(5):
        journal.record(a, seq, "pull", bytes([seq]), T0)
    journal.record(b, 0, "pull", b"kept", T0)
    assert other.collect(a, below=3) == 3
    assert [s.seq for s in journal.steps(a)] == [3, 4]
    assert other.collect(a) == 2
    assert journal.steps(a) == []
    assert other.collect(a) == 0
    assert [s.value for s in journal.steps(b)] == [b"kept"]
    # A collected step records afresh: nothing of the collected value survives.
    assert journal.record(a, 0, "pull", b"after collection", T0 + 1) == b"after collection"


def test_capabilities(journal: JournalStore) -> None:
    assert journal.capabilities() == {"journal": True, "blobs": True, "awakeables": True,
                                      "conditional_writes": True}


# --- races across processes ----------------------------------------------------------------------

PROCESSES = 4
STEPS = 12
TIMEOUT_S = 120.0


def _recorder(site: JournalSite, execution: str, tag: int, start: Any, results: Any) -> None:
    try:
        journal = site.open()
        try:
            start.wait(TIMEOUT_S)
            got = [journal.record(execution, seq, f"step {seq}", f"writer {tag} step {seq}".encode(), T0 + tag)
                   for seq in range(STEPS)]
        finally:
            journal.close_store()
        results.put((tag, "ok", got))
    except BaseException:  # noqa: BLE001 - a child reports every failure to the test
        start.abort()
        results.put((tag, "error", traceback.format_exc()))


def _claimer(site: JournalSite, tag: int, start: Any, results: Any) -> None:
    try:
        journal = site.open()
        try:
            start.wait(TIMEOUT_S)
            try:
                row = journal.claim("contended", PLAN, f"holder {tag}", T0, LEASE)
                outcome = (tag, "claimed", row.execution_id)
            except JournalConflict as exc:
                outcome = (tag, "refused", exc.execution)
        finally:
            journal.close_store()
        results.put(outcome)
    except BaseException:  # noqa: BLE001
        start.abort()
        results.put((tag, "error", traceback.format_exc()))


def _opener(site: JournalSite, tag: int, start: Any, results: Any) -> None:
    """Open the execution handle on ``contended`` once the seeded owner's lease lapsed."""
    try:
        journal = site.open()
        try:
            start.wait(TIMEOUT_S)
            try:
                execution = open_execution(journal, "contended", PLAN, holder=f"holder {tag}", lease_s=LEASE / 1e6,
                                           clock=ManualClock(T0 + LEASE))
                outcome = (tag, "opened", execution.execution_id, execution.attempt)
            except JournalConflict as exc:
                outcome = (tag, "refused", exc.execution, 0)
        finally:
            journal.close_store()
        results.put(outcome)
    except BaseException:  # noqa: BLE001
        start.abort()
        results.put((tag, "error", traceback.format_exc()))


def _run_children(target: Any, args_for: Any) -> list[tuple[Any, ...]]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(tag), start, results)) for tag in range(PROCESSES)]
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
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    return sorted(outcomes)


def test_concurrent_recorders_of_one_step_all_read_the_first_value(site: JournalSite,
                                                                   journal: JournalStore) -> None:
    execution = journal.claim("orders", PLAN, "h1", T0, LEASE).execution_id
    outcomes = _run_children(_recorder, lambda tag: (site, execution, tag))
    seen = [got for _tag, _status, got in outcomes]
    assert all(got == seen[0] for got in seen), seen
    stored = journal.steps(execution)
    assert [s.value for s in stored] == seen[0]
    for seq, step in enumerate(stored):
        assert step.seq == seq and step.label == f"step {seq}"
        writer = int(step.value.split()[1])  # the value one of the writers offered, whole
        assert step.value == f"writer {writer} step {seq}".encode()
        assert step.recorded_us == T0 + writer


def test_concurrent_claimers_of_one_scope_elect_one_holder(site: JournalSite, journal: JournalStore) -> None:
    outcomes = _run_children(_claimer, lambda tag: (site, tag))
    claimed = [o for o in outcomes if o[1] == "claimed"]
    assert len(claimed) == 1, outcomes
    winner, _, execution = claimed[0]
    assert all(o[1] == "refused" and o[2] == execution for o in outcomes if o is not claimed[0]), outcomes
    owner = journal.owner("contended")
    assert owner is not None
    assert (owner.execution_id, owner.holder, owner.attempts) == (execution, f"holder {winner}", 1)


# --- pins and held owners (run.own.host-scope, run.journal.current-owner) -------------------------


@pytest.mark.clause("run.own.host-scope")
def test_an_owner_pins_the_identities_its_claim_supplies(journal: JournalStore, other: JournalStore) -> None:
    pins = {"body.implementation": "d" * 64, "input": "orders@17"}
    first = journal.claim("host:digest", PLAN, "h1", T0, LEASE, pins)
    assert other.owner("host:digest") == first and first.pin_map() == pins
    with pytest.raises(OwnerPinsMismatch) as info:
        other.claim("host:digest", PLAN, "h2", T0 + LEASE, LEASE, {**pins, "input": "orders@18"})
    assert (info.value.pinned, info.value.offered) == (pins, {**pins, "input": "orders@18"})
    assert other.claim("host:digest", PLAN, "h2", T0 + LEASE, LEASE, pins).attempts == 2


@pytest.mark.clause("run.journal.current-owner")
def test_hold_owners_reads_the_executions_row_and_the_scopes_asked_for(journal: JournalStore,
                                                                      other: JournalStore) -> None:
    parent = journal.claim("job", PLAN, "h0", T0, LEASE)
    first = journal.claim("orders", PLAN, "h1", T0, LEASE)
    with other.hold_owners(first.execution_id, ["job", "absent"]) as held:
        assert held.own == first and held.others == {"job": parent}
    journal.close(first.execution_id, "h1", CLOSED_OK, T0 + 1)
    journal.claim("orders", PLAN, "h2", T0 + 2, LEASE)  # a new execution replaces it under the scope
    with other.hold_owners(first.execution_id) as held:
        assert held.own is None and held.others == {}

def test_processes_racing_to_open_a_lapsed_scope_resume_it_once(site: JournalSite, journal: JournalStore) -> None:
    """The pending execution of a holder that is gone: of the processes opening the scope once its
    lease lapsed, exactly one resumes it (the same execution, attempt 2); the others are refused
    naming it, and none opens a second execution."""
    seeded = journal.claim("contended", PLAN, "gone", T0, LEASE)
    outcomes = _run_children(_opener, lambda tag: (site, tag))
    opened = [o for o in outcomes if o[1] == "opened"]
    assert len(opened) == 1, outcomes
    winner, _, execution, attempt = opened[0]
    assert (execution, attempt) == (seeded.execution_id, 2)
    assert all(o[1:] == ("refused", execution, 0) for o in outcomes if o is not opened[0]), outcomes
    owner = journal.owner("contended")
    assert owner is not None
    assert (owner.execution_id, owner.holder, owner.attempts) == (execution, f"holder {winner}", 2)
