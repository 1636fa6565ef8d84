"""Reading ``contextful.toml``: TOML -> validated :class:`Manifest`, every problem reported at once.

Each problem is an instance of its catalogue error (``ManifestKeyUnknown`` naming the key and the
block, ``PipelineNormalizeModeUnknown`` printing both spellings, …); :func:`parse_manifest`
collects them all and raises one ``ManifestInvalid`` carrying the list, so ``contextful pipeline
validate`` can print each by name.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from contextful.engine.config.applied import AppliedSnapshot
from contextful.engine.config.control import parse_control
from contextful.engine.config.manifest import (
    NORMALIZE_MODES,
    SOURCE_KINDS,
    ExternalSpec,
    Manifest,
    PipelineSpec,
    SourceSpec,
)
from contextful.engine.config.residency import parse_residency
from contextful.engine.config.sync import parse_sync
from contextful.engine.export.spec import ExportSpec
from contextful.engine.model.spec import ModelSpec
from contextful.engine.project import MANIFEST, locate_project, parse_project, read_manifest_document
from contextful.storage.errors import (
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    ModelCycle,
    PipelineAfterCycle,
    PipelineAfterUnknown,
    PipelineIdDuplicate,
    PipelineNormalizeModeUnknown,
    PipelinePrimaryKeyInvalid,
    PipelineSourceKindUnknown,
    TableNameCollision,
)

TOP_KEYS = ("project", "pipeline", "model", "export", "control", "external", "job", "residency", "sync",
            "publication")
PIPELINE_KEYS = ("id", "source", "table", "normalize", "incremental", "primary_key", "order_by", "types",
                 "write_disposition", "schedule", "after", "priority", "seed", "transform")
EXTERNAL_KEYS = ("id", "table", "description")
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")


def string_list(value: Any) -> tuple[str, ...] | None:
    """A key's value as non-empty strings: one string, or a list of them (None: neither)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return None
    return tuple(value)


class _Problems:
    def __init__(self) -> None:
        self.found: list[ContextfulError] = []

    def add(self, problem: ContextfulError) -> None:
        self.found.append(problem)

    def open_block(self, kind: str, n: int, block: Any, name_key: str, known: tuple[str, ...],
                   pattern: re.Pattern[str], spelled: str) -> tuple[str, str | None] | None:
        """Start the ``n``-th ``[[kind]]`` block: it must be a table; ``name_key`` names it (checked
        against ``pattern``, described as ``spelled``); its unknown keys are refused.

        Answers ``(where, name)`` — ``where`` names the block in later messages — or None when the
        block is not a table at all.
        """
        where = f"[[{kind}]] #{n}"
        if not isinstance(block, dict):
            self.add(ManifestValueInvalid(where, kind, "must be a table"))
            return None
        name = self.string(where, block, name_key, required=True)
        if name is not None:
            where = f"[[{kind}]] {name!r}"
            if not pattern.fullmatch(name):
                self.add(ManifestValueInvalid(where, name_key, f"{name!r} is not {spelled}"))
        self.unknown_keys(where, block, known)
        return where, name

    def unknown_keys(self, block: str, table: dict[str, Any], known: tuple[str, ...]) -> None:
        for key in table:
            if key not in known:
                self.add(ManifestKeyUnknown(block, key, known))

    def string(self, block: str, table: dict[str, Any], key: str, default: str | None = None,
               required: bool = False) -> str | None:
        value = table.get(key, default)
        if value is None:
            if required:
                self.add(ManifestValueInvalid(block, key, "is required"))
            return None
        if not isinstance(value, str) or not value.strip():
            self.add(ManifestValueInvalid(block, key, f"must be a non-empty string, not {value!r}"))
            return default
        return value

    def strings(self, block: str, table: dict[str, Any], key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        strings = string_list(value)
        if strings is None:
            self.add(ManifestValueInvalid(block, key, f"must be a string or a list of strings, not {value!r}"))
            return ()
        return strings


def load_manifest(directory: str | os.PathLike[str] = ".") -> Manifest:
    """The manifest of the project at or above ``directory``."""
    root = locate_project(directory)
    return parse_manifest(read_manifest_document(root), root, str(root / MANIFEST))


def parse_manifest(doc: dict[str, Any], root: Path, path: str = MANIFEST, *,
                   applied: AppliedSnapshot | None = None) -> Manifest:
    """The manifest ``doc`` declares for the project at ``root``; ``ManifestInvalid`` (naming ``path``)
    lists every problem found in it. ``applied``: the metadata of the applied version ``doc`` was
    read from (``engine.config.applied``)."""
    manifest, problems = read_declarations(doc, root, applied=applied)
    if problems:
        raise ManifestInvalid(path, problems)
    return manifest


def read_declarations(doc: dict[str, Any], root: Path, *,
                      applied: AppliedSnapshot | None = None) -> tuple[Manifest, list[ContextfulError]]:
    """What ``doc`` declares, block by block, and every problem found in it. With problems the
    manifest holds the blocks that parsed and no plan: enough for later checks to find their own
    problems (``engine.config.validate``), never enough to run."""
    problems = _Problems()
    problems.unknown_keys("the manifest", doc, TOP_KEYS)
    project, project_problems = parse_project(doc.get("project", {}), root)
    for problem in project_problems:
        problems.add(problem)
    from contextful.engine.registrations import failures, import_project_modules

    import_project_modules(root, project.modules)  # before the pipelines: their tasks are registered by now
    blocks = doc.get("pipeline", [])
    if not isinstance(blocks, list):
        problems.add(ManifestValueInvalid("the manifest", "pipeline", "declare pipelines as [[pipeline]] blocks"))
        blocks = []
    pipelines = [p for n, block in enumerate(blocks, 1) if (p := _pipeline(block, n, problems)) is not None]
    for failure in failures():  # after the pipelines: a task lookup may have loaded the entry points
        problems.add(failure)
    _check_ids_and_order(pipelines, problems)
    pipelines = _derive_chains(pipelines, problems)
    models = _models(doc.get("model", []), root, pipelines, problems, applied.models if applied else {})
    externals = _externals(doc.get("external", []), pipelines, models, problems)
    _check_table_names(pipelines, models, externals, problems)
    exports = _exports(doc.get("export", []), root, problems)
    control, found = parse_control(doc.get("control", {}), root, project.name)
    sync, sync_problems = parse_sync(doc.get("sync"))
    for problem in found + sync_problems:
        problems.add(problem)
    residency, found = parse_residency(doc.get("residency", {}))
    for problem in found:
        problems.add(problem)
    from contextful.engine.config.jobs import job_problems, parse_jobs

    jobs, found = parse_jobs(doc.get("job", []))
    for problem in found:
        problems.add(problem)
    from contextful.engine.config.publications import parse_publications, publication_problems

    publications, found = parse_publications(doc.get("publication", []))
    for problem in found:
        problems.add(problem)
    plan = None
    if not problems.found:  # the build-time compiler: every declaration validated becomes a plan node
        from contextful.engine.run.plan import compile_plan

        plan = compile_plan(pipelines, models, exports, doc, problems.add)
    manifest = Manifest(root, project, tuple(pipelines), tuple(models), tuple(exports), plan=plan, control=control,
                        externals=tuple(externals), jobs=tuple(jobs), applied=applied, residency=residency,
                        sync=sync, publications=tuple(publications))
    for problem in job_problems(manifest, jobs) + publication_problems(manifest, publications):
        problems.add(problem)
    if problems.found:
        manifest = dataclasses.replace(manifest, plan=None)  # a manifest with problems never runs
    return manifest, problems.found


def _externals(blocks: Any, pipelines: list[PipelineSpec], models: list[ModelSpec],
               problems: _Problems) -> list[ExternalSpec]:
    """The [[external]] blocks (``surface.apply.external-snapshot``): ids unique and apart from the
    pipelines', each table produced by nothing in the manifest and written by one external alone."""
    if not isinstance(blocks, list):
        problems.add(ManifestValueInvalid("the manifest", "external", "declare external tables as [[external]] blocks"))
        return []
    externals: list[ExternalSpec] = []
    for n, block in enumerate(blocks, 1):
        opened = problems.open_block("external", n, block, "id", EXTERNAL_KEYS, _ID,
                                     "an id (a letter, then letters, digits or '_')")
        if opened is None:
            continue
        where, external_id = opened
        table = problems.string(where, block, "table", external_id) or (external_id or "")
        _check_table_syntax(where, table, problems)
        description = problems.string(where, block, "description")
        if external_id is not None:
            externals.append(ExternalSpec(external_id, table, description))
    ids = {p.id: f"pipeline {p.id!r}" for p in pipelines}
    writers = {p.table: f"pipeline {p.id!r}" for p in pipelines} | {m.name: f"model {m.name!r}" for m in models}
    for spec in externals:
        where = f"[[external]] {spec.id!r}"
        if spec.id in ids:
            problems.add(ManifestValueInvalid(where, "id", f"is already the id of {ids[spec.id]}"))
        ids.setdefault(spec.id, f"external {spec.id!r}")
        if spec.table in writers:
            problems.add(TableNameCollision(spec.table, writers[spec.table], f"external {spec.id!r}",
                                            "a table written from outside Contextful has no other writer"))
        writers.setdefault(spec.table, f"external {spec.id!r}")
    return externals


def _check_table_syntax(where: str, table: str, problems: _Problems) -> None:
    if table and not _ID.fullmatch(table):
        problems.add(ManifestValueInvalid(where, "table", f"{table!r} is not a table name (a letter, then letters, "
                                                          "digits or '_')"))


def _exports(blocks: Any, root: Path, problems: _Problems) -> list[ExportSpec]:
    """The [[export]] blocks: names unique, then the audience preflight (engine.export.preflight)."""
    from contextful.engine.export.preflight import shared_namespaces, template_problems
    from contextful.engine.export.spec import parse_export

    if not isinstance(blocks, list):
        problems.add(ManifestValueInvalid("the manifest", "export", "declare exports as [[export]] blocks"))
        return []
    exports = [e for n, block in enumerate(blocks, 1) if (e := parse_export(block, n, root, problems)) is not None]
    seen: set[str] = set()
    for spec in exports:
        if spec.name in seen:
            problems.add(ManifestValueInvalid(f"[[export]] {spec.name!r}", "name", "is already another export's name"))
        seen.add(spec.name)
    for problem in [*shared_namespaces(exports), *template_problems(exports)]:
        problems.add(problem)
    return exports


def _models(blocks: Any, root: Path, pipelines: list[PipelineSpec], problems: _Problems,
            inlined: Mapping[str, str]) -> list[ModelSpec]:
    """The [[model]] blocks: names unique and apart from pipeline tables, no cycle among models."""
    from contextful.engine.model.spec import parse_model

    if not isinstance(blocks, list):
        problems.add(ManifestValueInvalid("the manifest", "model", "declare models as [[model]] blocks"))
        return []
    models = [m for n, block in enumerate(blocks, 1) if (m := parse_model(block, n, root, problems, inlined)) is not None]
    tables = {p.table for p in pipelines}  # names differing only in case: _check_table_names
    seen: set[str] = set()
    for model in models:
        if model.name in tables or model.name in seen:
            problems.add(ManifestValueInvalid(f"[[model]] {model.name!r}", "name",
                                              "is already a pipeline's table or another model"))
        seen.add(model.name)
    graph = {m.name: [i for i in m.input_names(seen) if i in seen] for m in models}
    for cycle in cycles(graph):
        problems.add(ModelCycle(cycle))
    return models


def _pipeline(block: Any, n: int, problems: _Problems) -> PipelineSpec | None:
    from contextful.engine.run.plan import control_flow_keys
    from contextful.engine.run.transform import compile_chain

    if isinstance(block, dict):
        named = f"[[pipeline]] {block['id']!r}" if isinstance(block.get("id"), str) else f"[[pipeline]] #{n}"
        block = control_flow_keys(named, block, problems.add)
    opened = problems.open_block("pipeline", n, block, "id", PIPELINE_KEYS, _ID,
                                 "an id (a letter, then letters, digits or '_')")
    if opened is None:
        return None
    where, pipeline_id = opened
    transform = compile_chain(block.get("transform", []), where, problems.add)
    incremental = problems.string(where, block, "incremental")
    table = problems.string(where, block, "table", pipeline_id) or (pipeline_id or "")
    source = _source(block.get("source"), where, pipeline_id or f"#{n}", table, incremental, problems)
    _check_table_syntax(where, table, problems)
    normalize = problems.string(where, block, "normalize", "nested") or "nested"
    if normalize not in NORMALIZE_MODES:
        problems.add(PipelineNormalizeModeUnknown(pipeline_id or f"#{n}", normalize, NORMALIZE_MODES))
    from contextful.engine.land.typed import types_problems

    types = block.get("types", {})
    for problem in (found := types_problems(where, types, pipeline_id or f"#{n}")):
        problems.add(problem)
    if any(isinstance(problem, ManifestValueInvalid) for problem in found):  # not a map of spellings
        types = {}
    # read by the control plane's grammar at arm time (engine.control.schedule): an unreadable
    # schedule holds back that pipeline alone (surface.arm.unreadable-schedule), so it never fails
    # the document; `pipeline validate` reports it (engine.control.arm.schedule_problems)
    schedule = problems.string(where, block, "schedule")
    priority = block.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        problems.add(ManifestValueInvalid(where, "priority", f"must be an integer, not {priority!r}"))
        priority = 0
    primary_key = problems.strings(where, block, "primary_key")
    if source is not None and source.kind == "http":
        from contextful.engine.land.http import check_rereads

        for problem in check_rereads(where, incremental, primary_key):
            problems.add(problem)
    for problem in _primary_key_problems(pipeline_id or f"#{n}", primary_key, normalize, types):
        problems.add(problem)
    order_by = problems.string(where, block, "order_by")
    from contextful.engine.land.disposition import check_disposition

    disposition, found = check_disposition(where, block.get("write_disposition"), primary_key,
                                           source.kind if source is not None else None, "seed" in block)
    for problem in found:
        problems.add(problem)
    seed = None
    if "seed" in block:
        from contextful.engine.land.seed import check_declaration, parse_seed

        seed, found = parse_seed(f"{where} seed", block["seed"])
        found += check_declaration(pipeline_id or f"#{n}", primary_key, order_by)
        for problem in found:
            problems.add(problem)
    if pipeline_id is None or source is None:
        return None
    return PipelineSpec(
        id=pipeline_id, source=source, table=table, normalize=normalize, incremental=incremental,
        primary_key=primary_key, order_by=order_by, write_disposition=disposition, types=dict(types),
        schedule=schedule,
        after=problems.strings(where, block, "after"), priority=priority, seed=seed, transform=tuple(transform),
    )


def _primary_key_problems(pipeline_id: str, primary_key: tuple[str, ...], normalize: str,
                          types: dict[str, Any]) -> list[ContextfulError]:
    """Key columns the manifest shows its table can never have (a key naming a missing column lands
    nothing: ``PrimaryKeyColumnMissing`` at the first landing, docs/store.md)."""
    found: list[ContextfulError] = [PipelinePrimaryKeyInvalid(pipeline_id, column, "is named twice")
                                    for index, column in enumerate(primary_key) if column in primary_key[:index]]
    if normalize != "relational" or not primary_key:
        return found
    import pyarrow as pa
    from contextful.engine.land.typed import parse_type
    from contextful.engine.normalize.relational import RESERVED_PREFIX

    for column in primary_key:
        if column.startswith(RESERVED_PREFIX):
            found.append(PipelinePrimaryKeyInvalid(
                pipeline_id, column, f"starts with {RESERVED_PREFIX!r}: under normalize = \"relational\" those columns "
                                     f"are Contextful's (ids derive from the key)"))
        elif isinstance(types.get(column), str):
            try:
                declared = parse_type(types[column], column)
            except ContextfulError:
                continue  # reported with the types
            if pa.types.is_nested(declared):
                found.append(PipelinePrimaryKeyInvalid(
                    pipeline_id, column, f"is declared {types[column]!r}: under normalize = \"relational\" a list "
                                         f"lands in a child table and a struct as <column>__<field> columns, so the "
                                         f"root table has no column {column!r}"))
    return found


def _check_table_names(pipelines: list[PipelineSpec], models: list[ModelSpec], externals: list[ExternalSpec],
                       problems: _Problems) -> None:
    """Refuse a table that a relational pipeline's child table could land in (every name
    ``<root>__...`` belongs to the relational root ``root``, docs/normalization.md) and two tables
    whose names differ only in case (their views would be one name in DuckDB)."""
    tables = ([(p.table, f"pipeline {p.id!r}") for p in pipelines] + [(m.name, f"model {m.name!r}") for m in models]
              + [(e.table, f"external {e.id!r}") for e in externals])
    roots = [(p.table, f"pipeline {p.id!r}") for p in pipelines if p.normalize == "relational"]
    for root, owner in roots:
        for table, other in tables:
            if table.lower().startswith(root.lower() + "__"):
                problems.add(TableNameCollision(table, owner, other, f"relational child tables of {root!r} are "
                                                                     f"named {root}__<path>"))
    seen: dict[str, tuple[str, str]] = {}
    for table, owner in tables:
        first = seen.setdefault(table.lower(), (table, owner))
        if first[0] != table:
            problems.add(TableNameCollision(table, f"table {first[0]!r} of {first[1]}", owner,
                                            "table names that differ only in case read as one view"))


def _source(block: Any, where: str, pipeline_id: str, table: str, incremental: str | None,
            problems: _Problems) -> SourceSpec | None:
    if block is None:
        problems.add(ManifestValueInvalid(where, "source", "is required ([pipeline.source] with a kind)"))
        return None
    from contextful.engine.run.plan import check_step_body

    block = check_step_body(f"{where} source", block, problems.add)
    if block is None:
        return None
    kind = problems.string(f"{where} source", block, "kind", required=True)
    if kind is not None and kind not in SOURCE_KINDS:
        problems.add(PipelineSourceKindUnknown(pipeline_id, kind, SOURCE_KINDS))
    config = block.get("config", {})
    if not isinstance(config, dict):
        problems.add(ManifestValueInvalid(f"{where} source", "config", "must be a table"))
        config = {}
    found: list[ContextfulError] = []
    if kind == "files":
        from contextful.engine.land import files

        found = files.check_config(f"{where} source.config", config)
    elif kind == "http":
        from contextful.engine.land import http

        found = http.check_config(f"{where} source.config", config, incremental)
    elif kind == "receive":
        from contextful.engine.land.receive import config as receive

        found = receive.check_config(f"{where} source.config", config)
    elif kind == "derive":
        from contextful.engine.derive.config import check_config

        found = check_config(f"{where} source.config", pipeline_id, table, config)
    for problem in found:
        problems.add(problem)
    return SourceSpec(kind, config) if kind else None


def _derive_chains(pipelines: list[PipelineSpec], problems: _Problems) -> list[PipelineSpec]:
    """Each derive pipeline with the pipelines it follows (``engine.derive.chain``), after the
    manifest's chain checks."""
    if not any(p.source.kind == "derive" for p in pipelines):
        return pipelines
    from dataclasses import replace

    from contextful.engine.derive.chain import check_chains, derive_parents

    for problem in check_chains(pipelines):
        problems.add(problem)
    parents = derive_parents(pipelines)
    return [replace(p, derive_parents=parents[p.id]) if p.id in parents else p for p in pipelines]


def _check_ids_and_order(pipelines: list[PipelineSpec], problems: _Problems) -> None:
    seen: dict[str, int] = {}
    for n, spec in enumerate(pipelines, 1):
        if spec.id in seen:
            problems.add(PipelineIdDuplicate(spec.id, seen[spec.id], n))
        seen.setdefault(spec.id, n)
    graph = {p.id: p.after for p in pipelines}
    for spec in pipelines:
        for dep in spec.after:
            if dep not in graph:
                problems.add(PipelineAfterUnknown(spec.id, dep))
    for cycle in cycles(graph):
        problems.add(PipelineAfterCycle(cycle))


def cycles(graph: Mapping[str, Sequence[str]]) -> list[tuple[str, ...]]:
    """Each cycle a depth-first walk of ``graph`` (node -> what it waits on) meets, as the path
    around it; edges to nodes outside the graph are ignored (reported elsewhere)."""
    state: dict[str, int] = {}
    found: list[tuple[str, ...]] = []

    def visit(node: str, path: tuple[str, ...]) -> None:
        if state.get(node) == 2 or node not in graph:
            return
        if state.get(node) == 1:
            found.append(path[path.index(node):] + (node,))
            return
        state[node] = 1
        for dep in graph[node]:
            visit(dep, path + (node,))
        state[node] = 2

    for node in sorted(graph):
        visit(node, ())
    return found
