"""The orchestrator role's conformance suite, run against the engine runner on every storage adapter.

An orchestrator adapter (``engine.run.orchestrate``) is conformant when this suite passes against
it: every substrate operation is there (``run.orchestrate.role``), a provider step per table pull or
backfill chunk records that unit's commit pointer and nothing else while the engine's journal entries
stay inside the step (``run.orchestrate.provider-step``), and the journal, retry, suspend and cancel
clauses hold inside a provider step (``run.orchestrate.semantics``). The adapter under test comes
from the ``orchestrator`` fixture: parametrize it over another adapter to hold that one to the suite.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.run.execution import plan_reference
from contextful.engine.run.keeper import Keeper
from contextful.engine.run.orchestrate import (
    HANDLE_OPERATIONS,
    SUBSTRATE_OPERATIONS,
    EngineOrchestrator,
    ExecutionHandle,
    Orchestrator,
    orchestrator_for,
)
from contextful.engine.run.owners import Scope
from contextful.engine.run.retry import RetrySchedule
from contextful.storage import ManualClock, Store
from contextful.storage.awakeables import awakeable_store_beside
from contextful.storage.errors import (
    CancelTargetNotInFlight,
    RunCanceled,
    SourceUnavailable,
    StorageCapabilityMissing,
)
from contextful.storage.journal import CLOSED_CANCELED, CLOSED_OK, PENDING, JournalStore

from tests.engine.run import provider_step_child as child_run
from tests.storage.test_journal_conformance import KINDS, JournalSite, journal_site

T0 = 1_700_000_000_000_000
WORKFLOW = Scope.host("workflow:nightly")
WORKFLOW_PLAN = plan_reference({"workflow": "nightly", "v": 1})
UNIT_PLAN = plan_reference({"pipeline": "orders", "v": 1})


@dataclass
class Rig:
    orchestrator: Orchestrator
    journal: JournalStore
    store: Store
    clock: ManualClock


@pytest.fixture(params=KINDS)
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    journal = journal_site(request.param, request, tmp_path).open()
    awakeables = awakeable_store_beside(journal)
    clock = ManualClock(T0)
    orchestrator = EngineOrchestrator(journal, awakeables=awakeables, clock=clock, keeper=Keeper(clock, start=False))
    store = Store.open(tmp_path / "store")
    try:
        yield Rig(orchestrator, journal, store, clock)
    finally:
        store.close()
        awakeables.close_store()
        journal.close_store()


def _land(store: Store, table: str, rows: int) -> int:
    """Commit ``rows`` rows to ``table``; its commit pointer (the table's commit_seq) after."""
    return store.append(table, pa.table({"i": pa.array(range(rows), pa.int64())})).commit_seq


def _steps(journal: JournalStore, execution_id: str) -> list[str]:
    return [step.label for step in journal.steps(execution_id)]


@pytest.mark.clause("run.orchestrate.role", "run.journal.substrate-port")
def test_the_engine_runner_implements_every_substrate_operation(rig: Rig) -> None:
    orchestrator = rig.orchestrator
    handle = orchestrator.open(Scope.host("role"), UNIT_PLAN, holder="h")
    for operation in SUBSTRATE_OPERATIONS:  # each on the orchestrator or on the handle it opens
        assert callable(getattr(orchestrator, operation, None)) or callable(getattr(handle, operation, None)), operation
    for operation in HANDLE_OPERATIONS:
        assert callable(getattr(handle, operation)), operation
    assert orchestrator.capabilities() == {"journal": True, "blobs": True, "awakeables": True,
                                           "conditional_writes": True, "cancel": True, "provider_step": True}
    assert handle.capabilities()["awakeables"] is True
    handle.close(ok=True)

    assert isinstance(orchestrator_for("engine", rig.journal), EngineOrchestrator)
    with pytest.raises(StorageCapabilityMissing) as refused:  # a profile names only a conformant adapter
        orchestrator_for("step-functions", rig.journal)
    assert "step-functions" in str(refused.value) and "conformance" in str(refused.value)


@pytest.mark.clause("run.orchestrate.provider-step")
def test_a_provider_step_per_table_pull_or_chunk_records_only_its_commit_pointer(rig: Rig) -> None:
    orchestrator, journal, store = rig.orchestrator, rig.journal, rig.store
    ran: Counter[str] = Counter()
    units: dict[str, str] = {}

    def pull(table: str, rows: int) -> Callable[[ExecutionHandle], int]:
        def unit(execution: ExecutionHandle) -> int:
            ran[table] += 1
            units[table] = execution.execution_id
            execution.step("pull page 1", lambda: {"rows": rows})  # the engine's entries, inside the step
            execution.cache_cursor({"page": 1})
            return _land(store, table, rows)
        return unit

    workflow = orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w")
    assert orchestrator.provider_step(workflow, Scope.table("pipeline:orders"), UNIT_PLAN, pull("orders", 3)) == 1
    chunk = Scope.backfill_chunk("pipeline:orders", "2026-11")
    assert orchestrator.provider_step(workflow, chunk, UNIT_PLAN, pull("orders", 2)) == 2
    # The workflow holds one entry per provider step, the pointer; the pulls stay in the units.
    recorded = journal.steps(workflow.execution_id)
    assert [s.label for s in recorded] == ["provider step pipeline:orders", f"provider step {chunk.key}"]
    assert all(b"page" not in s.value for s in recorded)
    assert _steps(journal, units["orders"]) == ["pull page 1"]
    assert journal.owner("pipeline:orders").status == CLOSED_OK  # type: ignore[union-attr]
    assert journal.owner(chunk.key).status == CLOSED_OK  # type: ignore[union-attr]

    # The workflow's process dies (no close); its replacement replays both steps from their recorded
    # pointers, never running a committed unit again, then runs the next one.
    del workflow
    rig.clock.advance(120)
    again = orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w2")
    assert again.resumed
    assert orchestrator.provider_step(again, Scope.table("pipeline:orders"), UNIT_PLAN, pull("orders", 3)) == 1
    assert orchestrator.provider_step(again, chunk, UNIT_PLAN, pull("orders", 2)) == 2
    assert orchestrator.provider_step(again, Scope.table("pipeline:users"), UNIT_PLAN, pull("users", 4)) == 1
    assert ran == Counter({"orders": 2, "users": 1})
    assert store.table("orders").count() == 5 and store.table("users").count() == 4
    again.close(ok=True)


KILL_POINTS = ["unit-committed", "unit-closed", "pointer-recorded"]


@pytest.mark.slow
@pytest.mark.clause("run.orchestrate.provider-step")
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_workflow_killed_around_its_provider_steps_writes_runs_the_unit_once(
        site: JournalSite, tmp_path: Path, point: str) -> None:
    """A real process runs one provider step and is SIGKILLed at ``point``; the resumed workflow
    (another holder, once both leases lapsed) runs the step again. Past the unit's commit and before
    the workflow records anything (``unit-committed``) the unit runs again in its own resumed
    execution, and its table's cursor makes it land nothing new. Once the pointer is recorded or the
    unit closed, the unit never runs again: the replay returns the pointer and settles the unit's
    execution if it is still pending."""
    calls, store_dir = tmp_path / "calls", tmp_path / "store"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.run.provider_step_child", site.kind, site.location, site.schema,
         str(store_dir), str(calls), point],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).parents[3])
    assert child.stdout is not None
    try:
        line = child.stdout.readline()  # blocks until the child stalls at its point (or finishes)
        assert line.strip() == f"stall {point}", (line, child.communicate(timeout=120))
        child.send_signal(signal.SIGKILL)
        child.wait(120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL

    journal, store = site.open(), Store.open(store_dir)
    try:
        crashed = journal.owner(child_run.UNIT.key)
        assert crashed is not None
        clock = ManualClock(child_run.T0)
        clock.advance(2 * child_run.LEASE_S)  # the child's leases, the workflow's and the unit's, lapsed
        orchestrator = EngineOrchestrator(journal, clock=clock, keeper=Keeper(clock, start=False))
        workflow = orchestrator.open(child_run.WORKFLOW, child_run.WORKFLOW_PLAN, holder="w2",
                                     lease_s=child_run.LEASE_S)
        assert workflow.resumed
        unit = child_run.land_orders(store, calls)
        assert orchestrator.provider_step(workflow, child_run.UNIT, child_run.UNIT_PLAN, unit, holder="w2",
                                          lease_s=child_run.LEASE_S) == 1

        # The table holds the source's rows once, from one commit, whatever the kill interrupted.
        assert sorted(store.table(child_run.TABLE).to_arrow().column("id").to_pylist()) == list(
            range(child_run.SOURCE_ROWS))
        assert len(store.table(child_run.TABLE).commits()) == 1
        # The unit's body: once, or (killed before anything of the workflow's was written) once more
        # in the same execution resumed, landing nothing.
        assert calls.read_text().split() == (["1", "2"] if point == "unit-committed" else ["1"])
        owner = journal.owner(child_run.UNIT.key)
        assert owner is not None and (owner.execution_id, owner.status) == (crashed.execution_id, CLOSED_OK)
        [recorded] = journal.steps(workflow.execution_id)
        assert recorded.label == f"provider step {child_run.UNIT.key}"
        assert json.loads(recorded.value[1:]) == {"scope": child_run.UNIT.key, "execution": crashed.execution_id,
                                                 "commit_pointer": 1}
        workflow.close(ok=True)
    finally:
        store.close()
        journal.close_store()


@pytest.mark.clause("run.orchestrate.semantics", "run.own.unclosed-execution")
def test_the_journal_holds_inside_a_provider_step(rig: Rig) -> None:
    """A unit failing transiently stays pending; the next attempt resumes it and replays its entries."""
    orchestrator, journal = rig.orchestrator, rig.journal
    pulls: Counter[str] = Counter()
    fail = [True]

    def unit(execution: ExecutionHandle) -> int:
        page = execution.step("pull page 1", lambda: pulls.update(["page 1"]) or {"rows": 2})
        assert page == {"rows": 2}
        if fail[0]:
            raise SourceUnavailable("https://api.example.test/orders", "503 on page 2")
        return _land(rig.store, "orders", 2)

    workflow = orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w")
    with pytest.raises(SourceUnavailable):
        orchestrator.provider_step(workflow, Scope.table("pipeline:orders"), UNIT_PLAN, unit, holder="w")
    assert journal.steps(workflow.execution_id) == []  # nothing recorded for a failed step
    pending = journal.owner("pipeline:orders")
    assert pending is not None and pending.status == PENDING

    fail[0] = False
    assert orchestrator.provider_step(workflow, Scope.table("pipeline:orders"), UNIT_PLAN, unit, holder="w") == 1
    resumed = journal.owner("pipeline:orders")
    assert resumed is not None and resumed.execution_id == pending.execution_id and resumed.attempts == 2
    assert pulls == Counter({"page 1": 1})  # the recorded pull replayed, not pulled again
    workflow.close(ok=True)


@pytest.mark.clause("run.orchestrate.semantics")
def test_a_retry_schedule_holds_inside_a_provider_step(rig: Rig) -> None:
    waits: list[float] = []
    calls: Counter[str] = Counter()

    def flaky(attempt: int) -> int:
        calls["call"] += 1
        if attempt < 3:
            raise SourceUnavailable("https://api.example.test/orders", f"503 on attempt {attempt}")
        return 7

    def unit(execution: ExecutionHandle) -> int:
        schedule = RetrySchedule(attempts=3, base_s=1.0, jitter=0.0, sleep=waits.append)
        execution.attach_retry(schedule)
        rows = execution.step("pull page 1", lambda: {"rows": schedule.run("pull page 1", flaky)})
        assert rows == {"rows": 7}
        assert [(a.attempt, a.error) for a in schedule.attempts_log] == [
            (1, "SourceUnavailable"), (2, "SourceUnavailable"), (3, None)]
        return _land(rig.store, "orders", 7)

    workflow = rig.orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w")
    assert rig.orchestrator.provider_step(workflow, Scope.table("pipeline:orders"), UNIT_PLAN, unit) == 1
    assert calls["call"] == 3 and waits == [1.0, 2.0]
    workflow.close(ok=True)


@pytest.mark.clause("run.orchestrate.semantics", "run.suspend.awakeable")
def test_an_awakeable_holds_inside_a_provider_step(rig: Rig) -> None:
    awakeables = awakeable_store_beside(rig.journal)
    tokens: list[str] = []

    def approve(token: str) -> None:  # the outside party, handed the token while the row is pending
        tokens.append(token)
        awakeables.resolve(token, b"approved", "ops@example.test", rig.clock.now_us())

    def unit(execution: ExecutionHandle) -> int:
        assert execution.suspend("approve load", timeout_s=3600, on_token=approve) == b"approved"
        return _land(rig.store, "orders", 1)

    try:
        workflow = rig.orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w")
        assert rig.orchestrator.provider_step(workflow, Scope.table("pipeline:orders"), UNIT_PLAN, unit) == 1
        row = awakeables.get(tokens[0])
        assert row is not None and (row.state, row.payload, row.subject) == ("resolved", b"approved",
                                                                             "ops@example.test")
        workflow.close(ok=True)
    finally:
        awakeables.close_store()


@pytest.mark.clause("run.orchestrate.semantics", "run.cancel.abandoned-work", "run.cancel.not-in-flight")
def test_a_cancel_holds_inside_a_provider_step(rig: Rig) -> None:
    orchestrator, journal = rig.orchestrator, rig.journal

    def unit(execution: ExecutionHandle) -> int:
        execution.step("pull page 1", lambda: {"rows": 2})
        orchestrator.cancel(execution.execution_id)  # the operator's stop, while the unit runs
        execution.raise_if_canceled(durable=True)  # its next boundary
        return _land(rig.store, "orders", 2)

    workflow = orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w")
    with pytest.raises(RunCanceled):
        orchestrator.provider_step(workflow, Scope.table("pipeline:orders"), UNIT_PLAN, unit)
    owner = journal.owner("pipeline:orders")
    assert owner is not None and owner.status == CLOSED_CANCELED
    assert journal.steps(workflow.execution_id) == [] and "orders" not in rig.store.table_names()
    with pytest.raises(CancelTargetNotInFlight):  # nothing of it is in flight any more
        orchestrator.cancel(owner.execution_id)
    workflow.close(ok=True)
