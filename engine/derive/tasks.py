"""The derive task registry: built-in task names and the host tasks an embedding program registers.

Implements ``run.bind.host-task`` and ``run.bind.unknown-task`` (decisions
"derive-engine-machine", "host-registered-derive"): an embedding program registers each host task
by name before it builds the manifest (:func:`register_task`, usually as a decorator); the manifest
selects a registered name with ``task = "<name>"`` and supplies no command. A name taken by a
built-in task or an earlier registration raises :class:`DeriveTaskNameTaken`. The commands find the
registering code through ``[project] modules`` and the ``contextful.tasks`` entry points
(``engine.registrations``): a name not registered yet loads the entry points once, and an unknown
name (:func:`unknown_task`) says where registrations were looked for.

A host task is a Python callable ``fn(unit) -> {content table: [row, ...]}``. It declares its
``task_version`` (raising it re-derives every settled unit, ``run.emit.task-version``), its
marker table and content tables (``run.emit.output-tables``), the parent columns it reads and the
tables it joins (``run.select.unit-parents``, ``run.select.join-key``); all of them enter its
derivation key (``engine.derive.keys``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contextful.storage.errors import DeriveTaskNameTaken, DeriveUnknownTask

BUILTIN_TASKS = ("transcribe", "link_preview")
DEFAULT_TASK = "transcribe"


@dataclass(frozen=True)
class TaskJoin:
    """Rows of ``table`` whose ``column`` equals the unit's parent id travel with the unit."""

    table: str
    column: str
    read: tuple[str, ...] = ()
    """The columns the task reads (hashed into the key, sorted over); empty: every column."""


@dataclass(frozen=True)
class TaskUnit:
    """What a host task receives for one unit."""

    unit_ref: Any
    """The parent row's id."""
    derivation_key: str
    task_version: str
    parent: Mapping[str, Any]
    """The parent row's declared columns (every column when the task declares none)."""
    joined: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Per joined table, every row whose join column equals the unit's id, read once per run."""


TaskFn = Callable[[TaskUnit], Mapping[str, Sequence[Mapping[str, Any]]]]


@dataclass(frozen=True)
class HostTask:
    name: str
    task_version: str
    marker_table: str
    content_tables: tuple[str, ...]
    fn: TaskFn
    columns: tuple[str, ...] = ()
    """The parent columns the task reads (empty: every column)."""
    joins: tuple[TaskJoin, ...] = ()

    @property
    def tables(self) -> tuple[str, ...]:
        """The marker table, then the content tables: exactly what its pipeline declares."""
        return (self.marker_table, *self.content_tables)


_lock = threading.Lock()
_registry: dict[str, HostTask] = {}


def register_task(name: str, *, task_version: str, marker_table: str, content_tables: Sequence[str],
                  columns: Sequence[str] = (), joins: Sequence[TaskJoin] = ()) -> Callable[[TaskFn], TaskFn]:
    """Register ``fn`` as the host task ``name`` (a decorator)::

        @register_task("chunks", task_version="2", marker_table="doc_chunks_done",
                       content_tables=["doc_chunks"], columns=["body"])
        def chunk(unit):
            return {"doc_chunks": [{"text": part} for part in unit.parent["body"].split("\\n\\n")]}
    """
    if not isinstance(task_version, str) or not task_version:
        raise ValueError(f"host task {name!r}: task_version must be a non-empty string")

    def register(fn: TaskFn) -> TaskFn:
        with _lock:
            if name in BUILTIN_TASKS:
                raise DeriveTaskNameTaken(name, "a built-in task")
            if name in _registry:
                raise DeriveTaskNameTaken(name, f"the host task registered from {_registry[name].fn.__module__}")
            _registry[name] = HostTask(name, task_version, marker_table, tuple(content_tables), fn,
                                       tuple(columns), tuple(joins))
        return fn

    return register


def unregister_task(name: str) -> None:
    """Forget a registration (an embedding program reloading its tasks; tests)."""
    with _lock:
        _registry.pop(name, None)


def host_task(name: str) -> HostTask | None:
    """The host task ``name``; a name not registered yet loads the installed entry points first."""
    with _lock:
        found = _registry.get(name)
    if found is None and name not in BUILTIN_TASKS:
        from contextful.engine.registrations import load_entry_points

        load_entry_points()
        with _lock:
            found = _registry.get(name)
    return found


def unknown_task(pipeline: str, task: str) -> DeriveUnknownTask:
    """``DeriveUnknownTask`` for ``task``, naming the built-in and registered tasks and where
    registrations were looked for."""
    from contextful.engine.registrations import searched

    where = searched()
    return DeriveUnknownTask(pipeline, task, BUILTIN_TASKS, registered_names(), where.modules,
                             where.entry_points or ())


def registered_names() -> tuple[str, ...]:
    with _lock:
        return tuple(sorted(_registry))
