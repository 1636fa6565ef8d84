"""The tables a model reads that nothing produces: ``pipeline validate`` names them before a build fails.

A model's inputs (declared ``inputs``, else the base tables its SQL references, plus its
``relationships`` targets) must each be a table something produces: a pipeline's table, a child table
``<root>__<path>`` of a relational pipeline's root, another model, an ``[[external]]`` table — or a table the store already holds
(one landed by ``contextful table load``, say). Validation reads the manifest first; only for names it
cannot account for does it look at the project's store, and only when that store exists (reading
never creates one). A name neither accounts for is ``ModelInputUnknown``, naming the model, the
table(s) and what is known.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from contextful.engine.model.spec import resolve_table
from contextful.storage.errors import ModelInputUnknown

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.model.spec import ModelSpec


def produced(manifest: Manifest) -> set[str]:
    """The tables the manifest's pipelines and models produce and its ``[[external]]`` blocks declare
    written from outside (relational child tables aside); a host task's pipeline produces its marker
    table and every content table it declares (``tables``)."""
    derived = {t for p in manifest.pipelines if p.source.kind == "derive" for t in p.source.config.get("tables", ())}
    return ({p.table for p in manifest.pipelines} | derived | {m.name for m in manifest.models}
            | {e.table for e in manifest.externals})


def unaccounted(manifest: Manifest, spec: ModelSpec, known: set[str]) -> tuple[str, ...]:
    """The inputs of ``spec``, as spelled, that are none of ``known`` nor a relational root's child table."""
    roots = [p.table.lower() + "__" for p in manifest.pipelines if p.normalize == "relational"]
    named = spec.inputs if spec.inputs is not None else spec.referenced
    named += tuple(t.to for t in spec.tests if t.to is not None)
    return tuple(dict.fromkeys(n for n in named if not resolve_table(n, known)
                               and not any(n.lower().startswith(r) for r in roots)))


def unknown_inputs(manifest: Manifest, stored: set[str]) -> list[ModelInputUnknown]:
    """One problem per model reading tables that neither the manifest nor ``stored`` accounts for."""
    known = produced(manifest) | stored
    problems = []
    for spec in manifest.models:
        if missing := unaccounted(manifest, spec, known):
            problems.append(ModelInputUnknown(spec.name, missing, tuple(sorted(known))))
    return problems


def check_model_inputs(manifest: Manifest, store: str | None = None,
                       declared: set[str] | frozenset[str] = frozenset()) -> list[ModelInputUnknown]:
    """:func:`unknown_inputs`, looking at the store (``store``, else the project's) only when the
    manifest leaves names unaccounted for, and only if that store exists. ``declared`` are tables
    blocks of the manifest name though they did not parse: their own problem says why, and a model
    reading one is not reported again."""
    if not unknown_inputs(manifest, set(declared)):
        return []
    return unknown_inputs(manifest, stored_tables(manifest, store) | declared)


def stored_tables(manifest: Manifest, store: str | None = None) -> set[str]:
    """The user tables of the store (``store``, else the project's); empty when it does not exist yet."""
    from contextful.engine.project import open_store

    if not store_exists(manifest, store):
        return set()
    with open_store(store or manifest.root) as opened:
        return set(opened.table_names())


def landed_schemas(manifest: Manifest, store: str | None = None) -> dict[str, pa.Schema]:
    """Each user table of the store (``store``, else the project's) that holds a commit, in its
    schema at the head; empty when the store does not exist yet."""
    from contextful.engine.project import open_store

    if not store_exists(manifest, store):
        return {}
    with open_store(store or manifest.root) as opened:
        pinned = opened.snapshots(opened.table_names())
    return {name: snap.schema for name, snap in pinned.items() if snap.schema is not None}


def store_exists(manifest: Manifest, store: str | None = None) -> bool:
    """Whether the store (``store``, else the project's) exists, asked without creating it."""
    from contextful.storage.objects import ObjectStore

    root = store or manifest.project.store
    # (a local ObjectStore would create its root)
    return ObjectStore(root).exists("store.json") if "://" in root else os.path.isfile(os.path.join(root, "store.json"))
