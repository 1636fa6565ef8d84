"""Compiled plans: the manifest compiled, at validate time, to canonical content-hashed data.

Implements decision "plan-compiled-content": ``run.compile.authoring-surface`` (the manifest is
the authoring surface and :func:`compile_plan` its build-time compiler: every declared unit
becomes a node of one serialized plan whose SHA-256 is its reference; executions pin the
per-pipeline reference, :func:`pipeline_reference`), ``run.compile.inline-step-body`` (a step's
body is a connector reference, :func:`check_step_body`), ``run.compile.control-flow`` (a
conditional or loop written as a key of a pipeline or a step, :func:`control_flow_keys`; the
transform chain's own checks are in ``engine.run.transform``) and ``run.compile.node-id-collision``
(node ids: ``pipeline:<id>``, ``pipeline:<id>/source`` for its step, ``pipeline:<id>/<op id>`` for
each chain operation, ``model:<name>``, ``export:<name>``).

The canonical form (no RFC 8785 dependency; this is the documented form, docs/manifest.md):
JSON with object keys sorted, no whitespace (separators ``,`` and ``:``), UTF-8 with non-ASCII
escaped, arrays in declared order; TOML dates and times as ISO 8601 strings; floats as Python's
shortest round-trip ``repr`` (so ``2.50`` and ``2.5`` are one value) and NaN or infinities refused.
The hash is :func:`contextful.engine.run.execution.plan_reference`, the one hashing scheme
executions pin with.

A pipeline's body (:func:`pipeline_body`) holds exactly the fields its executions pinned before
plans were compiled, plus ``transform`` when a chain is declared: a journal opened before keeps
its reference and resumes.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.engine.run.execution import plan_reference
from contextful.engine.run.transform import CONTROL_FLOW_KEYS, Chain
from contextful.storage.errors import (
    ContextfulError,
    ManifestValueInvalid,
    PipelineInlineStepBody,
    PipelineUndeclaredControlFlow,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import PipelineSpec
    from contextful.engine.export.spec import ExportSpec
    from contextful.engine.model.spec import ModelSpec

PLAN_FORMAT = "contextful.plan/1"
STEP_KEYS = ("kind", "config")
"""A step body's keys: a connector reference is a source kind and its settings."""

Report = Callable[[ContextfulError], None]


@dataclass(frozen=True)
class CompiledPlan:
    """The compiled manifest: ``document`` (plain JSON data) and its SHA-256 ``reference``."""

    document: dict[str, Any]
    reference: str

    def pipeline_reference(self, pipeline_id: str) -> str:
        """The reference executions of pipeline ``pipeline_id`` pin."""
        reference: str = self.document["nodes"][f"pipeline:{pipeline_id}"]["reference"]
        return reference

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "plan": self.document}


def pipeline_body(spec: PipelineSpec) -> dict[str, Any]:
    """What pins a pipeline's executions: everything deciding which rows land where."""
    body: dict[str, Any] = {
        "pipeline": spec.id, "table": spec.table, "source": {"kind": spec.source.kind, "config": spec.source.config},
        "normalize": spec.normalize, "incremental": spec.incremental, "primary_key": list(spec.primary_key),
        "order_by": spec.order_by, "types": spec.types}
    if spec.transform:
        body["transform"] = list(spec.transform)
    if spec.disposition == "replace":  # append and merge follow from primary_key
        body["write_disposition"] = spec.disposition
    return body


def pipeline_reference(spec: PipelineSpec) -> str:
    """The plan reference a run of ``spec`` opens its execution under: its node's in the compiled plan."""
    return plan_reference(_plain(pipeline_body(spec), f"[[pipeline]] {spec.id!r}", _raise))


def _raise(problem: ContextfulError) -> None:
    raise problem


def control_flow_keys(where: str, block: dict[str, Any], report: Report) -> dict[str, Any]:
    """``block`` without its control-flow keys, each reported as ``PipelineUndeclaredControlFlow``."""
    for key in block:
        if key in CONTROL_FLOW_KEYS:
            report(PipelineUndeclaredControlFlow(where, key))
    return {k: v for k, v in block.items() if k not in CONTROL_FLOW_KEYS}


def check_step_body(where: str, block: Any, report: Report) -> dict[str, Any] | None:
    """A step's body (``[pipeline.source]``) if it is a connector reference, else None with each
    problem reported: a body that is no table, or a key beside ``kind`` and ``config``."""
    if not isinstance(block, dict):
        shown = repr(block) if len(repr(block)) <= 60 else repr(block)[:57] + "..."
        report(PipelineInlineStepBody(where, "source", f"the body is {shown}, not a connector reference"))
        return None
    for key in control_flow_keys(where, block, report):
        if key not in STEP_KEYS:
            report(PipelineInlineStepBody(where, key, f"{key!r} is no part of a connector reference"))
    return block


def _plain(value: Any, at: str, report: Report) -> Any:
    """``value`` (parsed TOML) as canonical JSON data."""
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{at}.{k}", report) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{at}[{n}]", report) for n, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        report(ManifestValueInvalid(at, "value", f"{value!r} has no canonical form: declare a finite number"))
        return None
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return value


def _named(blocks: Any, key: str) -> dict[str, dict[str, Any]]:
    return {b[key]: b for b in blocks if isinstance(b, dict) and isinstance(b.get(key), str)} \
        if isinstance(blocks, list) else {}


def _operations(chain: Chain) -> Iterable[dict[str, Any]]:
    for op in chain:
        yield op
        for arm in op.get("arm", []):
            yield from _operations(arm["chain"])
        yield from _operations(op.get("otherwise", []))


def compile_plan(pipelines: Iterable[PipelineSpec], models: Iterable[ModelSpec], exports: Iterable[ExportSpec],
                 doc: dict[str, Any], report: Report) -> CompiledPlan:
    """The plan of a manifest whose declarations validated (``doc`` is its parsed TOML)."""
    raw_pipelines, raw_models, raw_exports = (_named(doc.get("pipeline"), "id"), _named(doc.get("model"), "name"),
                                              _named(doc.get("export"), "name"))
    nodes: dict[str, dict[str, Any]] = {}
    for spec in pipelines:
        where = f"[[pipeline]] {spec.id!r}"
        body = _plain(pipeline_body(spec), where, report)
        nodes[f"pipeline:{spec.id}"] = {
            "kind": "pipeline", "body": body, "reference": plan_reference(body), "schedule": spec.schedule,
            "after": list(spec.after), "priority": spec.priority,
            "seed": _plain(raw_pipelines.get(spec.id, {}).get("seed"), f"{where} seed", report)}
        nodes[f"pipeline:{spec.id}/source"] = {"kind": "step", "pipeline": spec.id, "connector": spec.source.kind}
        for op in _operations(list(spec.transform)):
            nodes[f"pipeline:{spec.id}/{op['id']}"] = {"kind": "operation", "pipeline": spec.id, "op": op["op"]}
    for model in models:
        nodes[f"model:{model.name}"] = {"kind": "model", "sql": model.sql, "declared": _plain(
            raw_models.get(model.name, {}), f"[[model]] {model.name!r}", report)}
    for export in exports:
        nodes[f"export:{export.name}"] = {"kind": "export", "declared": _plain(
            raw_exports.get(export.name, {}), f"[[export]] {export.name!r}", report)}
    document = {"format": PLAN_FORMAT, "nodes": nodes}
    return CompiledPlan(document, plan_reference(document))
