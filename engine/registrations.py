"""Registration modules: the Python code that registers a project's host tasks and bodies.

A host task (``contextful.register_task``, ``engine.derive.tasks``) or a store-driven body
(``engine.run.bodies.register_body``) exists only once the module registering it is imported. Every
command finds that code one way, here (decision "host-registered-derive"; docs/derive.md):

- ``[project] modules = ["shop.tasks"]`` names modules the project imports. :func:`import_project_modules`
  imports them, in order, with the project directory first on ``sys.path`` (a package beside
  ``contextful.toml`` is found), whenever a manifest is parsed (``engine.config.parse``): every
  command, ``pipeline serve`` and each unit child (which parses its applied version, so it imports
  the modules that version names).
- Installed packages declare entry points in the group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."contextful.tasks"]`` in their pyproject.toml). They are loaded once per
  process, when a task or body name is first looked up and not found (:func:`load_entry_points`):
  an entry point naming a module imports it; one naming a callable that takes no arguments imports
  its module and calls it (a registration function); anything else (a decorated task) is imported
  only, its import having registered it.

A module or entry point that fails to import is ``ProjectModuleUnimportable`` naming it and the
import error; while one has failed, an unregistered task name is not reported again
(:func:`failures` stands for it: one error per cause).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from contextful.storage.errors import ProjectModuleUnimportable

ENTRY_POINT_GROUP = "contextful.tasks"


@dataclass(frozen=True)
class Searched:
    """Where this process looked for registrations: what an unknown task or body names."""

    modules: tuple[str, ...]
    """The last manifest's ``[project] modules``, as imported."""
    entry_points: tuple[str, ...] | None
    """``name = value`` of each entry point in :data:`ENTRY_POINT_GROUP` (None: not loaded yet)."""


_lock = threading.RLock()
_modules: tuple[str, ...] = ()
_module_failures: list[ProjectModuleUnimportable] = []
_entry_points: tuple[str, ...] | None = None
_entry_failures: list[ProjectModuleUnimportable] = []


def _cause(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip().replace("\n", " ")


def import_project_modules(root: Path, modules: Sequence[str]) -> list[ProjectModuleUnimportable]:
    """Import ``modules`` (``[project] modules``) with ``root`` first on ``sys.path``; one error per
    module that fails to import (its import error named). A module imported before is not re-run."""
    global _modules, _module_failures
    failures = []
    with _lock:
        if modules and str(root) not in sys.path:
            sys.path.insert(0, str(root))
        for name in modules:
            try:
                importlib.import_module(name)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - what a module raises at import is its own error
                failures.append(ProjectModuleUnimportable(name, "[project] modules", _cause(exc)))
        _modules, _module_failures = tuple(modules), failures
    return failures


def _load(entry: object) -> None:
    loaded = entry.load()  # type: ignore[attr-defined]
    if isinstance(loaded, ModuleType) or not callable(loaded):
        return
    try:
        inspect.signature(loaded).bind()
    except (TypeError, ValueError):
        return  # takes arguments (a task function): importing its module registered it
    loaded()


def load_entry_points() -> tuple[str, ...]:
    """Load every entry point of :data:`ENTRY_POINT_GROUP`, once per process; their ``name = value``."""
    global _entry_points
    with _lock:
        if _entry_points is not None:
            return _entry_points
        from importlib.metadata import entry_points

        found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
        for entry in found:
            try:
                _load(entry)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - named as a module's import is
                _entry_failures.append(ProjectModuleUnimportable(
                    entry.value, f"entry point {entry.name!r} ({ENTRY_POINT_GROUP})", _cause(exc)))
        _entry_points = tuple(f"{e.name} = {e.value}" for e in found)
        return _entry_points


def searched() -> Searched:
    with _lock:
        return Searched(_modules, _entry_points)


def failures() -> list[ProjectModuleUnimportable]:
    """Every registration that failed to import: the last manifest's modules, then entry points."""
    with _lock:
        return [*_module_failures, *_entry_failures]
