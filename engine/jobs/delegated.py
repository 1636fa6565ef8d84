"""A store-driven body ``{ delegate = "<name>" }``: each item's attempt is one signed call to the bound delegate.

Implements the fire half of ``surface.delegate.binding`` (a delegate no ``[control.delegates]``
binding names raises ``JobDelegateUnbound``), ``surface.delegate.submit-unfilled`` (a ``submit``
binding raises ``DelegateSubmitUnfilled`` before any execution opens), ``surface.delegate.version``
(the binding's version joins the owner pins as a body dependency, so a changed version meets a
pending execution as pinned-plan-changed), and the record half of ``surface.delegate.call-mode``:
an ok answer is journaled as the execution's step ``row/<key>/delegate/<attempt>`` before its rows
land, so a fire resuming the execution lands the recorded rows and sends that item no second
request; and ``surface.delegate.dedup-window``: each request's guard, journaled as step
``row/<key>/delegate/<attempt>/guard`` before the request leaves, records the binding's
``dedup_window_secs`` under its identity (None when the binding declares none); each call is
admitted to effect dispatch under the execution's admission (:func:`admitted_call`): on the D1
profile a durable callback guard holds the owner row through the call, recording the call's
identity and window (``run.callback-guard.identity``, ``run.journal.d1-guard``), deleted when the
call returns, before its answer is journaled (``run.callback-guard.release``); and, for a job
with ``isolated_items``, ``surface.delegate.defer-parks``: a defer answer is journaled as the
attempt's step (``engine.jobs.isolated.Deferral``) and parks the item, and a later fire reads it back
to admit the item (:meth:`DelegateCalls.admission`). The request and its answer are
``engine.control.delegate``'s. docs/jobs.md, "Delegates".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from contextful.engine.config.delegates import CALL, DelegateBinding
from contextful.engine.control.delegate import Envelope, call, completion, defer_instant, idempotency_key
from contextful.engine.control.worker_key import KEY_VARIABLE, WorkerKey, worker_key, worker_key_problem
from contextful.engine.jobs.isolated import (
    Admission,
    Deferral,
    ItemParked,
    admission,
    item_entity,
)
from contextful.storage.clock import from_us
from contextful.storage.errors import (
    CommitOutcomeUnknown,
    DelegateSubmitUnfilled,
    JobDelegateUnbound,
    ManifestValueInvalid,
)
from contextful.storage.fence import DISPATCH
from contextful.storage.journal import CallbackIdentity

if TYPE_CHECKING:
    from datetime import datetime

    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.jobs.context import JobContext
    from contextful.engine.run.execution import Execution

DELEGATE_PIN = "body_dependency_delegate"
"""The owner pin naming the delegate an execution's items are handed to (the spec's envelope ``pins``)."""
VERSION_PIN = "body_dependency_delegate_version"
"""The owner pin holding the binding's ``version`` (``surface.delegate.version``)."""


@dataclass(frozen=True)
class DelegateBody:
    """A store-driven job's bound delegate, in place of a registered body."""

    job: str
    binding: DelegateBinding
    key: WorkerKey

    def pins(self, input_identity: str | None = None) -> dict[str, str]:
        """What the execution's owner pins: the delegate, its version when bound, the input identity."""
        pins = {DELEGATE_PIN: self.binding.name}
        if self.binding.version is not None:
            pins[VERSION_PIN] = self.binding.version
        if input_identity is not None:
            pins["input"] = input_identity
        return pins


def unbound_delegate(job: JobSpec, manifest: Manifest) -> JobDelegateUnbound | None:
    """``JobDelegateUnbound`` when ``job``'s delegate has no ``[control.delegates]`` binding (None: it has)."""
    assert job.delegate is not None
    return None if manifest.control.delegate(job.delegate) is not None else JobDelegateUnbound(job.name, job.delegate)


def delegate_body(job: JobSpec, manifest: Manifest) -> DelegateBody:
    """The bound delegate ``job``'s items are handed to, refused before any execution opens when
    unbound, bound under ``submit``, or when no worker key signs its calls."""
    unbound = unbound_delegate(job, manifest)
    if unbound is not None:
        raise unbound
    assert job.delegate is not None
    binding = manifest.control.delegate(job.delegate)
    assert binding is not None
    if binding.mode != CALL:
        raise DelegateSubmitUnfilled(job.name, binding.name)
    key = worker_key()
    if key is None:
        raise ManifestValueInvalid(f"[control.delegates.{binding.name}]", KEY_VARIABLE,
                                   f"signs every call: {worker_key_problem(None)}")
    return DelegateBody(job.name, binding, key)


class DelegateCalls:
    """One fire's calls to its delegate: the answers an earlier attempt of the execution recorded,
    and one signed request per new attempt of an item (worker threads call :meth:`answer`)."""

    def __init__(self, ctx: JobContext, body: DelegateBody, execution: Execution, as_of: datetime,
                 budget: int) -> None:
        self.ctx, self.body, self.execution, self.as_of, self.budget = ctx, body, execution, as_of, budget
        self._lock = threading.Lock()  # the execution records one journal step at a time
        self._turns: AbstractContextManager[Any] = (threading.Lock() if execution.journal.hold_excludes_holds
                                                    else nullcontext())
        """Where one admitted call excludes the next (D1's guard), the fire's calls take turns."""
        self.recorded: dict[str, Mapping[str, Any]] = {}
        self.deferred: dict[str, Deferral] = {}
        """Each isolated item's last recorded defer (a later recorded ok answer lands regardless)."""
        for label, value in execution.replay_recorded():
            if not label.startswith("row/") or label.endswith("/guard") or not isinstance(value, dict):
                continue
            key = label[len("row/"):label.rindex("/delegate/")]
            if "rows" in value:
                self.recorded[key] = value["rows"]
            elif (deferral := Deferral.recorded(value)) is not None:
                self.deferred[key] = deferral

    def admission(self, key: str) -> Admission:
        """How this fire admits item ``key`` (``engine.jobs.isolated.admission``), at the engine's instant."""
        return admission(self.deferred.get(key), self.budget, from_us(self.ctx.store.clock.now_us()),
                         answered=key in self.recorded)

    def answer(self, key: str, row: Mapping[str, Any], attempt: int) -> Mapping[str, Any]:
        """Item ``key``'s rows: recorded by an earlier attempt, else the delegate's ok answer to
        this attempt's call (journaled before they land); a failed call or an answer other than
        ok raises what closes the attempt, and an isolated item's defer, journaled, parks it
        (:class:`ItemParked`), spending no attempt of its budget."""
        if key in self.recorded:
            return self.recorded[key]
        ctx, binding, execution = self.ctx, self.body.binding, self.execution
        step = f"row/{key}/delegate/{attempt}"
        namespace, entity_key = item_entity(ctx.job, key, dict(row)) or (ctx.job.identity, key)
        deadline = from_us(ctx.store.clock.now_us()) + timedelta(seconds=binding.timeout_s)  # the engine's instant
        envelope = Envelope(
            job=ctx.job.name, execution_id=execution.execution_id, step=step,
            idempotency_key=idempotency_key(ctx.job.name, execution.execution_id, key), attempt=attempt,
            entity={"namespace": namespace, "key": entity_key, "fence": execution.attempt},
            as_of=_rfc3339(self.as_of), version=ctx.version, pins=json.loads(execution.pins),
            tables=ctx.job.tables, row=row, deadline=_rfc3339(deadline))
        with self._lock:
            execution.step(f"{step}/guard", lambda: guard(execution, envelope, binding, ctx.store.clock.now_us()))
        identity = CallbackIdentity(step, envelope.idempotency_key, binding.dedup_window_secs)
        try:
            with self._turns, admitted_call(execution, binding, identity):  # released when the call returns
                answer = call(binding, self.body.key, envelope)
        except CommitOutcomeUnknown as unknown:  # the guard's acquire went unheard: nothing was sent
            raise AdmissionUnknown(unknown) from unknown
        if answer.outcome == "defer" and ctx.job.isolated_items is not None:
            earlier = self.deferred.get(key)
            self._park(step, Deferral(attempt, defer_instant(binding.name, answer, from_us(ctx.store.clock.now_us())),
                                      1 + (earlier.defers if earlier is not None else 0)))
        rows = completion(binding.name, answer)
        with self._lock:
            execution.step(step, lambda: {"rows": dict(rows)})
        return rows


    def _park(self, step: str, deferral: Deferral) -> NoReturn:
        """Journal ``deferral`` as the attempt's step, then park the item: nothing waits in this fire."""
        with self._lock:
            self.execution.step(step, deferral.step)
        raise ItemParked(deferral)


class AdmissionUnknown(Exception):
    """A call's admission whose outcome is unknown (its guard's acquire answer was lost): not the
    item's failure and not to be retried (a second acquire beside a guard that landed); the fire
    stops, leaving its execution as it is, and the next fire reads the guard by its identity
    (``engine.jobs.guarded``)."""

    def __init__(self, error: CommitOutcomeUnknown) -> None:
        super().__init__(str(error))
        self.error = error


def admitted_call(execution: Execution, binding: DelegateBinding,
                  identity: CallbackIdentity) -> AbstractContextManager[Any]:
    """Admit one call to effect dispatch (``run.journal.durable-dispatch``) for the block, under the
    binding's timeout: ``execution`` must still own its execution (ExecutionWriterFenced, no request
    sent), and the journal holds its owner row through the call. On D1 the hold is a durable
    callback guard recording ``identity`` (``run.callback-guard.identity``): it outlives a crash of
    this process, and the block's end deletes it before the caller journals the answer
    (``run.callback-guard.release``). SQLite's hold is its database's write lock, which would stall
    every other item's journal write for as long as a call takes: there the owner is checked at the
    boundary and nothing is held through the call."""
    if execution.journal.hold_blocks_every_owner_write:
        execution.verify_owner(DISPATCH)
        return nullcontext()
    return execution.admit(DISPATCH, deadline_s=binding.timeout_s, callback=identity)


def guard(execution: Execution, envelope: Envelope, binding: DelegateBinding, now_us: int) -> dict[str, Any]:
    """The call request's guard, journaled before the request leaves (``surface.delegate.dedup-window``):
    its identity (execution, attempt, holder, journal entry, the key ``Idempotency-Key`` sends, the
    admission instant) and the whole seconds the delegate deduplicates that key (None: it declares none)."""
    return {"execution": execution.execution_id, "attempt": execution.attempt, "holder": execution.holder,
            "journal_entry": envelope.step, "idempotency_key": envelope.idempotency_key,
            "admitted_at": _rfc3339(from_us(now_us)), "dedup_window_secs": binding.dedup_window_secs}


def _rfc3339(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")
