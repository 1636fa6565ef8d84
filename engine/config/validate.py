"""The engine's whole validation of a manifest document: what ``contextful pipeline validate``
checks, and what an apply checks before it claims a version (``surface.apply.validation``,
``surface.apply.self-valid``).

Every problem at once (CONVENTIONS: config reports every problem at once): the document is read
block by block (``read_declarations``: keys, values, pipelines, models, exports, externals, control,
the compiled plan), then each check of :data:`CHECKS` looks at what was read and adds its own
problems, all listed in one ``ManifestInvalid``:

- each model reads only tables the document produces or the store holds (``engine.model.inputs``);
- each pipeline declares its landed table as it landed (``engine.land.declaration``);
- each model's SQL binds over its inputs' landed or declared schemas (``engine.model.bind``);
- each derive tier's engine is bound by this machine's configuration (``engine.derive.run.check_tiers``);
- each http source's header secrets resolve on this machine (``engine.config.secrets``).

A check sees the problems found before it (:attr:`Validation.found`) so that it never reports a
follow-on of one of them: a model reading a block that did not parse is not also "unknown", a
model whose inputs are unknown is not bound, and a tier is bound only once every block parsed.
A new check is one more function in :data:`CHECKS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextful.engine.config.applied import AppliedSnapshot
from contextful.engine.config.manifest import Manifest
from contextful.engine.config.parse import read_declarations
from contextful.engine.project import MANIFEST, read_manifest_document
from contextful.storage.errors import ContextfulError, ManifestInvalid, ModelCycle, SecretUnresolved


@dataclass
class Validation:
    """What one validation reads besides the manifest, and what it has found so far."""

    root: Path
    """The project directory."""
    doc: dict[str, Any]
    """The document as written (blocks that did not parse still name their tables here)."""
    store: str | None = None
    """The ``--store`` root checks read instead of the project's."""
    machine: str | None = None
    """The ``--machine`` file."""
    found: list[ContextfulError] = field(default_factory=list)
    """Every problem found so far, in the order found."""
    parsed: bool = True
    """Whether every block of the document parsed (the manifest is whole)."""


Check = Callable[[Manifest, Validation], list[ContextfulError]]


def validated_manifest(root: Path, doc: dict[str, Any] | None = None, *, source: str | None = None,
                       store: str | None = None, machine: str | None = None,
                       applied: AppliedSnapshot | None = None) -> Manifest:
    """The manifest of ``doc`` (default: the working ``contextful.toml`` at ``root``) for the
    project at ``root``, after every check; ``ManifestInvalid`` (naming ``source``, default the
    working file) lists every problem found. ``store`` is the ``--store`` root the model checks
    read instead of the project's; ``machine`` the ``--machine`` file; ``applied`` the metadata of
    the applied version ``doc`` keeps (a pipelines-only apply: its models' inlined SQL)."""
    doc = read_manifest_document(root) if doc is None else doc
    manifest, found = read_declarations(doc, root, applied=applied)
    validation = Validation(root, doc, store, machine, list(found), parsed=not found)
    for check in CHECKS:
        validation.found += check(manifest, validation)
    if validation.found:
        raise ManifestInvalid(source or str(root / MANIFEST), validation.found)
    return manifest


def model_inputs(manifest: Manifest, validation: Validation) -> list[ContextfulError]:
    """Each model reads tables something produces or the store holds (``ModelInputUnknown``)."""
    from contextful.engine.model.inputs import check_model_inputs

    return [*check_model_inputs(manifest, validation.store, declared_tables(validation.doc))]


def table_declarations(manifest: Manifest, validation: Validation) -> list[ContextfulError]:
    """Each pipeline declares its landed table as it landed (``TableDeclarationChanged``)."""
    from contextful.engine.land.declaration import manifest_declaration_changes

    return [*manifest_declaration_changes(manifest, validation.store)]


def model_sql(manifest: Manifest, validation: Validation) -> list[ContextfulError]:
    """Each model's SQL binds over its inputs' schemas (``QueryInvalid`` naming the model and file)."""
    from contextful.engine.model.bind import bind_problems
    from contextful.engine.model.inputs import landed_schemas
    from contextful.storage.errors import ModelInputUnknown

    if not manifest.models or any(isinstance(p, ModelCycle) for p in validation.found):
        return []  # (a cycle has no dependency order to bind in)
    unknown = {p.model for p in validation.found if isinstance(p, ModelInputUnknown)}
    landed = landed_schemas(manifest, validation.store)
    return [p for p in bind_problems(manifest, landed) if p.model not in unknown]


def derive_tiers(manifest: Manifest, validation: Validation) -> list[ContextfulError]:
    """Each derive tier's engine is bound by this machine's configuration; a tier is built only from
    a whole manifest (a block that did not parse may be one the tier needs)."""
    if not validation.parsed or not any(p.source.kind == "derive" for p in manifest.pipelines):
        return []
    from contextful.engine.derive.bind import load_machine
    from contextful.engine.derive.run import check_tiers

    return check_tiers(manifest.pipelines, load_machine(validation.root, validation.machine))


def header_secrets(manifest: Manifest, validation: Validation) -> list[ContextfulError]:
    """Each http pipeline's header secrets resolve on this machine (``SecretUnresolved``, the first
    of each pipeline; ``engine.config.secrets``)."""
    from contextful.engine.land.http import HttpConfig, resolved_headers

    found: list[ContextfulError] = []
    for spec in manifest.pipelines:
        if spec.source.kind == "http" and spec.source.config.get("headers"):
            try:
                resolved_headers(spec.id, HttpConfig.from_config(spec.source.config), manifest.root)
            except SecretUnresolved as exc:
                found.append(exc)
    return found


CHECKS: tuple[Check, ...] = (model_inputs, table_declarations, model_sql, derive_tiers, header_secrets)
"""The checks after the document is read, in order; each sees the problems found before it."""


def declared_tables(doc: dict[str, Any]) -> frozenset[str]:
    """The tables the document's ``[[pipeline]]``, ``[[model]]`` and ``[[external]]`` blocks name, as
    written, whether or not the block parsed."""
    names: set[str] = set()
    for kind, key in (("pipeline", "id"), ("model", "name"), ("external", "id")):
        blocks = doc.get(kind, [])
        for block in blocks if isinstance(blocks, list) else []:
            if isinstance(block, dict):
                name = block.get("table", block.get(key)) if kind != "model" else block.get(key)
                if isinstance(name, str):
                    names.add(name)
    return frozenset(names)
