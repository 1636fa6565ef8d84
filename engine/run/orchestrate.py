"""The orchestrator role: a port, with the engine runner over the storage ports as its reference.

Implements ``run.orchestrate.role``, ``run.orchestrate.provider-step`` and
``run.orchestrate.semantics`` (decision "orchestrator-role-port": the orchestrator role is a port,
and a provider's workflow engine fills it at the unit grain).

A target's orchestrator implements every operation of ``run.journal.substrate-port``
(:data:`SUBSTRATE_OPERATIONS`): open or resume an execution under a scope and a content-hashed
plan reference, record step output, commit a cursor, suspend on an awakeable with a timeout,
attach a retry schedule, describe capabilities — and the stop the substrate's callers send,
cancel, with close. :class:`EngineOrchestrator` is the reference implementation: the engine's own
:class:`~contextful.engine.run.execution.Execution` over a journal store (files, SQLite or
PostgreSQL), its awakeable store and the engine keeper.

A provider's workflow engine (a hosted step-function service, a durable-workflow runtime) fills
the role at the unit grain: :meth:`Orchestrator.provider_step` is one provider step per table pull
or backfill chunk. The unit's own execution, under the unit's scope, holds the engine's journal
entries (its pulls, suspensions, cursors) inside the step; the workflow records only what the unit
committed — the table's or chunk's commit pointer, beside the unit's execution id. The workflow
records the pointer before the unit's execution closes ``closed-ok``, so a unit is settled by one
durable write however the process dies around it: a crash before the record leaves the unit pending
and the next provider step resumes it (its own journal and its table's cursor make the rerun land
nothing new), a crash after it leaves a recorded pointer, which a replayed workflow returns without
running the unit again, settling the unit's execution if it is still pending. A unit that failed
before committing left its own execution pending, and the next provider step resumes it from its
recorded entries.

Every ``run.journal``, ``run.retry``, ``run.suspend`` and ``run.cancel`` clause holds inside a
provider step; ``tests/engine/run/test_orchestrate.py`` is the conformance suite that shows it for
an adapter. A profile may name an adapter only once that suite passes against it: the adapters a
profile can name are the ones in :data:`ORCHESTRATORS` (:func:`orchestrator_for`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from contextful.storage.errors import (
    ExecutionWriterFenced,
    RunCanceled,
    StorageCapabilityMissing,
    TransientError,
)
from contextful.storage.journal import PENDING

if TYPE_CHECKING:
    from contextful.engine.run.execution import StepValue
    from contextful.engine.run.keeper import Keeper
    from contextful.engine.run.owners import Scope
    from contextful.engine.run.retry import RetrySchedule
    from contextful.storage.awakeables import AwakeableStore
    from contextful.storage.clock import Clock
    from contextful.storage.journal import JournalStore, OwnerRow

SUBSTRATE_OPERATIONS = ("open", "step", "cache_cursor", "suspend", "attach_retry", "capabilities", "cancel",
                        "close")
"""What ``run.journal.substrate-port`` names, plus the stop and the close every caller needs."""

HANDLE_OPERATIONS = ("step", "cache_cursor", "discard_recorded", "suspend", "attach_retry", "capabilities",
                     "raise_if_canceled", "close", "close_canceled", "writing")
"""What an opened execution offers its unit (the handle's side of :data:`SUBSTRATE_OPERATIONS`)."""


class ExecutionHandle(Protocol):
    """An opened execution, as a unit inside a provider step uses it."""

    execution_id: str
    scope: str
    attempt: int
    resumed: bool
    cached_cursor: dict[str, Any] | None

    def step(self, label: str, compute: Callable[[], StepValue]) -> StepValue: ...

    def cache_cursor(self, value: dict[str, Any]) -> None: ...

    def discard_recorded(self) -> int: ...

    def suspend(self, label: str, timeout_s: float, *, on_token: Callable[[str], None] | None = None,
                wait_s: float | None = None) -> bytes: ...

    def attach_retry(self, schedule: RetrySchedule) -> None: ...

    def capabilities(self) -> dict[str, bool]: ...

    def raise_if_canceled(self, *, durable: bool = False) -> None: ...

    def close(self, ok: bool) -> None: ...

    def close_canceled(self) -> None: ...

    def writing(self) -> AbstractContextManager[object]:
        """A block whose store commits carry this attempt's fence (``storage.fence``)."""
        ...


class Orchestrator(ABC):
    """The orchestrator role (``run.orchestrate.role``)."""

    name: str

    @abstractmethod
    def open(self, scope: str | Scope, plan_ref: str, *, holder: str | None = None, lease_s: float = 60.0,
             pins: Mapping[str, str] | None = None) -> ExecutionHandle:
        """Open a new execution under ``scope`` pinned to ``plan_ref``, or resume its pending one."""

    @abstractmethod
    def cancel(self, target: str) -> OwnerRow:
        """Mark the execution in flight that ``target`` names (its id or its scope) canceled."""

    @abstractmethod
    def capabilities(self) -> dict[str, bool]:
        """What executions opened here can do."""

    @abstractmethod
    def owner(self, scope: str | Scope) -> OwnerRow | None:
        """The owner row of ``scope`` as it stands (its execution and status); None before any open."""

    def provider_step(self, workflow: ExecutionHandle, scope: str | Scope, plan_ref: str,
                      unit: Callable[[ExecutionHandle], int], *, holder: str | None = None,
                      lease_s: float = 60.0, pins: Mapping[str, str] | None = None) -> int:
        """Run one provider step of ``workflow``: the unit under ``scope`` (one table pull or one
        backfill chunk), which returns the commit pointer it committed (its table's or chunk's
        ``commit_seq``); ``workflow`` records that pointer as its step, and only that.

        The unit runs in an execution of its own under ``scope`` (pinned to ``plan_ref`` and
        ``pins``), so its journal entries stay inside the step. The workflow records the pointer
        first and the unit's execution closes ok after it: a replayed workflow returns the recorded
        pointer without running the unit, and settles the unit's execution if a crash left it
        pending between the two writes. A unit that fails settles by the ordinary failure path: a
        cancel (``RunCanceled``) closes its execution canceled, a transient failure leaves it pending
        for the next attempt to resume from its recorded entries, any other failure closes it failed;
        the error propagates and the workflow records nothing.
        """
        key = scope if isinstance(scope, str) else scope.key
        ran: list[ExecutionHandle] = []

        def run_unit() -> dict[str, Any]:
            execution = self.open(scope, plan_ref, holder=holder, lease_s=lease_s, pins=pins)
            try:
                execution.raise_if_canceled(durable=True)
                with execution.writing():  # the unit's commits carry its attempt (run.journal.current-owner)
                    pointer = unit(execution)
                execution.raise_if_canceled(durable=True)
            except RunCanceled:
                execution.close_canceled()
                raise
            except (TransientError, ExecutionWriterFenced):
                raise  # left pending: the next attempt resumes it (a fenced one's is another attempt's)
            except Exception:  # a crash (a signal, an interpreter exit) writes no status: it resumes
                execution.close(ok=False)
                raise
            ran.append(execution)
            return {"scope": key, "execution": execution.execution_id, "commit_pointer": int(pointer)}

        # Recorded before the unit closes: were it closed first, a crash between the two writes would
        # leave the scope's next open a new execution, and the replay would run the committed unit again.
        recorded = workflow.step(f"provider step {key}", run_unit)
        assert isinstance(recorded, dict)
        if ran and ran[0].execution_id == recorded["execution"]:
            ran[0].close(ok=True)
        else:
            self._settle_recorded(scope, plan_ref, str(recorded["execution"]), holder, lease_s, pins)
        return int(recorded["commit_pointer"])

    def _settle_recorded(self, scope: str | Scope, plan_ref: str, execution_id: str, holder: str | None,
                         lease_s: float, pins: Mapping[str, str] | None) -> None:
        """Close ok the unit execution a replayed step recorded, if a crash left it pending: claimed
        through the ordinary open path (once its lease lapsed), the unit itself not run."""
        owner = self.owner(scope)
        if owner is None or owner.execution_id != execution_id or owner.status != PENDING:
            return  # settled already, or the scope has moved on to another execution: nothing of ours
        settling = self.open(scope, plan_ref, holder=holder, lease_s=lease_s, pins=pins)
        if settling.execution_id == execution_id:
            settling.close(ok=True)
        # Otherwise another writer settled it between the read and the claim, and the open claimed the
        # scope's next execution: left pending, as a dropped handle leaves it, for its own run to resume.


class EngineOrchestrator(Orchestrator):
    """The reference implementation: the engine's executions over one journal store, the awakeable
    store beside it (or ``awakeables``) and the engine keeper (or ``keeper``)."""

    name = "engine"

    def __init__(self, journal: JournalStore, *, awakeables: AwakeableStore | None = None,
                 clock: Clock | None = None, keeper: Keeper | None = None) -> None:
        self.journal = journal
        self.awakeables = awakeables
        self.clock = clock
        self.keeper = keeper

    def open(self, scope: str | Scope, plan_ref: str, *, holder: str | None = None, lease_s: float = 60.0,
             pins: Mapping[str, str] | None = None) -> ExecutionHandle:
        from contextful.engine.run.execution import open_execution

        execution = open_execution(self.journal, scope, plan_ref, holder=holder, lease_s=lease_s, clock=self.clock,
                                   pins=pins, keeper=self.keeper)
        if self.awakeables is not None:
            execution.awakeables = self.awakeables
        return execution

    def cancel(self, target: str) -> OwnerRow:
        from contextful.engine.run.cancel import request_cancel

        return request_cancel(self.journal, target, clock=self.clock)

    def owner(self, scope: str | Scope) -> OwnerRow | None:
        return self.journal.owner(scope if isinstance(scope, str) else scope.key)

    def capabilities(self) -> dict[str, bool]:
        return {**self.journal.capabilities(), "cancel": True, "provider_step": True}


ORCHESTRATORS: dict[str, Callable[..., Orchestrator]] = {"engine": EngineOrchestrator}
"""The adapters a profile can name: each has passed the conformance suite (the module docstring)."""


def orchestrator_for(name: str, journal: JournalStore, **kwargs: Any) -> Orchestrator:
    """The orchestrator adapter ``name`` over ``journal``; a name no conformant adapter answers to is
    ``StorageCapabilityMissing`` before any execution is admitted."""
    factory = ORCHESTRATORS.get(name)
    if factory is None:
        wanted = (f"an orchestrator adapter named {name!r} that passed the conformance suite"
                  f" (known: {', '.join(sorted(ORCHESTRATORS))})")
        raise StorageCapabilityMissing(name, (wanted,))
    return factory(journal, **kwargs)
