"""Contextful: a columnar data engine over a transactional Parquet table store.

The public Python API is what this module exports (``__all__``); everything under
``contextful.engine``, ``contextful.storage`` and ``contextful.iceberg`` is internal and may change.

    >>> import contextful
    >>> project = contextful.open_project("path/to/project")      # doctest: +SKIP
    >>> project.run()                                             # doctest: +SKIP
    >>> con = contextful.connect(project)                         # doctest: +SKIP
    >>> con.sql("SELECT count(*) FROM events").fetchall()         # doctest: +SKIP

Names load on first use, so ``import contextful`` (and the ``contextful`` command) stays instant.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextful import errors
    from contextful.api import (
        Project,
        attach_build,
        build,
        connect,
        export,
        open_project,
        open_store,
        run_pipelines,
    )
    from contextful.engine.derive.tasks import TaskJoin, TaskUnit, register_task
    from contextful.storage import Store

__all__ = [
    "Project",
    "Store",
    "TaskJoin",
    "TaskUnit",
    "__version__",
    "attach_build",
    "build",
    "connect",
    "errors",
    "export",
    "open_project",
    "open_store",
    "register_task",
    "run_pipelines",
]

_WHERE = {
    "Project": "contextful.api",
    "attach_build": "contextful.api",
    "build": "contextful.api",
    "connect": "contextful.api",
    "export": "contextful.api",
    "open_project": "contextful.api",
    "open_store": "contextful.api",
    "run_pipelines": "contextful.api",
    "Store": "contextful.storage",
    "TaskJoin": "contextful.engine.derive.tasks",
    "TaskUnit": "contextful.engine.derive.tasks",
    "register_task": "contextful.engine.derive.tasks",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        return version("contextful")
    if name == "errors":
        return import_module("contextful.errors")
    if name in _WHERE:
        value = getattr(import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'contextful' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
