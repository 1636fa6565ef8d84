"""The engine's whole validation of a manifest document: what ``contextful pipeline validate``
checks, and what an apply checks before it claims a version (``surface.apply.validation``,
``surface.apply.self-valid``).

Four steps, every problem of a step at once: the document parses (``parse_manifest``: keys,
values, pipelines, models, exports, externals, control, the compiled plan); each model reads only
tables the document produces or the store holds (``engine.model.inputs``); each derive tier's
engine is bound by this machine's configuration (``engine.derive.run.check_tiers``); each http
source's header secrets resolve on this machine (``engine.config.secrets``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contextful.engine.config.manifest import Manifest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.project import MANIFEST, read_manifest_document
from contextful.storage.errors import ContextfulError, ManifestInvalid, SecretUnresolved


def validated_manifest(root: Path, doc: dict[str, Any] | None = None, *, source: str | None = None,
                       store: str | None = None, machine: str | None = None) -> Manifest:
    """The manifest of ``doc`` (default: the working ``contextful.toml`` at ``root``) for the
    project at ``root``, after every check; ``ManifestInvalid`` (naming ``source``, default the
    working file) lists the problems of the first step that has any. ``store`` is the ``--store``
    root the model-input check reads instead of the project's; ``machine`` the ``--machine`` file."""
    path = source or str(root / MANIFEST)
    manifest = parse_manifest(read_manifest_document(root) if doc is None else doc, root, path)
    from contextful.engine.model.inputs import check_model_inputs

    if unknown := check_model_inputs(manifest, store):
        raise ManifestInvalid(path, [*unknown])
    if any(p.source.kind == "derive" for p in manifest.pipelines):
        from contextful.engine.derive.bind import load_machine
        from contextful.engine.derive.run import check_tiers

        if unbound := check_tiers(manifest.pipelines, load_machine(root, machine)):
            raise ManifestInvalid(path, unbound)
    if unresolved := _unresolved_secrets(manifest):
        raise ManifestInvalid(path, unresolved)
    return manifest


def _unresolved_secrets(manifest: Manifest) -> list[ContextfulError]:
    """Each http pipeline's first header secret this machine cannot resolve (``engine.config.secrets``)."""
    from contextful.engine.config.secrets import resolve_headers
    from contextful.engine.land.http import headers_where

    found: list[ContextfulError] = []
    for spec in manifest.pipelines:
        if spec.source.kind == "http" and spec.source.config.get("headers"):
            try:
                resolve_headers({str(k): str(v) for k, v in spec.source.config["headers"].items()}, manifest.root,
                                headers_where(spec.id))
            except SecretUnresolved as exc:
                found.append(exc)
    return found
