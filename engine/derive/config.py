"""A derive pipeline's ``[pipeline.source.config]``: what it reads, which task derives it, and checks.

Implements ``run.select.required-key``, ``run.bind.command-in-manifest``, ``run.bind.unknown-task``,
``run.emit.reserved-discriminator``, ``run.emit.failure-off-table`` and ``run.bind.advisory-zone``
(decisions "derivation-key-decides", "derive-engine-machine", "derive-work-set")::

    [pipeline.source]
    kind = "derive"
    [pipeline.source.config]
    source_table = "recordings"      # the parent table (required)
    parent_id_column = "id"          # the parent's unit id (required)
    task = "transcribe"              # transcribe (default), link_preview, or a registered host task
    engine = "sphinx"                # built-in tasks: the [derive.<engine>] binding (required)
    media_column = "path"            # built-in tasks: the media value (required)
    columns = ["speaker"]            # extra passage fields the engine reports, kept as text columns
    max_attempts = 3                 # a failed unit is retried by later runs until this many attempts
    retain_versions = false          # keep rows per task version (``run.emit.version-retained``)
    tables = ["done", "chunks"]      # host tasks: exactly the task's marker and content tables

The engine's command is never here: it lives in the machine configuration (``engine.derive.bind``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contextful.engine.derive.tasks import BUILTIN_TASKS, DEFAULT_TASK, HostTask, host_task, unknown_task
from contextful.storage.errors import (
    ContextfulError,
    DeriveAdvisoryZone,
    DeriveConfigKeyMissing,
    DeriveFailureOffTable,
    DeriveOutputTablesMismatch,
    DeriveReservedDiscriminator,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)

PASSAGE_FIELDS = ("text", "start_s", "end_s", "confidence", "uri", "zone")
"""What an engine may report of a passage beside its modality (docs/derive.md)."""
RESERVED_COLUMNS = ("kind",)
FAILURE_KEYS = ("failure_table", "failures_table", "status_table", "error_table", "errors_table", "dead_letter")
"""Keys that would record per-unit failure state off the output table (``run.emit.failure-off-table``)."""
CONFIG_KEYS = ("source_table", "parent_id_column", "task", "engine", "media_column", "columns", "max_attempts",
               "retain_versions", "tables", "zone_from")
DEFAULT_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class DeriveConfig:
    source_table: str
    parent_id_column: str
    task: str = DEFAULT_TASK
    engine: str | None = None
    media_column: str | None = None
    columns: tuple[str, ...] = ()
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retain_versions: bool = False
    tables: tuple[str, ...] = ()

    @property
    def builtin(self) -> bool:
        return self.task in BUILTIN_TASKS

    def host(self) -> HostTask:
        task = host_task(self.task)
        if task is None:
            raise unknown_task("?", self.task)
        return task

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DeriveConfig:
        """The settings of a config :func:`check_config` passed."""
        return cls(source_table=config["source_table"], parent_id_column=config["parent_id_column"],
                   task=config.get("task", DEFAULT_TASK), engine=config.get("engine"),
                   media_column=config.get("media_column"), columns=tuple(config.get("columns", ())),
                   max_attempts=int(config.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
                   retain_versions=bool(config.get("retain_versions", False)), tables=tuple(config.get("tables", ())))


def _blank(value: Any) -> bool:
    return not isinstance(value, str) or not value.strip()


def check_config(where: str, pipeline: str, table: str, config: Mapping[str, Any]) -> list[ContextfulError]:
    """Every problem of a derive source's config, each named."""
    from contextful.engine.derive.bind import command_in_manifest
    from contextful.engine.registrations import failures as registration_failures

    problems: list[ContextfulError] = list(command_in_manifest(pipeline, config))
    taken = {p.key for p in problems if hasattr(p, "key")}
    for key in config:
        if key in FAILURE_KEYS:
            problems.append(DeriveFailureOffTable(pipeline, f"{where}.{key} = {config[key]!r}"))
        elif key not in CONFIG_KEYS and key not in taken:
            problems.append(ManifestKeyUnknown(where, key, CONFIG_KEYS))
    for key in ("source_table", "parent_id_column"):
        if _blank(config.get(key)):
            problems.append(DeriveConfigKeyMissing(pipeline, key))
    task = config.get("task", DEFAULT_TASK)
    if not isinstance(task, str) or not task:
        problems.append(ManifestValueInvalid(where, "task", "must name a task"))
        return problems
    registered = host_task(task)
    if task not in BUILTIN_TASKS and registered is None and not registration_failures():
        # while a registration module failed to import, its error stands for the tasks it would register
        problems.append(unknown_task(pipeline, task))
    if task in BUILTIN_TASKS:
        for key in ("engine", "media_column"):
            if _blank(config.get(key)):
                problems.append(DeriveConfigKeyMissing(pipeline, key, f" (task {task!r} runs an engine over a "
                                                                      f"media value)"))
    columns = config.get("columns", [])
    if not isinstance(columns, list) or not all(isinstance(c, str) and c for c in columns):
        problems.append(ManifestValueInvalid(where, "columns", "must be a list of column names"))
    else:
        problems += [DeriveReservedDiscriminator(pipeline, table, c) for c in columns if c.lower() in RESERVED_COLUMNS]
    attempts = config.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        problems.append(ManifestValueInvalid(where, "max_attempts", f"must be a whole number >= 1, not {attempts!r}"))
    if not isinstance(config.get("retain_versions", False), bool):
        problems.append(ManifestValueInvalid(where, "retain_versions", "must be true or false"))
    if config.get("zone_from", "engine") == "binding":
        problems.append(DeriveAdvisoryZone(pipeline, str(config.get("engine")), "zone_from = \"binding\" would take "
                                                                                 "each row's zone from the binding"))
    elif config.get("zone_from", "engine") != "engine":
        problems.append(ManifestValueInvalid(where, "zone_from", "is \"engine\" (each passage reports its own zone)"))
    if registered is not None:
        problems += _host_tables(pipeline, table, registered, config.get("tables"))
    elif "tables" in config and task in BUILTIN_TASKS:  # an unknown task's tables are not a second error
        problems.append(ManifestValueInvalid(where, "tables", f"only a host task declares tables; task {task!r} "
                                                              f"lands in the pipeline's table {table!r}"))
    return problems


def _host_tables(pipeline: str, table: str, task: HostTask, declared: Any) -> list[ContextfulError]:
    """``run.emit.output-tables``: the pipeline declares exactly the task's marker and content tables
    (its ``table`` is the marker table)."""
    if not isinstance(declared, list) or not all(isinstance(t, str) for t in declared):
        declared_tables: tuple[str, ...] = ()
    else:
        declared_tables = tuple(declared)
    found: list[ContextfulError] = []
    if sorted(declared_tables) != sorted(task.tables) or len(set(declared_tables)) != len(declared_tables):
        found.append(DeriveOutputTablesMismatch(pipeline, task.name, declared_tables, task.tables))
    elif table != task.marker_table:
        found.append(DeriveOutputTablesMismatch(pipeline, task.name, (f"table = {table!r}",),
                                                (f"table = {task.marker_table!r} (the marker table)",)))
    for column in task.columns:
        if column.lower() in RESERVED_COLUMNS:
            found.append(DeriveReservedDiscriminator(pipeline, task.marker_table, column))
    return found
