"""One fire of one job: ``contextful job fire NAME``, and what serve's job children run.

A fire reads the job from an applied version (the applied one, or ``--version N``: serve passes the
version it armed; never the working ``contextful.toml``), opens an execution under the host scope
``job:<name>`` through the run substrate (``engine.run.execution``), runs the kind's runner from
:data:`RUNNERS` and closes the execution with the runner's outcome. The execution is the fire's
record (docs/jobs.md, "Fire history"):

- step ``fire``: the version, ``--force``, the kind, when it started, and the execution of the
  fire before it (``previous``), so the fires of a job read back as a chain from its owner row;
- step ``outcome``: the :class:`~engine.jobs.context.JobOutcome`, when it ended and its exit code;
- step ``parked``: the same, for a fire that ended with items parked (the execution stays pending;
  the fire that closes it records its ``outcome``);
- the owner row: ``opened_us`` is the fire's start (what serve's next fire is computed from,
  ``surface.arm.next-fire-from-history``), its status ``closed-ok`` or ``closed-failed``.

A runner failing by a catalogue error is a failed fire (recorded, then reported by its error),
except CommitOutcomeUnknown (a write, such as a delegate call's guard, whose outcome was not heard):
nothing is settled over it, the execution stays as it is and the next fire resolves it; a
fire whose process died leaves its execution pending, and the next fire of the job settles it
``closed-failed`` as interrupted before it opens its own, so a failed attempt is recorded whatever
ended it.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.jobs.build import build_opening, run_build
from contextful.engine.jobs.context import JobContext, JobOutcome, Opener, Opening, Runner
from contextful.engine.jobs.fold import run_fold
from contextful.engine.jobs.plan_job import plan_opening, run_plan_job
from contextful.engine.jobs.scope import job_scope
from contextful.engine.jobs.store_driven import run_store_driven, store_driven_opening
from contextful.engine.jobs.sync_push import run_sync_push
from contextful.engine.jobs.synthesize import run_synthesize

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.run.execution import Execution
    from contextful.storage import Store
    from contextful.storage.clock import Clock

RUNNERS: dict[str, Runner] = {"build": run_build, "fold": run_fold, "sync-push": run_sync_push,
                              "store-driven": run_store_driven, "plan": run_plan_job, "synthesize": run_synthesize}
"""Each dispatched kind's runner (``engine.config.jobs.KINDS``)."""
OPENINGS: dict[str, Opener] = {"store-driven": store_driven_opening, "plan": plan_opening, "build": build_opening}
"""The kinds whose execution pins its own structure (:func:`default_opening` otherwise: the declaration)."""

FIRE_STEP = "fire"
OUTCOME_STEP = "outcome"
PARKED_STEP = "parked"
INTERRUPTED = "interrupted: the fire's process ended before it recorded an outcome"


@dataclass(frozen=True)
class Fired:
    """One fire, as ``job fire`` reports it and ``job history`` reads it back."""

    job: str
    version: int
    execution_id: str
    started_us: int
    ended_us: int | None
    status: str
    """``ok``, ``failed``, ``canceled``, ``running`` (its execution still pending), ``pending`` (stopped
    with work left) or ``parked`` (nothing failed; items wait for their retry_at, engine.jobs.isolated)."""
    outcome: JobOutcome | None
    forced: bool = False
    exit_code: int = 0
    """0 when the fire succeeded; else its first failure's exit code (docs/cli.md)."""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "parked")

    def to_json(self) -> dict[str, Any]:
        from contextful.engine.control.fire import rfc3339

        doc: dict[str, Any] = {
            "job": self.job, "identity": f"job:{self.job}", "version": self.version, "execution": self.execution_id,
            "started": rfc3339(self.started_us), "ended": rfc3339(self.ended_us), "status": self.status,
            "duration_s": None if self.ended_us is None else round((self.ended_us - self.started_us) / 1e6, 3),
            "forced": self.forced, "exit_code": self.exit_code,
        }
        outcome = self.outcome.to_json() if self.outcome is not None else {"summary": None, "rows": None,
                                                                            "failures": [], "detail": {}}
        return doc | outcome | {"ok": self.ok}


def applied_job(root: Path, name: str, version: int | None = None) -> tuple[Manifest, int, JobSpec]:
    """The job ``name`` of applied version ``version`` (None: the applied one). Nothing applied yet is
    ``StoreNotInitialized`` (run ``contextful pipeline import``); a job the version lacks ``JobNotFound``;
    a job of a kind no job dispatches (only a version written by hand holds one) ``JobKindUndispatched``."""
    from contextful.engine.control.apply import snapshot_dir
    from contextful.engine.control.arming import load_armable
    from contextful.storage.errors import JobNotFound, StoreNotInitialized

    snapshots = snapshot_dir(root)
    if version is None:
        version = snapshots.applied()
        if version is None:
            raise StoreNotInitialized(snapshots.project, str(snapshots.path))
    manifest, refused = load_armable(root, version, snapshots)
    job = next((j for j in manifest.jobs if j.name == name), None)
    undispatched = next((u.error for u in refused if u.id == f"job:{name}"), None)
    if undispatched is not None:  # a version written by hand: no job dispatches that kind
        raise undispatched
    if job is None:
        raise JobNotFound(name, version, tuple(j.name for j in manifest.jobs))
    return manifest, version, job


def fire_job(root: Path, name: str, *, version: int | None = None, force: bool = False, store_url: str | None = None,
             cancel: threading.Event | None = None, say: Callable[[str], None] | None = None,
             clock: Clock | None = None) -> Fired:
    """Fire the job ``name`` of the applied version (or ``version``) once, in the project's store
    (opened on ``clock``: the instants its execution records)."""
    from contextful.engine.jobs.admission import open_fire_store

    manifest, version, job = applied_job(root, name, version)
    runner = _runner(job)
    store = open_fire_store(job, manifest, store_url, clock=clock)  # its credential admitted once, at start
    try:
        return fire_in(store, manifest, version, job, runner=runner, force=force, cancel=cancel, say=say)
    finally:
        store.close()


def fire_in(store: Store, manifest: Manifest, version: int, job: JobSpec, *, runner: Runner | None = None,
            force: bool = False, cancel: threading.Event | None = None,
            say: Callable[[str], None] | None = None) -> Fired:
    """Fire ``job`` of ``manifest`` (applied version ``version``) in an open ``store``: one execution
    under ``job:<name>`` pinned to the kind's opening, recorded and closed with the runner's outcome
    (left pending when the outcome says so: the next fire resumes it)."""
    from contextful.engine.control.contracts import check_applied
    from contextful.storage.errors import (
        CommitOutcomeUnknown,
        ContextfulError,
        ExecutionWriterFenced,
        RunCanceled,
    )

    runner = runner or _runner(job)
    check_applied(manifest, store, job)  # surface.fire.applied-*: a refusal opens nothing
    context = JobContext(job, manifest, version, store, cancel=cancel or threading.Event(),
                         say=say or (lambda _line: None), force=force)
    opening = OPENINGS.get(job.kind, default_opening)(context)  # a refusal here opens nothing
    execution, previous = _open(store, job, opening)
    clock = store.clock
    started = clock.now_us()
    execution.step(FIRE_STEP, lambda: {"version": version, "force": force, "kind": job.kind, "started_us": started,
                                        "previous": previous})
    code = 0
    try:
        outcome = runner(dataclasses.replace(context, execution=execution))
        if not outcome.ok:
            code = 10 if outcome.canceled else int(outcome.detail.get("exit_code", 1))
    except ExecutionWriterFenced:
        raise  # another attempt holds the execution now: it is that attempt's to settle
    except CommitOutcomeUnknown:
        raise  # not a failure: nothing is settled over an unknown outcome; the next fire resolves it
    except RunCanceled as exc:
        outcome, code = _failed(exc), exc.exit_code
    except ContextfulError as exc:
        outcome, code = _failed(exc), exc.exit_code
    except Exception as exc:  # noqa: BLE001 - the fire fails by name and is recorded; the caller reads it
        outcome, code = _failed(exc), 1
    if outcome.pending and not outcome.canceled:
        if outcome.ok:  # items parked, nothing failed: not a failure
            ended = clock.now_us()
            execution.step(PARKED_STEP, lambda: outcome.to_json() | {"ended_us": ended, "exit_code": 0})
            execution.release()
            return Fired(job.name, version, execution.execution_id, started, ended, "parked", outcome, force, 0)
        execution.release()  # the next fire resumes it; the outcome is that fire's to record
        return Fired(job.name, version, execution.execution_id, started, None, "pending", outcome, force, code or 1)
    if outcome.ok:  # run.export.group-source: a producer's completion, recorded before its execution closes
        from contextful.engine.export.publications.completion import record_completion

        record_completion(store, job, execution.execution_id, outcome)
    ended = clock.now_us()
    execution.step(OUTCOME_STEP, lambda: outcome.to_json() | {"ended_us": ended, "exit_code": code})
    status = "ok" if outcome.ok else ("canceled" if code == 10 else "failed")
    if status == "canceled":
        execution.close_canceled()
    else:
        execution.close(ok=outcome.ok)
    return Fired(job.name, version, execution.execution_id, started, ended, status, outcome, force, code)


def _runner(job: JobSpec) -> Runner:
    from contextful.storage.errors import JobKindUnknown

    runner = RUNNERS.get(job.kind)
    if runner is None:
        raise JobKindUnknown(job.name, job.kind, f"this executable has no runner for kind {job.kind!r} "
                                                 f"(runners: {', '.join(sorted(RUNNERS))})")
    return runner


def _failed(exc: BaseException) -> JobOutcome:
    from contextful.engine.guard import mask_message
    from contextful.storage.errors import ContextfulError

    line = str(exc) if isinstance(exc, ContextfulError) else f"{type(exc).__name__}: {exc}"
    name = exc.name if isinstance(exc, ContextfulError) else type(exc).__name__
    return JobOutcome(False, f"failed: {name}", failures=(mask_message(line),))


def plan_of(job: JobSpec) -> dict[str, Any]:
    """What a job's execution is pinned to: its declaration (not the version: a declaration that
    did not change between versions resumes under either)."""
    return {"job": f"job:{job.name}", "declaration": asdict(job)}


def default_opening(context: JobContext) -> Opening:
    """The opening of a kind that pins its declaration alone and resumes nothing (build, fold, sync-push)."""
    from contextful.engine.run.execution import plan_reference

    return Opening(plan_reference(plan_of(context.job)))


def _open(store: Store, job: JobSpec, opening: Opening) -> tuple[Execution, str | None]:
    """Open the fire's execution under ``opening``. A pending one a stopped or dead fire left is
    resumed when the kind resumes (pinned-plan-changed when its structure changed:
    ``OwnerPlanMismatch``); otherwise it is settled first (recorded ``closed-failed``, interrupted,
    under the plan it was pinned to). A durable callback guard a crashed fire's call left is replayed
    or refused (``engine.jobs.guarded``). The execution and the one before it (None: the first fire)."""
    from contextful.engine.jobs.guarded import open_past_guard
    from contextful.engine.run.execution import open_execution
    from contextful.storage.journal import PENDING

    scope = job_scope(job.name).key
    before = store.journal.owner(scope)
    if before is not None and before.status == PENDING and not opening.resumes:
        dead = open_execution(store.journal, scope, before.plan_ref, pins=before.pin_map() or None,
                              clock=store.clock, take_over_dead=True)
        _settle_interrupted(dead)
    execution = open_past_guard(store, scope, opening.reference, opening.pins)  # a crashed call's guard
    if execution.resumed:
        return execution, _previous(execution)
    return execution, before.execution_id if before is not None else None


def _previous(execution: Execution) -> str | None:
    """The fire before a resumed execution's, as its first fire recorded it."""
    from contextful.engine.run.execution import recorded_value

    for row in execution.journal.steps(execution.execution_id):
        if row.label == FIRE_STEP:
            value = recorded_value(row)
            return value.get("previous") if isinstance(value, dict) else None
    return None


def _settle_interrupted(execution: Execution) -> None:
    """The fire recorded in ``execution`` died before its outcome: record it failed, interrupted."""
    ended = execution.clock.now_us()
    execution.step(FIRE_STEP, lambda: {"version": None, "force": False, "kind": None, "started_us": ended,
                                        "previous": None})
    failed = JobOutcome(False, "failed: interrupted", failures=(INTERRUPTED,))
    execution.step(OUTCOME_STEP, lambda: failed.to_json() | {"ended_us": ended, "exit_code": 1})
    execution.close(ok=False)


def fire_history(store: Store, name: str, limit: int = 20) -> list[Fired]:
    """The job's newest ``limit`` fires, oldest first, read from its executions' records: each
    execution's ``fire`` step names the one before it."""
    from contextful.engine.run.execution import recorded_value
    from contextful.storage.journal import CLOSED_CANCELED, CLOSED_OK, PENDING

    journal = store.journal
    owner = journal.owner(job_scope(name).key)
    fires: list[Fired] = []
    execution_id = owner.execution_id if owner is not None else None
    seen: set[str] = set()
    while execution_id is not None and execution_id not in seen and len(fires) < limit:
        seen.add(execution_id)
        steps = {row.label: recorded_value(row) for row in journal.steps(execution_id)}
        fire, outcome, parked = steps.get(FIRE_STEP), steps.get(OUTCOME_STEP), steps.get(PARKED_STEP)
        if not isinstance(fire, dict):
            break  # a record older than what was collected
        done = outcome if isinstance(outcome, dict) else None
        if (done is None and isinstance(parked, dict) and owner is not None and owner.execution_id == execution_id
                and owner.status == PENDING):
            done, status = parked, "parked"  # its latest fire parked items; the execution waits for them
        elif done is None:
            status = "running"
        elif owner is not None and owner.execution_id == execution_id and owner.status != PENDING:
            status = {CLOSED_OK: "ok", CLOSED_CANCELED: "canceled"}.get(owner.status, "failed")
        else:
            status = "ok" if done.get("ok") else ("canceled" if done.get("exit_code") == 10 else "failed")
        result = None if done is None else JobOutcome(bool(done.get("ok")), str(done.get("summary", "")),
                                                      int(done.get("rows", 0)), tuple(done.get("failures", ())),
                                                      dict(done.get("detail", {})))
        fires.append(Fired(name, fire.get("version") or 0, execution_id, int(fire["started_us"]),
                                 None if done is None else int(done["ended_us"]), status, result,
                                 bool(fire.get("force")), 0 if done is None else int(done.get("exit_code", 0))))
        execution_id = fire.get("previous")
    return list(reversed(fires))
