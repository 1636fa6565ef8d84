"""Chained derive pipelines: which pipeline a derive pipeline follows, and the manifest's checks.

Implements ``run.select.derive-order``, ``run.select.join-order``, ``run.select.derive-cycle``,
``run.select.derive-after-conflict`` and ``run.select.foreign-output-table`` (decisions
"chained-derive-pipelines", "derivation-key-decides").

A derive pipeline's *parents* are the pipelines producing its source table and, for a host task,
each table it joins (a relational child table ``<root>__<path>`` is produced by its root's
pipeline). It runs after all of them on their run, whatever the declaration order or its own
schedule (``engine.config.manifest.Manifest.in_dependency_order``); among several parents on one
chain it runs after the last. A derive pipeline's ``after`` may name only its parents
(:class:`DeriveAfterConflict`); dependencies returning to a pipeline are a :class:`DeriveCycle`
naming every pipeline on it. Either refuses the manifest, so no pipeline is armed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import (
    ContextfulError,
    DeriveAfterConflict,
    DeriveCycle,
    DeriveForeignOutputTable,
    ManifestValueInvalid,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import PipelineSpec

OUTPUT_KEYS = ("output_table", "marker_table", "pipeline", "pipeline_id")
"""Config keys that would point a derive pipeline's anti-join at some table other than its own."""


def read_tables(spec: PipelineSpec) -> tuple[str, ...]:
    """The tables a derive pipeline reads: its source table, then a host task's joined tables."""
    from contextful.engine.derive.tasks import host_task

    config = spec.source.config
    tables = [config.get("source_table")]
    task = host_task(str(config.get("task", "")))
    if task is not None:
        tables += [join.table for join in task.joins]
    return tuple(t for t in tables if isinstance(t, str) and t)


def producers(pipelines: Sequence[PipelineSpec]) -> dict[str, str]:
    """Table -> the pipeline landing it (a host task's pipeline lands each of its tables)."""
    from contextful.engine.derive.tasks import host_task

    made: dict[str, str] = {}
    for spec in pipelines:
        made.setdefault(spec.table, spec.id)
        if spec.source.kind == "derive":
            task = host_task(str(spec.source.config.get("task", "")))
            for table in task.tables if task is not None else ():
                made.setdefault(table, spec.id)
    return made


def _producer(table: str, made: Mapping[str, str], relational: Mapping[str, str]) -> str | None:
    if table in made:
        return made[table]
    root = table.split("__", 1)[0]
    return relational.get(root) if "__" in table else None


def derive_parents(pipelines: Sequence[PipelineSpec]) -> dict[str, tuple[str, ...]]:
    """Per derive pipeline, the pipelines it follows (in the order it reads their tables)."""
    made = producers(pipelines)
    relational = {p.table: p.id for p in pipelines if p.normalize == "relational"}
    parents: dict[str, tuple[str, ...]] = {}
    for spec in pipelines:
        if spec.source.kind != "derive":
            continue
        found: list[str] = []
        for table in read_tables(spec):
            producer = _producer(table, made, relational)
            if producer is not None and producer not in found:
                found.append(producer)
        parents[spec.id] = tuple(found)
    return parents


def check_chains(pipelines: Sequence[PipelineSpec]) -> list[ContextfulError]:
    """Every chain problem of the manifest's derive pipelines."""
    problems: list[ContextfulError] = []
    parents = derive_parents(pipelines)
    made = producers(pipelines)
    by_id = {p.id: p for p in pipelines}
    for spec in pipelines:
        if spec.source.kind != "derive":
            continue
        problems += _foreign_keys(spec, made, by_id)
        follows = parents[spec.id]
        stray = tuple(a for a in spec.after if a not in follows)
        if stray and follows:
            problems.append(DeriveAfterConflict(spec.id, spec.after, follows[-1]))
    from contextful.engine.config.parse import cycles

    for cycle in cycles({node: [d for d in deps if d in parents] for node, deps in parents.items()}):
        problems.append(DeriveCycle(cycle))
    return problems


def _foreign_keys(spec: PipelineSpec, made: Mapping[str, str], by_id: Mapping[str, Any]) -> list[ContextfulError]:
    """``run.select.foreign-output-table``: the anti-join's table comes from the build alone."""
    found: list[ContextfulError] = []
    where = f"[[pipeline]] {spec.id!r} source.config"
    for key in OUTPUT_KEYS:
        if key not in spec.source.config:
            continue
        value = spec.source.config[key]
        owner = made.get(value) if isinstance(value, str) else None
        if isinstance(value, str) and value in by_id and value != spec.id:
            owner = value
            value = by_id[value].table
        if owner is not None and owner != spec.id:
            found.append(DeriveForeignOutputTable(spec.id, key, str(value), f"pipeline {owner!r}"))
        else:
            found.append(ManifestValueInvalid(where, key, f"the output table is the pipeline's own "
                                                          f"({spec.table!r}, set by `table`): remove {key}"))
    return found

