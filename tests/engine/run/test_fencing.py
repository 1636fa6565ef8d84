"""Fencing: an attempt that lost its execution changes nothing (``run.journal.current-owner``).

Two attempts over one execution: the first stalls (a stopped process, a partitioned host), the
second takes the lease over once it lapsed (on its own clock), and the first resumes. Every effect
the stalled attempt then tries — a journal step, a cached cursor, a collect, a close, a renewal, an
admitted callback, a store commit — refuses with ExecutionWriterFenced, and the journal, the table
and its cursor hold only the new attempt's work. On every journal adapter, and through the landing
path on every store kind.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.journal import LEASE_S
from contextful.engine.land.pipeline import cursor_scope, run_pipeline
from contextful.engine.land.results import Progress
from contextful.engine.run.dispatch import PUBLICATION
from contextful.engine.run.execution import Execution, open_execution
from contextful.engine.run.keeper import Keeper
from contextful.engine.run.owners import Scope
from contextful.engine.run.plan import pipeline_reference
from contextful.storage import Store
from contextful.storage.clock import ManualClock, SystemClock
from contextful.storage.errors import ExecutionWriterFenced
from contextful.storage.journal import PENDING, JournalStore

from tests.conftest import StoreFactory

PLAN = "f" * 64
SCOPE = Scope.host("job:fenced")
S = 1_000_000


def _fenced(call: object, *args: object, **kwargs: object) -> ExecutionWriterFenced:
    with pytest.raises(ExecutionWriterFenced) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value


def _stalled_and_new(journal: JournalStore, clock: ManualClock, keeper: Keeper) -> tuple[Execution, Execution]:
    stalled = open_execution(journal, SCOPE, PLAN, holder="host-a:1:stalled", lease_s=30, clock=clock, keeper=keeper)
    stalled.step("pull 1", lambda: {"rows": 1})
    clock.advance(31)  # the stalled attempt renewed nothing: its lease lapsed
    new = open_execution(journal, SCOPE, PLAN, holder="host-b:1:new", lease_s=30, clock=clock, keeper=keeper)
    assert (new.execution_id, new.attempt) == (stalled.execution_id, 2)
    new.discard_recorded()  # a landing resumption pulls afresh from the committed position
    return stalled, new


@pytest.mark.clause("run.journal.current-owner")
def test_every_journal_effect_of_a_superseded_attempt_is_refused_and_records_nothing(journal: JournalStore) -> None:
    clock, keeper = ManualClock(), Keeper(ManualClock(), start=False)
    stalled, new = _stalled_and_new(journal, clock, keeper)
    new.step("pull 1", lambda: {"rows": 10})

    # the stalled attempt resumes: each effect it tries is refused in the write itself
    assert "attempt 2 of host-b:1:new" in _fenced(stalled.step, "pull 2", lambda: {"rows": 2}).reason
    calls: list[str] = []
    _fenced(stalled.dispatch, "paid call", lambda: calls.append("called") or {"ok": 1}, deadline_s=5)
    _fenced(stalled.cache_cursor, {"position": 99})
    _fenced(stalled.collect_steps)
    _fenced(stalled.close, ok=True)
    assert calls == []  # the provider was never called

    owner = journal.owner(SCOPE.key)
    assert owner is not None and (owner.status, owner.holder, owner.attempts, owner.cursor) == (
        PENDING, "host-b:1:new", 2, None)
    assert [(s.seq, s.label, s.value) for s in journal.steps(new.execution_id)] == [(0, "pull 1", b'j{"rows":10}')]
    new.close(ok=True)


@pytest.mark.clause("run.journal.current-owner")
def test_a_lost_renewal_fences_the_attempt_so_its_next_effect_refuses_at_once(journal: JournalStore) -> None:
    clock = ManualClock()
    keeper = Keeper(clock, poll_s=1, start=False)
    stalled = open_execution(journal, SCOPE, PLAN, holder="host-a:1:stalled", lease_s=30, clock=clock, keeper=keeper)
    other = ManualClock(clock.now_us() + 31 * S)  # a second host sees the lease lapsed
    taken = open_execution(journal, SCOPE, PLAN, holder="host-b:1:new", lease_s=30, clock=other,
                           keeper=Keeper(other, start=False))
    clock.advance(15)
    keeper.tick()  # the stalled attempt's renewal finds another holder: it is fenced from now on
    assert stalled.fenced is not None and "host-b:1:new" in stalled.fenced
    journal.close_store()  # its next effect refuses before any I/O: nothing it could reach is asked
    error = _fenced(stalled.step, "pull 1", lambda: {"rows": 1})
    assert error.execution == taken.execution_id and error.attempt == 1


@pytest.mark.clause("run.journal.current-owner")
def test_a_stalled_landing_commits_nothing_after_the_takeover_and_leaves_the_new_attempts_work(
        make_store: StoreFactory, store_kind: str, tmp_path: Path, decoder: Decoder) -> None:
    """Through ``run_pipeline``: the stalled run staged input 1 and journaled its pull; another
    attempt takes the execution over, pulls afresh and commits; the stalled run's commit is refused
    in the catalog transaction, and it leaves the execution to its new holder."""
    project = tmp_path / "project"
    (project / "raw").mkdir(parents=True)
    (project / "contextful.toml").write_text('[project]\nname = "f"\n[[pipeline]]\nid = "events"\n'
                                             '[pipeline.source]\nkind = "files"\n'
                                             '[pipeline.source.config]\npaths = ["raw/*.ndjson"]\n')
    for name in ("a", "b"):
        (project / "raw" / f"{name}.ndjson").write_text(f'{{"id": "{name}1"}}\n{{"id": "{name}2"}}\n')
    manifest = load_manifest(project)
    spec = manifest.pipeline("events")
    store: Store = make_store()
    stalled_at, resume = threading.Event(), threading.Event()

    def stall(progress: Progress) -> None:  # after input 1 is staged and its pull journaled
        if progress.done == 1 and not stalled_at.is_set():
            stalled_at.set()
            resume.wait()

    outcome: list[BaseException | object] = []

    def stalled_run() -> None:
        try:
            outcome.append(run_pipeline(store, manifest, spec, decoder, checkpoint_bytes=1, progress=stall))
        except BaseException as exc:  # noqa: BLE001 - the test reads it below
            outcome.append(exc)

    thread = threading.Thread(target=stalled_run)
    thread.start()
    assert stalled_at.wait(120)
    # another host, whose clock is past the stalled run's lease, takes the execution over
    later = ManualClock(SystemClock().now_us() + int(LEASE_S + 1) * S)
    new = open_execution(store.journal, Scope.table(cursor_scope(spec)), pipeline_reference(spec),
                         holder="host-b:1:new", clock=later, keeper=Keeper(later, start=False))
    assert new.attempt == 2
    new.discard_recorded()
    with new.writing():
        table = store.create_table("events")
        table.append(pa.table({"id": ["new"]}), cursor=(cursor_scope(spec), {"by": "new"}))
    new.step("input new", lambda: {"input": "new"})
    resume.set()
    thread.join(120)

    [error] = outcome
    assert isinstance(error, ExecutionWriterFenced) and error.boundary == PUBLICATION
    assert "attempt 2 of host-b:1:new" in error.reason
    table = store.table("events")
    assert table.to_arrow().column("id").to_pylist() == ["new"]  # none of the stalled run's rows
    assert table.cursor(cursor_scope(spec))[0] == {"by": "new"}
    assert [s.label for s in store.journal.steps(new.execution_id)] == ["input new"]
    owner = store.journal.owner(cursor_scope(spec))
    assert owner is not None and (owner.status, owner.holder, owner.attempts) == (PENDING, "host-b:1:new", 2)
    new.close(ok=True)


# --- each paid call once (run.journal.durable-dispatch) ---------------------------------------------


@pytest.mark.clause("run.journal.durable-dispatch")
def test_a_callback_is_admitted_only_under_a_lease_that_outlives_its_deadline(journal: JournalStore) -> None:
    clock = ManualClock()
    execution = open_execution(journal, SCOPE, PLAN, holder="a", lease_s=30, clock=clock,
                               keeper=Keeper(clock, start=False))
    clock.advance(30 - 1e-6)  # one microsecond of lease left
    seen: list[int] = []

    def call() -> dict[str, int]:
        owner = journal.owner(SCOPE.key)  # read beside the hold
        assert owner is not None
        seen.append(owner.lease_expires_us)
        return {"answer": 42}

    assert execution.dispatch("provider call", call, deadline_s=120) == {"answer": 42}
    assert seen and seen[0] > clock.now_us() + 120 * S  # renewed first: the lease runs past the deadline
    assert execution.dispatch("provider call", lambda: {"answer": 0}, deadline_s=120) == {"answer": 0}  # next step
    again = open_execution(journal, SCOPE, PLAN, holder="a", lease_s=30, clock=clock, keeper=Keeper(clock, start=False))
    replayed = again.dispatch("provider call", lambda: pytest.fail("a recorded call is never made again"),
                              deadline_s=120)
    assert replayed == {"answer": 42}


@pytest.mark.postgres
@pytest.mark.clause("run.journal.durable-dispatch")
def test_a_takeover_during_the_callback_reads_its_value_and_never_calls_again(pg_dsn: str, pg_schema: str) -> None:
    """The takeover waits for the hold, and the hold ends with the callback's value recorded: the
    new attempt replays it (one provider call for one step)."""
    import psycopg
    from contextful.storage.journal import open_journal_store

    mine = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)
    theirs = open_journal_store("postgres", dsn=pg_dsn, schema=pg_schema)  # another process's connection
    clock = ManualClock()
    first = open_execution(mine, SCOPE, PLAN, holder="a", lease_s=30, clock=clock, keeper=Keeper(clock, start=False))
    calls: list[str] = []
    claimed = threading.Event()
    taken: list[Execution] = []

    def take_over() -> None:
        later = ManualClock(clock.now_us() + 3600 * S)  # a host that sees the lease lapsed
        taken.append(open_execution(theirs, SCOPE, PLAN, holder="b", lease_s=30, clock=later,
                                    keeper=Keeper(later, start=False)))
        claimed.set()

    def blocked() -> bool:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                               (theirs._conn.info.backend_pid,)).fetchone()  # type: ignore[attr-defined]
        return row is not None and row[0] == "Lock"

    def call() -> dict[str, str]:
        calls.append("paid")
        threading.Thread(target=take_over).start()
        while not blocked():  # the takeover is waiting on the held owner row
            assert not claimed.wait(0.05), "the takeover claimed while the callback was admitted"
        return {"answer": "first"}

    assert first.dispatch("provider call", call, deadline_s=60) == {"answer": "first"}
    assert claimed.wait(60)
    [second] = taken
    again = second.dispatch("provider call", lambda: calls.append("again") or {"answer": "second"}, deadline_s=60)
    assert again == {"answer": "first"} and calls == ["paid"]
    _fenced(first.step, "after", dict)


# --- retirement conditioned on what its check read (run.own.rewind-unsafe) -------------------------


@pytest.mark.clause("run.own.rewind-unsafe", "run.own.apply-retires-superseded")
@pytest.mark.parametrize("verb", ["rewind", "apply"])
def test_a_claim_landing_between_the_safety_check_and_the_retirement_is_never_retired(
        journal: JournalStore, verb: str) -> None:
    import io

    from contextful.engine.run.owners import AppliedDeclarations, retire_superseded
    from contextful.engine.run.rewind import rewind
    from contextful.storage.awakeables import awakeable_store_beside
    from contextful.storage.errors import ExecutionRewindUnsafe

    clock = ManualClock()
    keeper = Keeper(clock, start=False)
    gone = open_execution(journal, SCOPE, PLAN, holder="host-a:1:gone", lease_s=30, clock=clock, keeper=keeper)
    clock.advance(31)  # its lease lapsed: retiring it is safe, as the check reads it
    real = awakeable_store_beside(journal)
    claimed: list[Execution] = []

    class ClaimDuringCheck:  # the check's last read (pending awakeables) lets a claim land after it
        def pending_for(self, execution_id: str, now_us: int) -> list[object]:
            claimed.append(open_execution(journal, SCOPE, PLAN, holder="host-b:1:live", lease_s=30, clock=clock,
                                          keeper=keeper))
            return list(real.pending_for(execution_id, now_us))

        def close_store(self) -> None:
            real.close_store()

    hook = ClaimDuringCheck()
    if verb == "rewind":
        with pytest.raises(ExecutionRewindUnsafe) as info:
            rewind(journal, gone.execution_id, "operator", clock=clock, awakeables=hook)  # type: ignore[arg-type]
        assert "host-b:1:live" in info.value.detail
    else:
        err = io.StringIO()
        out = retire_superseded(journal, journal.owners(), AppliedDeclarations(frozenset({"0" * 64})), clock=clock,
                                stderr=err, awakeables=hook)  # type: ignore[arg-type]
        assert out.retired == () and out.claimed and gone.execution_id in err.getvalue()
    owner = journal.owner(SCOPE.key)
    assert owner is not None and (owner.status, owner.holder) == (PENDING, "host-b:1:live")
    claimed[0].step("still mine", lambda: {"ok": True})  # the live claim goes on unharmed
