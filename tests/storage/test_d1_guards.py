"""Durable callback guards on the D1 profile (``storage.d1.guards``), against the Worker under miniflare.

The conformance tests of the guard rows at the storage port: the guard is taken where production
takes it (the D1 journal's ``hold_owners``, which an execution's admission uses) or through
:class:`~contextful.storage.d1.guards.CallbackGuards` on the same binding, for what the production
path does not reach (a publication callback's evidence class, ancestors and entity fences). The
same clauses are claimed end to end, through ``contextful job fire`` calling a delegate on the D1
profile, by tests/engine/jobs/test_delegate_guard.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from contextful.engine.run.execution import open_execution
from contextful.engine.run.keeper import Keeper
from contextful.storage.clock import ManualClock, SystemClock
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.guards import RECEIPT_REQUIRED, REPLAY_SAFE, UNKNOWN, CallbackGuards
from contextful.storage.d1.journal import D1JournalStore
from contextful.storage.d1.outbox import D1OutboxStore
from contextful.storage.errors import CallbackGuardHeld, ExecutionWriterFenced
from contextful.storage.fence import WriterFence
from contextful.storage.holders import holder_is_dead
from contextful.storage.journal import CallbackIdentity, OwnerRow, StepRow

from tests.support.cli import contextful_in

pytestmark = pytest.mark.d1

T0 = 1_700_000_000_000_000
S = 1_000_000
LEASE = 30 * S
PLAN = "a" * 64
KEY = CallbackIdentity("row/k1/delegate/1", "job:exec:k1", dedup_window_secs=60)


@pytest.fixture
def journal(d1_binding: D1Binding) -> D1JournalStore:
    return D1JournalStore(d1_binding.client())


def _claims(journal: D1JournalStore, *scopes: str, holder: str = "h1") -> list[OwnerRow]:
    return [journal.claim(scope, PLAN, holder, T0, LEASE) for scope in scopes]


@pytest.mark.clause("run.callback-guard.acquire")
def test_acquire_binds_every_row_exactly_as_read_and_a_guarded_row_admits_no_second_callback(
        journal: D1JournalStore) -> None:
    own, parent, fence = _claims(journal, "job/item", "job", "entity:e1")
    guards = journal.guards
    guard = guards.acquire(own, [parent, fence], KEY, T0)
    assert guard is not None and guard.scopes == ("job/item", "job", "entity:e1")
    # another callback over any row this guard protects is refused, naming the row and the guard
    with pytest.raises(CallbackGuardHeld) as refused:
        guards.acquire(fence, [], CallbackIdentity("row/k2/delegate/1", "job:exec:k2"), T0)
    assert (refused.value.scope, refused.value.token) == ("entity:e1", guard.token)
    with pytest.raises(CallbackGuardHeld), journal.hold_owners(own.execution_id, ["job"]):
        pytest.fail("a second callback was admitted over guarded rows")
    assert [g.token for g in guards.guards()] == [guard.token]
    guards.release(guard)
    # a row as read that is no longer the owner's (another attempt, another lease) binds nothing
    renewed = journal.renew(own.execution_id, "h1", T0 + S, LEASE)
    assert guards.acquire(own, [parent], KEY, T0) is None
    stale_attempt = OwnerRow(**{**renewed.__dict__, "attempts": renewed.attempts + 1})
    assert guards.acquire(stale_attempt, [], KEY, T0) is None
    assert guards.guards() == []
    assert guards.acquire(renewed, [parent, fence], KEY, T0) is not None


@pytest.mark.clause("run.callback-guard.identity")
def test_a_guard_records_its_callbacks_identity_and_window_or_none(journal: D1JournalStore) -> None:
    (own,) = _claims(journal, "job")
    guards = journal.guards
    token = guards.acquire(own, [], KEY, T0 + 5).token  # type: ignore[union-attr]
    stored = guards.guard(token)
    assert stored is not None
    assert (stored.execution_id, stored.attempt, stored.holder, stored.journal_entry, stored.idempotency_key,
            stored.admitted_us, stored.dedup_window_secs) == (
        own.execution_id, own.attempts, "h1", "row/k1/delegate/1", "job:exec:k1", T0 + 5, 60)
    assert guards.release(stored)
    with journal.hold_owners(own.execution_id, callback=CallbackIdentity("row/k2/delegate/1", "job:exec:k2")):
        (windowless,) = guards.guards()
        assert (windowless.execution_id, windowless.attempt, windowless.holder, windowless.journal_entry,
                windowless.idempotency_key, windowless.dedup_window_secs) == (
            own.execution_id, own.attempts, "h1", "row/k2/delegate/1", "job:exec:k2", None)


@pytest.mark.clause("run.callback-guard.scope", "run.journal.d1-guard")
def test_a_guard_blocks_transfer_of_its_rows_only(journal: D1JournalStore) -> None:
    own, _parent, fence, other = _claims(journal, "job/item", "job", "entity:e1", "other-job")
    with journal.hold_owners(own.execution_id, ["job", "entity:e1"]) as held:
        assert held.own == own
        (guard,) = journal.guards.guards()
        assert guard.scopes == ("job/item", "job", "entity:e1")
        # the holder's own renewal is no transfer: it proceeds
        journal.renew(own.execution_id, "h1", T0 + S, LEASE)
        after_lapse = T0 + 2 * LEASE
        for scope in ("job/item", "job", "entity:e1"):  # takeover, retirement: refused while guarded
            with pytest.raises(CallbackGuardHeld) as refused:
                journal.claim(scope, PLAN, "h2", after_lapse, LEASE)
            assert (refused.value.scope, refused.value.token) == (scope, guard.token)
        with pytest.raises(CallbackGuardHeld):
            journal.retire(fence.execution_id, after_lapse)
        # another job's admission, an unrelated export and the transfer of an unprotected row proceed
        with journal.hold_owners(other.execution_id) as second:
            assert second.own == other
        outbox = D1OutboxStore(journal.client)
        writer = WriterFence(other.execution_id, "h1", other.attempts, journal.location)
        (event,) = outbox.stage("orders", [(1, "e1", "webhook", b"{}")], 1, T0, fence=writer)
        assert outbox.acknowledge("orders", [event.event_id], {"k": b"v"}, fence=writer) == 1
        taken = journal.claim("other-job", PLAN, "h2", after_lapse, LEASE)
        assert (taken.holder, taken.attempts) == ("h2", 2)
    assert journal.guards.guards() == []
    assert journal.claim("entity:e1", PLAN, "h2", T0 + 2 * LEASE, LEASE).holder == "h2"


@pytest.mark.clause("run.callback-guard.release")
def test_the_holder_deletes_its_guard_when_the_callback_returns_before_journaling_its_value(
        journal: D1JournalStore) -> None:
    (own,) = _claims(journal, "job")
    seen: list[tuple[int, int]] = []

    class Watched(D1JournalStore):  # sees, as each step lands, how many guards are still committed
        def _insert_step(self, row: StepRow, fence=None):  # type: ignore[no-untyped-def]
            seen.append((row.seq, len(self.guards.guards())))
            return super()._insert_step(row, fence)

    watched = Watched(journal.client)
    with watched.hold_owners(own.execution_id) as held:
        assert len(watched.guards.guards()) == 1
        stored = held.record(StepRow(own.execution_id, 0, "answer", b"v", T0))
        assert stored.value == b"v"
        assert watched.guards.guards() == []
    assert seen == [(0, 0)]
    # a callback that raises still releases its guard on the way out
    with pytest.raises(RuntimeError), watched.hold_owners(own.execution_id):
        raise RuntimeError("the callback failed")
    assert watched.guards.guards() == []


@pytest.mark.clause("run.callback-guard.release")
def test_an_executions_dispatched_callback_runs_under_its_guard_and_journals_after_releasing_it(
        journal: D1JournalStore) -> None:
    execution = open_execution(journal, "job", PLAN, keeper=Keeper(start=False))
    value = execution.dispatch("answer", lambda: {"guards": [g.execution_id for g in journal.guards.guards()]},
                               deadline_s=5)
    assert value == {"guards": [execution.execution_id]}
    assert journal.guards.guards() == []
    assert [step.label for step in journal.steps(execution.execution_id)] == ["answer"]
    execution.close(ok=True)
    assert journal.owner("job").status == "closed-ok"  # type: ignore[union-attr]


@pytest.mark.clause("run.callback-guard.acquire")
def test_a_superseded_attempts_admission_guards_nothing(journal: D1JournalStore) -> None:
    acquired: list[str] = []

    class Recorded(CallbackGuards):
        def acquire(self, own, others, identity, now_us):  # type: ignore[no-untyped-def]
            acquired.append(own.holder)
            return super().acquire(own, others, identity, now_us)

    journal.guards = Recorded(journal.client)
    clock = ManualClock()
    old = open_execution(journal, "job", PLAN, holder="h1", lease_s=1, clock=clock, keeper=Keeper(start=False))
    clock.advance(2)
    new = open_execution(journal, "job", PLAN, holder="h2", lease_s=600, clock=clock, keeper=Keeper(start=False))
    with pytest.raises(ExecutionWriterFenced), old.admit():
        pytest.fail("a superseded attempt was admitted")
    assert acquired == []  # no guard was ever written naming the live holder for the stale attempt
    with new.admit():
        assert [g.holder for g in journal.guards.guards()] == ["h2"]
    assert acquired == ["h2"]


@pytest.mark.clause("run.callback-guard.replay")
def test_replay_releases_and_takes_over_in_one_batch_only_when_the_window_covers_the_key(
        journal: D1JournalStore) -> None:
    own, fence = _claims(journal, "job", "entity:e1")
    guards = journal.guards
    guard = guards.acquire(own, [fence], KEY, T0)
    assert guard is not None
    lapsed = own.lease_expires_us
    with pytest.raises(CallbackGuardHeld, match="not gone"):
        guards.replay(guard.token, "h2", lapsed, LEASE, holder_gone=lambda holder: False)
    with pytest.raises(CallbackGuardHeld, match="not lapsed"):
        guards.replay(guard.token, "h2", lapsed - 1, LEASE, holder_gone=lambda holder: True)
    with pytest.raises(CallbackGuardHeld, match="no longer covers key job:exec:k1"):
        guards.replay(guard.token, "h2", T0 + 60 * S, LEASE, holder_gone=lambda holder: True)
    assert journal.owner("job") == own and guards.guard(guard.token) == guard  # refusals change nothing
    replayed = guards.replay(guard.token, "h2", lapsed, LEASE, holder_gone=lambda holder: holder == "h1")
    assert replayed.idempotency_key == "job:exec:k1" and replayed.journal_entry == "row/k1/delegate/1"
    assert journal.owner("job") == replayed.owner
    assert (replayed.owner.holder, replayed.owner.attempts, replayed.owner.execution_id) == ("h2", 2,
                                                                                              own.execution_id)
    assert guards.guards() == []
    windowless = guards.acquire(replayed.owner, [], CallbackIdentity("e", "k"), lapsed)
    with pytest.raises(CallbackGuardHeld, match="declares no deduplication window"):
        guards.replay(windowless.token, "h3", lapsed + 2 * LEASE, LEASE,  # type: ignore[union-attr]
                      holder_gone=lambda holder: True)


@pytest.mark.clause("run.callback-guard.class")
def test_the_evidence_class_follows_the_window_then_the_callback_kind(journal: D1JournalStore) -> None:
    own, other = _claims(journal, "job", "pub")
    effect = journal.guards.acquire(own, [], KEY, T0)
    publication = journal.guards.acquire(other, [], CallbackIdentity("pub/1", "pub:1", 10, publication=True), T0)
    assert effect is not None and publication is not None
    assert effect.evidence_class(T0 + 59 * S) == REPLAY_SAFE
    assert effect.evidence_class(T0 + 60 * S) == UNKNOWN
    assert publication.evidence_class(T0 + 9 * S) == REPLAY_SAFE
    assert publication.evidence_class(T0 + 10 * S) == RECEIPT_REQUIRED
    stored = journal.guards.guard(publication.token)
    assert stored is not None and stored.publication and stored.evidence_class(T0 + 10 * S) == RECEIPT_REQUIRED
    journal.guards.release(effect)
    windowless = CallbackGuards(journal.client).acquire(own, [], CallbackIdentity("row/k9", "k9"), T0)
    assert windowless is not None and windowless.evidence_class(T0) == UNKNOWN


_CHILD = """
import sys
from contextful.engine.run.execution import open_execution
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.journal import D1JournalStore

journal = D1JournalStore(D1Binding(*sys.argv[1:4]).client())
execution = open_execution(journal, "job", sys.argv[4], lease_s=30)
with execution.admit(fences=["entity:e1"], deadline_s=5):
    print(execution.execution_id, flush=True)
    sys.stdin.read()  # the callback: the parent kills this process inside it
"""


@pytest.mark.clause("run.journal.d1-guard")
def test_a_committed_guard_outlives_its_holders_crash_inside_an_admitted_callback(
        journal: D1JournalStore, d1_binding: D1Binding) -> None:
    fence = journal.claim("entity:e1", PLAN, "fence-holder", SystemClock().now_us(), 600 * S)  # the child's clock
    child = subprocess.Popen([sys.executable, "-c", _CHILD, d1_binding.url, d1_binding.token, d1_binding.namespace,
                              PLAN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        execution_id = child.stdout.readline().strip()  # type: ignore[union-attr]  # blocks until admitted
        assert execution_id, "the child was not admitted"
    finally:
        child.kill()
        child.wait(timeout=60)
    (guard,) = journal.guards.guards()
    assert guard.execution_id == execution_id and guard.scopes == ("job", "entity:e1")
    assert holder_is_dead(guard.holder)
    owner = journal.owner("job")
    assert owner is not None and owner.holder == guard.holder
    # the holder is provably dead and, later, its lease has lapsed: still no transfer of any guarded row
    with pytest.raises(CallbackGuardHeld) as refused:
        open_execution(journal, "job", PLAN, take_over_dead=True, keeper=Keeper(start=False))
    assert refused.value.token == guard.token
    with pytest.raises(CallbackGuardHeld):
        journal.claim("job", PLAN, "h2", owner.lease_expires_us + LEASE, LEASE)
    with pytest.raises(CallbackGuardHeld):
        journal.retire(fence.execution_id, fence.lease_expires_us + LEASE)
    # the admission declared no deduplication window, so no replay either: only an operator releases it
    with pytest.raises(CallbackGuardHeld, match="declares no deduplication window"):
        journal.guards.replay(guard.token, "h2", owner.lease_expires_us + LEASE, LEASE, holder_gone=holder_is_dead)
    assert journal.guards.guards() == [guard] and journal.owner("job") == owner


@pytest.mark.clause("run.callback-guard.manual")
def test_reconcile_guard_deletes_the_guard_and_audits_token_evidence_and_operator(
        journal: D1JournalStore, d1_binding: D1Binding, tmp_path: Path) -> None:
    own, fence = _claims(journal, "job", "entity:e1")
    guard = journal.guards.acquire(own, [fence], KEY, T0)
    assert guard is not None
    env = {"CONTEXTFUL_D1_URL": d1_binding.url, "CONTEXTFUL_D1_TOKEN": d1_binding.token,
           "CONTEXTFUL_D1_NAMESPACE": d1_binding.namespace}
    # refusals change nothing: no binding, an empty evidence, a token no guard has
    unbound = contextful_in(tmp_path, "storage", "reconcile-guard", guard.token, "--evidence", "x", "--operator", "o",
                            check=False)
    assert unbound.returncode != 0 and "error: StorageCapabilityMissing: " in unbound.stderr
    assert "CONTEXTFUL_D1_URL" in unbound.stderr
    empty = contextful_in(tmp_path, "storage", "reconcile-guard", guard.token, "--evidence", " ", "--operator", "o",
                          env=env, check=False)
    assert empty.returncode != 0 and "error: ArgumentInvalid: --evidence" in empty.stderr
    unknown = contextful_in(tmp_path, "storage", "reconcile-guard", "f" * 32, "--evidence", "x", "--operator", "o",
                            env=env, check=False)
    assert unknown.returncode != 0 and "error: NotFound: " in unknown.stderr and "f" * 32 in unknown.stderr
    assert journal.guards.guards() == [guard] and journal.guards.audit() == []
    with pytest.raises(CallbackGuardHeld):
        journal.claim("job", PLAN, "h2", own.lease_expires_us, LEASE)

    done = contextful_in(tmp_path, "storage", "reconcile-guard", guard.token, "--evidence", "receipt r-17 in the sink",
                         "--operator", "ana", env=env)
    assert guard.token in done.stdout and "operator ana" in done.stdout
    assert journal.guards.guards() == []
    (audit,) = journal.guards.audit()
    assert audit[:3] == (guard.token, "receipt r-17 in the sink", "ana")
    # the rows it protected transfer again
    assert journal.claim("job", PLAN, "h2", own.lease_expires_us, LEASE).holder == "h2"
    assert journal.retire(fence.execution_id, fence.lease_expires_us).status == "retired"
