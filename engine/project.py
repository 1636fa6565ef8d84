"""Finding a project and its store.

A project is a directory holding ``contextful.toml``; its ``[project]`` block names the project and
its store (a path relative to the project, or an fsspec URL; default ``.contextful/store``). Every
command and the public API find the project the same way (:func:`locate_project`: at or above the
directory given) and its store through :func:`open_project_store`: first to last, an explicit store
URL (``--store`` or ``CONTEXTFUL_STORE``), the project's ``[project].store``, the embedded default
under the project directory. Reading never writes: only a writer creates the store.
"""

from __future__ import annotations

import os
import re
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
    ProjectNotFound,
)
from contextful.storage.store import DEFAULT_STORE

MANIFEST = "contextful.toml"
PROJECT_KEYS = ("name", "store", "catalog", "issuer_keys", "modules", "zone")
ZONE_KEYS = ("default", "ceiling")
_ZONE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_DURATION = re.compile(r"([0-9]{1,9})\s*([smhd]?)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


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
    issuer_keys: tuple[str, ...] = ()
    """Issuer public keys pinned for signed credentials (``engine.control.credentials``)."""
    modules: tuple[str, ...] = ()
    """Python modules registering the project's host tasks and bodies, imported with the project
    directory on ``sys.path`` (``engine.registrations``)."""
    default_zone: str | None = None
    """``[project.zone] default``: the zone credentials minted for this project assert (a fire
    credential's; None: none declared)."""
    credential_ceiling_s: int | None = None
    """``[project.zone] ceiling``: the longest lifetime, in seconds, of a credential minted for this
    project (a fire credential lives 600 s or this when lower; None: no ceiling)."""


def find_project(start: str | os.PathLike[str] = ".") -> Path | None:
    """The nearest directory at or above ``start`` holding contextful.toml (None: there is none)."""
    here = Path(start).resolve()
    for candidate in (here, *here.parents):
        if (candidate / MANIFEST).is_file():
            return candidate
    return None


def locate_project(start: str | os.PathLike[str] = ".") -> Path:
    """The project every command and the public API work in: the nearest directory at or above
    ``start`` holding contextful.toml. ``ProjectNotFound`` names ``start`` when it is no directory
    (a mistyped --project is never taken for the project around it) or no project holds it."""
    if not Path(start).is_dir():
        raise ProjectNotFound(str(start), "not a directory" if Path(start).exists() else "no such directory")
    root = find_project(start)
    if root is None:
        raise ProjectNotFound(str(Path(start).resolve()), f"no {MANIFEST} here or in any directory above")
    return root


def read_manifest_document(root: Path) -> dict[str, Any]:
    """The parsed TOML of ``root``'s contextful.toml (empty when there is none)."""
    return read_toml_file(root / MANIFEST)


def read_toml_file(path: Path) -> dict[str, Any]:
    """The parsed TOML of a project file (empty when there is none); ``ProjectInvalid`` when it is
    not TOML (the message names a position, never a value)."""
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
    issuer_keys = _issuer_keys(block.get("issuer_keys", []), problems)
    for key in ("name", "store", "catalog"):
        if key in block:
            if isinstance(block[key], str) and block[key].strip():
                values[key] = block[key]
            else:
                problems.append(ManifestValueInvalid("[project]", key, f"must be a non-empty string, not {block[key]!r}"))
    modules = block.get("modules", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) and _dotted(m) for m in modules):
        problems.append(ManifestValueInvalid("[project]", "modules", f"must be a list of dotted module names "
                                                                     f"(\"shop.tasks\"), not {modules!r}"))
        modules = []
    store, catalog = values["store"] or DEFAULT_STORE, values["catalog"]
    if "://" not in store:
        store = str((root / store).resolve())
    if catalog is not None and "://" not in catalog:
        catalog = str((root / catalog).resolve())
    zone, ceiling = _zone(block.get("zone", {}), problems)
    return Project(root, values["name"] or root.name, store, catalog, issuer_keys, tuple(modules), zone,
                   ceiling), problems


def _zone(block: Any, problems: list[ContextfulError]) -> tuple[str | None, int | None]:
    """``[project.zone]``: its ``default`` zone name and its credential lifetime ``ceiling`` (whole
    seconds: ``600``, ``"90s"``, ``"5m"``, ``"1h"``)."""
    if not isinstance(block, dict):
        problems.append(ManifestValueInvalid("[project]", "zone", "must be a [project.zone] table"))
        return None, None
    problems += [ManifestKeyUnknown("[project.zone]", k, ZONE_KEYS) for k in block if k not in ZONE_KEYS]
    default = block.get("default")
    if default is not None and not (isinstance(default, str) and _ZONE.fullmatch(default)):
        problems.append(ManifestValueInvalid("[project.zone]", "default", f"must be a zone name (a lowercase letter, "
                                             f"then lowercase letters, digits, '_' or '-'), not {default!r}"))
        default = None
    ceiling = block.get("ceiling")
    if ceiling is None:
        return default, None
    seconds = (duration_seconds(ceiling) if isinstance(ceiling, str)
               else ceiling if isinstance(ceiling, int) and not isinstance(ceiling, bool) else 0)
    if seconds < 1:
        problems.append(ManifestValueInvalid("[project.zone]", "ceiling", f"must be a lifetime of one second or more "
                                             f"(600, \"90s\", \"5m\", \"1h\"), not {ceiling!r}"))
        return default, None
    return default, seconds


def duration_seconds(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``1h`` or ``2d`` as whole seconds (0: it is none of those)."""
    match = _DURATION.fullmatch(text.strip())
    return int(match.group(1)) * _UNITS[match.group(2) or "s"] if match else 0


def _dotted(name: str) -> bool:
    return all(part.isidentifier() for part in name.split("."))


def _issuer_keys(value: Any, problems: list[ContextfulError]) -> tuple[str, ...]:
    """``[project] issuer_keys``: a list of public keys, each as ``contextful key generate`` prints it."""
    if not isinstance(value, list):
        problems.append(ManifestValueInvalid("[project]", "issuer_keys", f"must be a list of public keys, not {value!r}"))
        return ()
    if not value:  # the common case: no keys pinned, and no cryptography import to check them
        return ()
    from contextful.engine.control.credentials import public_key_problem

    found = [problem for text in value if (problem := public_key_problem(text)) is not None]
    problems += [ManifestValueInvalid("[project]", "issuer_keys", problem) for problem in found]
    return () if found else tuple(value)


def load_project(directory: str | os.PathLike[str] = ".") -> Project:
    """The ``[project]`` block of the project at or above ``directory`` (:func:`locate_project`)."""
    root = locate_project(directory)
    project, problems = parse_project(read_manifest_document(root).get("project", {}), root)
    if problems:
        raise ManifestInvalid(str(root / MANIFEST), problems)
    return project


def open_project_store(directory: str | os.PathLike[str] = ".", store: str | None = None, *,
                       project: Project | None = None, create: bool = False, **kwargs: Any) -> Store:
    """The store a command works on, found one way everywhere: ``store`` (a root path or URL:
    --store, ``CONTEXTFUL_STORE``) when given, else the store of ``project`` or of the project at
    or above ``directory``. Only writers pass ``create`` (a pipeline run, a table load); anything
    else opens an existing store or raises ``StoreNotFound`` and writes nothing."""
    if store:
        return Store.open(store, create=create, **kwargs)
    found = project or load_project(directory)
    return Store.open(found.store, catalog_path=found.catalog, create=create, **kwargs)


def open_store(project_or_store: str | os.PathLike[str] | None = None, **kwargs: Any) -> Store:
    """Open an existing store, for reading: at a root URL, at a local store root (holding
    store.json), or the store of the project at or above a directory. ``None`` means
    ``CONTEXTFUL_STORE`` if set, else the project around the working directory. Never creates a store.
    """
    target = project_or_store if project_or_store is not None else os.environ.get("CONTEXTFUL_STORE")
    if target is None:
        return open_project_store(".", **kwargs)
    text = str(target)
    if "://" in text or (Path(text) / "store.json").is_file():
        return open_project_store(store=text, **kwargs)
    return open_project_store(text, **kwargs)
