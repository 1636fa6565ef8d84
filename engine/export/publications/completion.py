"""What a producer's successful run completed: its run id, pinned input frontier and every output's
frontier (``run.export.group-source``), recorded by :func:`record_completion` where the fire commits
its outcome (``engine.jobs.fire``), before the execution closes.

- A store-driven job (``engine.jobs.store_driven``): its input frontier is the sweep's ``as_of`` and
  each relation its statement reads pinned at that instant (its commit; None: no commit by then);
  its outputs are its ``tables`` at their heads, an output no item wrote to recorded with no commit.
- A build job (``engine.jobs.build``) that materialized a model: its input frontier is each target
  model's watermark (each input's commit the published build read); its outputs are the build id
  each target model publishes now (a model left current keeps its published build).

A fire that published nothing (a build with every model current) materialized nothing and records
nothing; a failed, canceled or pending fire records nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from contextful.engine.export.publications import Completion, OutputFrontier, open_completions

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.jobs.context import JobOutcome
    from contextful.storage.store import Store

PRODUCER_KINDS = ("store-driven", "build")


def record_completion(store: Store, job: JobSpec, run_id: str, outcome: JobOutcome) -> Completion | None:
    """Record the completion of ``job``'s successful run ``run_id`` (None: nothing to record: the
    kind produces no publication member, the fire materialized nothing, or the profile keeps no
    completions)."""
    if job.kind not in PRODUCER_KINDS or not outcome.ok or outcome.pending or outcome.canceled:
        return None
    completions = open_completions(store)
    if completions is None:
        return None
    if job.kind == "store-driven":
        frontier, outputs = _store_driven(store, job, outcome)
    else:
        if not any(m.get("status") == "published" for m in outcome.detail.get("models", ())):
            return None
        frontier, outputs = _build(store, job)
    return completions.record(Completion(job.name, job.kind, run_id, frontier, outputs, store.clock.now_us()))


def _heads(store: Store, names: tuple[str, ...], as_of_us: int | None = None) -> dict[str, int | None]:
    """Each of ``names`` at its head (or at ``as_of_us``), all pinned at one point in one catalog
    statement; None: no commit. Read from the catalog itself, not through the fire's reach: the
    record is the engine's bookkeeping, never a read of rows."""
    pinned = store.catalog.pin_heads(list(names), as_of_us) if names else {}
    return {name: pinned[name].commit_seq if name in pinned else None for name in names}


def _store_driven(store: Store, job: JobSpec, outcome: JobOutcome) -> tuple[dict[str, Any], tuple[OutputFrontier, ...]]:
    from contextful.engine.jobs.pinned import statement_relations
    from contextful.storage.clock import to_us

    as_of_us = to_us(datetime.fromisoformat(outcome.detail["as_of"]))
    relations = tuple(r for r in dict.fromkeys(statement_relations(job)) if r not in job.tables)
    frontier = {"as_of_us": as_of_us, "tables": _heads(store, relations, as_of_us)}
    heads = _heads(store, job.tables)
    return frontier, tuple(OutputFrontier(t, heads[t]) for t in job.tables)


def _build(store: Store, job: JobSpec) -> tuple[dict[str, Any], tuple[OutputFrontier, ...]]:
    from contextful.engine.model.build import published_build

    watermarks: dict[str, Any] = {}
    outputs = []
    for model in job.target:
        published = published_build(store, model)
        watermarks[model] = dict(published[1].meta.get("watermark", {})) if published is not None else {}
        outputs.append(OutputFrontier(model, published[0] if published is not None else None))
    return {"watermarks": watermarks}, tuple(outputs)
