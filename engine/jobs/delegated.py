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
``dedup_window_secs`` under its identity (None when the binding declares none). The request and its answer are ``engine.control.delegate``'s. docs/jobs.md, "Delegates".
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from contextful.engine.config.delegates import CALL, DelegateBinding
from contextful.engine.control.delegate import Envelope, call, completion, idempotency_key
from contextful.engine.control.worker_key import KEY_VARIABLE, WorkerKey, worker_key, worker_key_problem
from contextful.storage.clock import from_us
from contextful.storage.errors import DelegateSubmitUnfilled, JobDelegateUnbound, ManifestValueInvalid

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

    def __init__(self, ctx: JobContext, body: DelegateBody, execution: Execution, as_of: datetime) -> None:
        self.ctx, self.body, self.execution, self.as_of = ctx, body, execution, as_of
        self._lock = threading.Lock()  # the execution records one journal step at a time
        self.recorded: dict[str, Mapping[str, Any]] = {}
        for label, value in execution.replay_recorded():
            if label.startswith("row/") and isinstance(value, dict) and "rows" in value:
                self.recorded[label[len("row/"):label.rindex("/delegate/")]] = value["rows"]

    def answer(self, key: str, row: Mapping[str, Any], attempt: int) -> Mapping[str, Any]:
        """Item ``key``'s rows: recorded by an earlier attempt, else the delegate's ok answer to
        this attempt's call (journaled before they land); a failed call or an answer other than
        ok raises what closes the attempt."""
        if key in self.recorded:
            return self.recorded[key]
        ctx, binding, execution = self.ctx, self.body.binding, self.execution
        step = f"row/{key}/delegate/{attempt}"
        deadline = from_us(ctx.store.clock.now_us()) + timedelta(seconds=binding.timeout_s)  # the engine's instant
        envelope = Envelope(
            job=ctx.job.name, execution_id=execution.execution_id, step=step,
            idempotency_key=idempotency_key(ctx.job.name, execution.execution_id, key), attempt=attempt,
            entity={"namespace": ctx.job.identity, "key": key, "fence": execution.attempt},
            as_of=_rfc3339(self.as_of), version=ctx.version, pins=json.loads(execution.pins),
            tables=ctx.job.tables, row=row, deadline=_rfc3339(deadline))
        with self._lock:
            execution.step(f"{step}/guard", lambda: guard(execution, envelope, binding, ctx.store.clock.now_us()))
        rows = completion(binding.name, call(binding, self.body.key, envelope))
        with self._lock:
            execution.step(step, lambda: {"rows": dict(rows)})
        return rows


def guard(execution: Execution, envelope: Envelope, binding: DelegateBinding, now_us: int) -> dict[str, Any]:
    """The call request's guard, journaled before the request leaves (``surface.delegate.dedup-window``):
    its identity (execution, attempt, holder, journal entry, the key ``Idempotency-Key`` sends, the
    admission instant) and the whole seconds the delegate deduplicates that key (None: it declares none)."""
    return {"execution": execution.execution_id, "attempt": execution.attempt, "holder": execution.holder,
            "journal_entry": envelope.step, "idempotency_key": envelope.idempotency_key,
            "admitted_at": _rfc3339(from_us(now_us)), "dedup_window_secs": binding.dedup_window_secs}


def _rfc3339(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")
