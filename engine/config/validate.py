"""The engine's whole validation of a manifest document: what ``contextful pipeline validate``
checks, and what an apply checks before it claims a version (``surface.apply.validation``,
``surface.apply.self-valid``).

Three steps, every problem of a step at once: the document parses (``parse_manifest``: keys,
values, pipelines, models, exports, externals, control, the compiled plan); each model reads only
tables the document produces or the store holds (``engine.model.inputs``) and each pipeline declares
its landed table as it landed (``engine.land.declaration``); each derive tier's
engine is bound by this machine's configuration (``engine.derive.run.check_tiers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contextful.engine.config.manifest import Manifest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.project import MANIFEST, read_manifest_document
from contextful.storage.errors import ContextfulError, ManifestInvalid


def validated_manifest(root: Path, doc: dict[str, Any] | None = None, *, source: str | None = None,
                       store: str | None = None, machine: str | None = None) -> Manifest:
    """The manifest of ``doc`` (default: the working ``contextful.toml`` at ``root``) for the
    project at ``root``, after every check; ``ManifestInvalid`` (naming ``source``, default the
    working file) lists the problems of the first step that has any. ``store`` is the ``--store``
    root the model-input check reads instead of the project's; ``machine`` the ``--machine`` file."""
    path = source or str(root / MANIFEST)
    manifest = parse_manifest(read_manifest_document(root) if doc is None else doc, root, path)
    from contextful.engine.land.declaration import manifest_declaration_changes
    from contextful.engine.model.inputs import check_model_inputs

    stored: list[ContextfulError] = [*check_model_inputs(manifest, store), *manifest_declaration_changes(manifest, store)]
    if stored:
        raise ManifestInvalid(path, stored)
    if any(p.source.kind == "derive" for p in manifest.pipelines):
        from contextful.engine.derive.bind import load_machine
        from contextful.engine.derive.run import check_tiers

        if unbound := check_tiers(manifest.pipelines, load_machine(root, machine)):
            raise ManifestInvalid(path, unbound)
    return manifest
