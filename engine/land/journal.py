"""A pipeline run's execution: opened on the pipeline's scope and plan, journaling each pull.

Implements, for landing, ``run.own.checkpoint-resume`` (decision "host-registered-derive"): a run
opens or resumes the execution keyed on ``pipeline:<id>`` and its node's reference in the compiled
plan (``engine.run.plan.pipeline_reference``), journals each pull (its request, position and rows), and at each
checkpoint caches the committed position and its marker (the checkpoint's run id and commit) on the
pending owner and collects the journal's recorded pulls. A resumption — the run that follows a
crash, taking over the dead holder's lease — discards the pulls recorded after the checkpoint and
pulls afresh from the committed position: rows land only through commits, so nothing replays
a page's rows from the journal.

A run that ends, well or failing by name, closes its execution; one killed leaves it pending. A
derive run (``replay``: its journaled answers are read back) failing transiently leaves it pending
too, its lease ended (:meth:`~engine.run.execution.Execution.release`), so the next run resumes it
at once and replays what its engines answered.
The engine keeper (``engine.run.keeper``) renews the execution's lease while the run lasts.

Cancel (``run.cancel.abandoned-work``, decision "unclosed-execution-recovers"): after each pull
the run checks the execution's cancellation token (no I/O), and before each commit it reads the
owner's cancel mark, so a run marked canceled never publishes: it raises :class:`RunCanceled`
through the ordinary failure path (its staged rows dropped, its run records closed canceled, its
position left at its last commit) and :meth:`PullJournal.settle` closes the owner
``closed-canceled``.

Fencing (``run.journal.current-owner``, decision "run-substrate-storage"): the run lands inside
:meth:`PullJournal.writing`, so every commit it makes (checkpoints, the final commit, each table of
a relational landing) carries its attempt, and every pull it journals and cursor it caches is
conditional on that attempt too. An attempt whose lease another holder took over (a stalled
process, a partitioned host) commits nothing, caches nothing and records nothing: each of those
refuses with :class:`ExecutionWriterFenced`, and the run stops without settling the execution,
which is the new attempt's.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any

from contextful.engine.config.manifest import PipelineSpec
from contextful.engine.run.execution import Execution, open_execution
from contextful.engine.run.owners import Scope
from contextful.engine.run.plan import pipeline_reference
from contextful.storage import Store
from contextful.storage.errors import (
    ContextfulError,
    ExecutionHeld,
    ExecutionWriterFenced,
    RunCanceled,
    TransientError,
)
from contextful.storage.fence import WriterFence
from contextful.storage.transaction import CommitResult

log = logging.getLogger(__name__)

LEASE_S = 300.0
"""The owner lease the engine keeper renews every half lease; a crashed holder on this host is taken
over at once."""


class PullJournal:
    """The journal side of one run: one step per pull, a cached cursor per checkpoint."""

    def __init__(self, execution: Execution, replay: bool = False) -> None:
        self.execution = execution
        self.replay = replay
        """Whether the run reads back what its execution recorded (a derive run's answers)."""
        self.pulls = 0

    @classmethod
    def open(cls, store: Store, spec: PipelineSpec, scope: str, *, replay: bool = False) -> PullJournal:
        """Open or resume the run's execution. A resumed landing discards the pulls recorded after
        its checkpoint (rows land only through commits); ``replay`` keeps them for the run to read
        back (a derive run's unit answers, ``engine.derive.run``)."""
        try:
            execution = open_execution(store.journal, Scope.table(scope), pipeline_reference(spec),
                                       lease_s=LEASE_S, take_over_dead=True)
        except ExecutionHeld as exc:  # another process runs this pipeline now: say which, and whose
            raise exc.of_pipeline(spec.id) from None
        if execution.resumed and not replay:
            execution.discard_recorded()  # pulls after the last checkpoint never committed: pull afresh
        return cls(execution, replay)

    @property
    def execution_id(self) -> str:
        return self.execution.execution_id

    def pulled(self, label: str, record: dict[str, Any]) -> None:
        """Journal one pull, then stop here if the run was canceled (a pull boundary)."""
        self.pulls += 1
        self.execution.step(label, lambda: record)
        self.execution.raise_if_canceled()

    def before_commit(self) -> None:
        """A commit boundary: read the cancel mark, so a canceled run publishes nothing. (Whether
        this attempt still owns the execution is checked by the commit itself: ``writing``.)"""
        self.execution.raise_if_canceled(durable=True)

    def writing(self) -> AbstractContextManager[WriterFence | None]:
        """The block the run lands in: each of its commits carries this attempt's fence, checked
        in the catalog's commit transaction (``storage.fence``)."""
        return self.execution.writing()

    def checkpoint(self, position: Any, result: CommitResult) -> None:
        self.execution.cache_cursor({"position": position, "run_id": result.run_id,
                                     "commit_seq": result.commit_seq})
        self.execution.collect_steps()

    def close(self, ok: bool) -> None:
        if not self.execution.closed:
            self.execution.close(ok)

    def settle(self, exc: BaseException) -> None:
        """Settle after the run failed by name: ``closed-canceled`` for the Canceled tag; a transient
        failure of a run that replays its journal (a derive run: its engines' answers) leaves the
        execution pending, as a kill does, with its lease ended so the next run resumes it at once
        and asks no engine again for what it answered; any other failure closes it failed.

        A landing journals nothing a resumption reads back (it pulls afresh from the position its
        table committed), so its transient failures close the execution as any other failure."""
        if self.execution.closed:
            return
        if isinstance(exc, ExecutionWriterFenced) or self.execution.fenced is not None:
            return  # another attempt owns the execution now: it is that attempt's to settle
        if isinstance(exc, RunCanceled):
            self.execution.close_canceled()
        elif self.replay and isinstance(exc, TransientError):
            try:
                self.execution.release()
            except ContextfulError as lost:  # the catalog is still away: the lease lapses instead
                log.warning("execution %s stays pending; its lease lapses in %s s: %s", self.execution_id,
                            LEASE_S, lost)
        else:
            self.execution.close(ok=False)
