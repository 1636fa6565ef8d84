"""The plan job kind: a compiled plan file lowered onto one execution under ``job:<name>``.

Implements ``surface.fire.plan-job`` ("a plan block names a compiled plan file beside its
manifest; job fire lowers that plan onto one execution under host scope job:<name>, pinned to the
plan's version"). docs/jobs.md, "Plan jobs".

The plan file is JSON: ``{"reference": "<sha256>", "plan": {"format": "contextful.plan/1", "nodes":
{...}}}``, the compiled plan of a manifest (``engine.run.plan.compile_plan``) as ``contextful
pipeline plan --json`` prints it (the pull listing that command adds under ``pipelines`` is not
read) or :func:`write_plan_file` writes it. Its ``reference`` is the plan's version: the SHA-256 of
its canonical JSON.

A fire reads the file from the directory of the manifest, refuses it with ``JobPlanInvalid`` when it
is missing or unreadable, when its reference is not the hash of its plan (edited after compiling),
or when any node it holds differs from the applied version's compiled node (compiled from
declarations no longer applied: recompile it), then opens, or resumes, ONE execution under the
host scope ``job:<name>`` whose plan reference is the file's reference. Recompiling the file under
a pending execution meets ``OwnerPlanMismatch`` ("pinned-plan-changed") before anything runs.

Lowering, one journal step per stage, so a resumed execution replays the stages it finished: the
plan's pipelines (landing, in dependency order; each pipeline run keeps its own execution under
``pipeline:<id>``, and lands only what is new), then its models (the native publisher, each after
the models it reads, its publication carrying this execution's fence), then its exports.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.jobs.context import JobContext, JobOutcome, Opening
from contextful.engine.run.execution import plan_reference
from contextful.engine.run.plan import PLAN_FORMAT
from contextful.storage.errors import ContextfulError, JobPlanInvalid

if TYPE_CHECKING:
    from collections.abc import Callable

    from contextful.engine.config.manifest import Manifest
    from contextful.engine.run.execution import Execution

PLAN_FILE_PIN = "plan.file"
"""The pin naming the plan file (relative to the manifest) an execution lowers."""


def write_plan_file(manifest: Manifest, path: str | Path) -> str:
    """Write ``manifest``'s compiled plan to ``path`` as a plan job reads it; return its reference."""
    if manifest.plan is None:
        raise JobPlanInvalid("-", str(path), "the manifest has problems, so it compiles to no plan")
    Path(path).write_text(json.dumps(manifest.plan.to_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return manifest.plan.reference


def read_plan_file(ctx: JobContext) -> tuple[str, dict[str, Any]]:
    """The plan file's reference and nodes, checked against itself and the applied version."""
    job, manifest = ctx.job, ctx.manifest
    assert job.plan is not None
    path = manifest.root / job.plan
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobPlanInvalid(job.name, str(path), f"cannot be read as JSON: {exc}") from exc
    plan = doc.get("plan") if isinstance(doc, dict) else None
    reference = doc.get("reference") if isinstance(doc, dict) else None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT or not isinstance(plan.get("nodes"), dict):
        raise JobPlanInvalid(job.name, str(path), f"holds no compiled plan of format {PLAN_FORMAT} under \"plan\"")
    if reference != plan_reference(plan):
        raise JobPlanInvalid(job.name, str(path), f"its reference {str(reference)[:12]} is not the hash of its plan "
                                                  f"({plan_reference(plan)[:12]}): it was edited after compiling")
    applied = manifest.plan.document["nodes"] if manifest.plan is not None else {}
    stale = sorted(node for node, body in plan["nodes"].items() if applied.get(node) != body)
    if stale:
        raise JobPlanInvalid(job.name, str(path), f"node(s) {', '.join(stale)} differ from the applied version "
                                                  f"{ctx.version}: recompile it from the declarations applied")
    return reference, plan["nodes"]


def plan_opening(ctx: JobContext) -> Opening:
    """A plan fire's execution is pinned to its plan file's reference (JobPlanInvalid before anything
    opens for a file missing, edited or compiled from other declarations)."""
    reference, _nodes = read_plan_file(ctx)
    assert ctx.job.plan is not None
    return Opening(reference, {PLAN_FILE_PIN: ctx.job.plan}, resumes=True)


def run_plan_job(ctx: JobContext) -> JobOutcome:
    """Fire plan job ``ctx.job`` once in the execution ``engine.jobs.fire`` opened (see the module docstring)."""
    reference, nodes = read_plan_file(ctx)
    execution = ctx.opened
    stages, stopped = _lower(ctx, execution, nodes)
    failures = tuple(line for stage in stages.values() for line in stage["failures"])
    rows = sum(stage["rows"] for stage in stages.values())
    ran = ", ".join(f"{len(stage['ran'])} {kind}" for kind, stage in stages.items())
    detail = {"execution": execution.execution_id, "attempt": execution.attempt, "resumed": execution.resumed,
              "plan": reference, "stages": stages}
    if stopped:  # pending: the next fire resumes it, replaying the finished stages
        return JobOutcome(False, f"plan {reference[:12]}: stopped after {ran or 'nothing'}; the next fire resumes "
                                 f"execution {execution.execution_id}", rows, failures, detail, pending=True)
    return JobOutcome(not failures, f"plan {reference[:12]}: {ran or 'nothing'}; {len(failures)} failed", rows,
                      failures, detail)


def _named(nodes: dict[str, Any], kind: str) -> list[str]:
    prefix = f"{kind}:"
    return [node[len(prefix):] for node, body in nodes.items() if body.get("kind") == kind]


def _lower(ctx: JobContext, execution: Execution, nodes: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], bool]:
    """Run the plan's stages as journal steps of ``execution``, stopping between stages once the
    fire's cancel event is set; what each stage did, and whether the fire stopped before the last."""
    stages: dict[str, dict[str, Any]] = {}
    planned = [(kind, names) for kind in ("pipeline", "model", "export") if (names := _named(nodes, kind))]
    run = {"pipeline": lambda names: _pipelines(ctx, names), "model": lambda names: _models(ctx, execution, names),
           "export": lambda names: _exports(ctx, names)}
    for kind, names in planned:
        if ctx.cancel.is_set():
            return stages, True
        stages[f"{kind}s"] = _step(execution, f"plan {kind}s", partial(run[kind], names))
    return stages, False


def _step(execution: Execution, label: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    value = execution.step(label, compute)
    assert isinstance(value, dict)
    return value


def _pipelines(ctx: JobContext, ids: list[str]) -> dict[str, Any]:
    from contextful.engine.run.units import run_pipelines

    results = run_pipelines(ctx.store, ctx.manifest, ids, cancel=ctx.cancel)
    return {"ran": [r.pipeline for r in results], "rows": sum(t.rows for r in results for t in r.tables),
            "failures": [f"pipeline {r.pipeline!r}: {f.error}: {f.detail}" for r in results for f in r.failures]}


def _models(ctx: JobContext, execution: Execution, names: list[str]) -> dict[str, Any]:
    from contextful.engine.model.build import build_each

    with execution.writing():  # a publication carries this attempt's fence
        outcomes = build_each(ctx.store, ctx.manifest, names)
    return {"ran": [o.model for o in outcomes if o.status == "published"],
            "rows": sum(o.result.rows for o in outcomes if o.result is not None),
            "failures": [f"model {o.model!r}: {o.status}: " + (f"{o.error.name}: {o.error.detail}" if o.error else
                                                                f"reads {', '.join(o.after)}")
                         for o in outcomes if o.status != "published"]}


def _exports(ctx: JobContext, names: list[str]) -> dict[str, Any]:
    from contextful.engine.export.run import preflight, run_export

    preflight(ctx.manifest)
    ran, failures = [], []
    for spec in ctx.manifest.exports:
        if spec.name not in names:
            continue
        try:
            run_export(ctx.store, ctx.manifest, spec)
        except ContextfulError as exc:
            failures.append(f"export {spec.name!r}: {exc.name}: {exc.detail}")
            continue
        ran.append(spec.name)
    return {"ran": ran, "rows": 0, "failures": failures}
