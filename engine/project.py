"""Finding a project and its store.

A project is a directory holding ``contextful.toml``; its ``[project]`` block names the project and
its store (a path relative to the project, or an fsspec URL; default ``.contextful/store``). The
store to open is, first to last: an explicit store URL (``--store`` or ``CONTEXTFUL_STORE``), the
project's ``[project].store``, the embedded default under the project directory.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextful.storage import Store
from contextful.storage.errors import (
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    ProjectInvalid,
)
from contextful.storage.store import DEFAULT_STORE

MANIFEST = "contextful.toml"
PROJECT_KEYS = ("name", "store", "catalog")


@dataclass(frozen=True)
class Project:
    root: Path
    """The project directory."""
    name: str
    """The project's name (default: the directory's name)."""
    store: str
    """The store root: a local path (resolved against the project) or an fsspec URL."""
    catalog: str | None
    """The local profile's SQLite catalog file when the store root is remote."""


def find_project(start: str | os.PathLike[str] = ".") -> Path:
    """The nearest directory at or above ``start`` holding contextful.toml, else ``start``."""
    here = Path(start).resolve()
    for candidate in (here, *here.parents):
        if (candidate / MANIFEST).is_file():
            return candidate
    return here


def read_manifest_document(root: Path) -> dict[str, Any]:
    """The parsed TOML of ``root``'s contextful.toml (empty when there is none)."""
    path = root / MANIFEST
    if not path.is_file():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ProjectInvalid(str(path), f"not valid TOML: {exc}") from exc


def parse_project(block: Any, root: Path) -> tuple[Project, list[ContextfulError]]:
    """The ``[project]`` block read, with every problem found in it."""
    problems: list[ContextfulError] = []
    if not isinstance(block, dict):
        problems.append(ManifestValueInvalid("the manifest", "project", "must be a [project] table"))
        block = {}
    problems += [ManifestKeyUnknown("[project]", k, PROJECT_KEYS) for k in block if k not in PROJECT_KEYS]
    values: dict[str, str | None] = {"name": root.name, "store": DEFAULT_STORE, "catalog": None}
    for key in PROJECT_KEYS:
        if key in block:
            if isinstance(block[key], str) and block[key].strip():
                values[key] = block[key]
            else:
                problems.append(ManifestValueInvalid("[project]", key, f"must be a non-empty string, not {block[key]!r}"))
    store, catalog = values["store"] or DEFAULT_STORE, values["catalog"]
    if "://" not in store:
        store = str((root / store).resolve())
    if catalog is not None and "://" not in catalog:
        catalog = str((root / catalog).resolve())
    return Project(root, values["name"] or root.name, store, catalog), problems


def load_project(directory: str | os.PathLike[str] = ".") -> Project:
    root = find_project(directory)
    project, problems = parse_project(read_manifest_document(root).get("project", {}), root)
    if problems:
        raise ManifestInvalid(str(root / MANIFEST), problems)
    return project


def open_store(project_or_store: str | os.PathLike[str] | None = None, **kwargs: Any) -> Store:
    """Open the store of a project directory, or the store at a root path or URL.

    ``None`` means ``CONTEXTFUL_STORE`` if set, else the project around the working directory.
    A path that is not a project directory (no contextful.toml) is taken as a store root.
    """
    target = project_or_store if project_or_store is not None else os.environ.get("CONTEXTFUL_STORE")
    if target is None:
        project = load_project(".")
        return Store.open(project.store, catalog_path=project.catalog, **kwargs)
    text = str(target)
    if "://" not in text and (Path(text) / MANIFEST).is_file():
        project = load_project(text)
        return Store.open(project.store, catalog_path=project.catalog, **kwargs)
    return Store.open(text, **kwargs)
