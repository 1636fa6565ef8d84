"""What a store-driven execution pins: the structure its items are read from and land into.

Implements ``surface.fire.executable-pin`` for store-driven jobs: the execution's plan reference is
the SHA-256 (:func:`~contextful.engine.run.execution.plan_reference`) of a plan holding

- the job's structural declaration: its body (or delegate), its ``statement``, its ``as_of``, its
  output membership (``tables``) and what names its isolated items (``isolated_items`` less
  ``max_attempts``) — not its schedule, ``max_in_flight``, retry budget or description,
  which change when and how fast items run, not what an item reads or lands;
- the declaration of every table it reads and writes, from the **applied** version the fire reads
  (never the working file): a pipeline's table by that pipeline's plan reference
  (``engine.run.plan.pipeline_reference``), a model by its definition (the digest of its SQL, its
  contract, its inputs: ``engine.model.build.definition``), an ``[[external]]`` by its id;
- the input relation's shape: each relation the statement reads (DuckDB's own parser,
  ``engine.model.spec.referenced_tables``) with the schema its store head holds now. A relation the
  job also writes is pinned by its declaration only: the job's own commits change its schema.

The input part alone is the *input identity* (:attr:`PinnedPlan.input_identity`), pinned on the
owner beside the body's digests (``RegisteredBody.pins``): the identity a restarted fire resumes
through, and the one an applied snapshot's retirement matches a verified body's owner on
(``engine.run.owners``). Any change of either under a pending execution makes its next fire meet
``OwnerPlanMismatch`` ("pinned-plan-changed") when it opens, before any replay or publication.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.engine.run.execution import plan_reference
from contextful.storage.errors import QueryInvalid

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.store import Store


@dataclass(frozen=True)
class PinnedPlan:
    """A store-driven execution's plan and its input identity."""

    plan: dict[str, Any]
    input_identity: str
    relations: tuple[str, ...]
    """The tables the statement reads, as spelled, in order of appearance."""

    @property
    def reference(self) -> str:
        return plan_reference(self.plan)


def statement_relations(job: JobSpec) -> tuple[str, ...]:
    """The tables the job's statement reads; QueryInvalid when it does not parse."""
    from contextful.engine.model.spec import referenced_tables

    assert job.statement is not None
    found = referenced_tables(job.statement)
    if isinstance(found, str):
        raise QueryInvalid(job.statement, f"[[job]] {job.name!r} statement: {found}")
    return found


def declaration(manifest: Manifest, name: str) -> dict[str, Any] | None:
    """What the applied version declares of table ``name``: the pipeline, model or external producing
    it (None: nothing declares it; the store alone holds it)."""
    from contextful.engine.model.build import definition
    from contextful.engine.model.inputs import produced
    from contextful.engine.run.plan import pipeline_reference

    lowered = name.lower()
    for spec in manifest.pipelines:
        tables = {spec.table.lower()} | {str(t).lower() for t in spec.source.config.get("tables", ())
                                         if spec.source.kind == "derive"}
        child = spec.normalize == "relational" and lowered.startswith(spec.table.lower() + "__")
        if lowered in tables or child:
            return {"pipeline": spec.id, "reference": pipeline_reference(spec)}
    for model in manifest.models:
        if model.name.lower() == lowered:
            return {"model": model.name, "definition": definition(model, produced(manifest))}
    for external in manifest.externals:
        if external.table.lower() == lowered:
            return {"external": external.id}
    return None


def pinned_plan(manifest: Manifest, store: Store, job: JobSpec) -> PinnedPlan:
    """The plan a fire of store-driven ``job`` opens its execution under (see the module docstring)."""
    relations = statement_relations(job)
    outputs = {t.lower() for t in job.tables}
    read: dict[str, Any] = {}
    for name in relations:
        head = store.catalog.load_head(name)
        shape = None if name.lower() in outputs or head is None else head.schema
        read[name] = {"declared": declaration(manifest, name), "schema": shape}
    identity = plan_reference({"statement": job.statement, "as_of": job.as_of, "relations": read})
    plan: dict[str, Any] = {"kind": "store-driven", "job": job.name, "body": job.body, "delegate": job.delegate,
                            "input": identity, "tables": {t: declaration(manifest, t) for t in job.tables}}
    if job.isolated_items is not None:  # what names an item and its entity (its budget is how often it runs)
        items = job.isolated_items
        plan["items"] = {"logical_key": items.logical_key, "entity_key": items.entity_key,
                         "entity_namespace": items.entity_namespace}
    return PinnedPlan(plan, identity, relations)
