"""A connection's running instance: the template pipeline it instantiates, as the connection's own.

Implements the running half of ``surface.connection.create`` (what a claimed declaration runs),
``surface.connection.pause`` and ``surface.connection.delete`` (a connection not active arms nothing
and its fire runs nothing) and ``surface.connection.schedule-scale`` (one armed entry per active
connection, :func:`connection_entries`); serve arms and disarms the entries
(``engine.control.fire``), its unit child runs one (:func:`fire_connection`). docs/served.md,
"Connections", tells the rules below with a worked example.

An active connection whose ``pipeline`` names an ``http`` ``[[pipeline]]`` of the applied version
arms one entry ``connection:<id>`` on its own schedule. A fire runs the instance
(:func:`instance_spec`), the template with:

- its id ``connection:<id>``: its run scope, cursor and execution owner are ``pipeline:connection:<id>``
  (``engine.control.history.entry_scope`` reads its last start there);
- its table ``<template table>_<id>``, every character outside ``[A-Za-z0-9_]`` made ``_``
  (:func:`instance_table`; relational children follow as ``<that>__<path>``);
- its selection as query parameters of its requests, beside the template's ``params``: a scalar is
  one parameter, a list one parameter per element (booleans ``true``/``false``, numbers as JSON
  writes them);
- its secret: the template's headers reference exactly one distinct ``${secret:NAME}``; the instance
  references the connection's secret name there instead (resolved as any reference is:
  ``engine.config.secrets``, the environment then the secrets file), and masked messages show that
  reference;
- no seed (a seed reads the operator's files, never a tenant's data) and no steps or tiers (they ride
  the template's own cadence).

What cannot be instantiated (:func:`instance_problem`): a template of another source kind (a tenant
never chooses a URL or a file path), headers referencing no secret or several, a selection value that
is not a scalar or a list of scalars (null included), or a selection key the template's ``params``
or the URL's own query fix or the walk sets (its ``since_param`` and ``token_param``). Create refuses it
(``ConnectionRequestMalformed``, claiming nothing), as it refuses a table name the manifest or
another connection's record holds; a later version that makes a standing connection so arms nothing
for it and names it unarmed, as a later-created active connection whose table another active one
(created earlier) or the manifest holds is named unarmed with ``TableNameCollision``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from contextful.storage.errors import ConnectionRequestMalformed, TableNameCollision

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest, PipelineSpec
    from contextful.engine.control.arm import ArmedEntry, Unarmed
    from contextful.engine.control.connection import Declaration
    from contextful.storage.catalog import ConnectionRow
    from contextful.storage.clock import Clock

PREFIX = "connection:"
"""An armed entry id (and the instance's pipeline id) naming a connection: ``connection:<id>``."""
_REFERENCE = re.compile(r"\$\{secret:([A-Za-z_][A-Za-z0-9_]*)\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def entry_of(connection: str) -> str:
    return f"{PREFIX}{connection}"


def instance_table(template_table: str, connection: str) -> str:
    """The connection's own table.

    >>> instance_table("drive_files", "acme-drive.1")
    'drive_files_acme_drive_1'
    """
    return _UNSAFE.sub("_", f"{template_table}_{connection}")


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def _param(value: str | float | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value if isinstance(value, str) \
        else json.dumps(value)


def instance_problem(template: PipelineSpec, selection: Mapping[str, Any]) -> str | None:
    """Why ``template`` cannot run as a connection selecting ``selection`` (None: it can)."""
    if template.source.kind != "http":
        return (f"pipeline {template.id!r} reads a {template.source.kind!r} source: only an http pipeline can be "
                "instantiated (its origin and path are the operator's)")
    config = template.source.config
    headers = config.get("headers") or {}
    names = sorted({m.group(1) for value in headers.values() for m in _REFERENCE.finditer(str(value))})
    if len(names) != 1:
        return (f"the headers of pipeline {template.id!r} reference {len(names)} secrets"
                + (f" ({', '.join(names)})" if names else "")
                + ": a connection's secret stands for exactly one ${secret:NAME}")
    fixed = set(config.get("params") or {}) | {config.get("since_param", "since"),
                                               config.get("token_param", "page_token")}
    fixed |= {key for key, _ in parse_qsl(urlsplit(str(config.get("url", ""))).query)}
    for key, value in selection.items():
        if key in fixed:
            return (f"selection key {key!r} is a query parameter pipeline {template.id!r} sets itself "
                    "(its url's query, params, since_param or token_param)")
        if not (_scalar(value) or isinstance(value, list) and all(_scalar(v) for v in value)):
            return f"selection key {key!r} holds no scalar or list of scalars"
    return None


def instance_spec(template: PipelineSpec, row: ConnectionRow) -> PipelineSpec:
    """The pipeline a fire of the connection ``row`` runs (module docstring)."""
    from contextful.engine.config.manifest import SourceSpec

    selection = json.loads(row.selection)
    pairs = [(key, _param(v)) for key, value in selection.items() for v in (value if isinstance(value, list)
                                                                          else [value])]
    config = dict(template.source.config)
    url = urlsplit(str(config["url"]))
    config["url"] = urlunsplit(url._replace(query=urlencode(parse_qsl(url.query, keep_blank_values=True) + pairs)))
    config["headers"] = {name: _REFERENCE.sub(f"${{secret:{row.secret}}}", str(value))
                         for name, value in (config.get("headers") or {}).items()}
    return replace(template, id=entry_of(row.connection_id), table=instance_table(template.table, row.connection_id),
                   source=SourceSpec("http", config), schedule=row.schedule, after=(), seed=None, derive_parents=())


def manifest_tables(manifest: Manifest) -> dict[str, str]:
    """Each table name the manifest lands or declares (lower-cased, as views compare) and whose it is."""
    tables = {p.table.lower(): f"pipeline {p.id!r}" for p in manifest.pipelines}
    tables |= {e.table.lower(): f"external {e.id!r}" for e in manifest.externals}
    return tables


def _collision(table: str, taken: Mapping[str, str]) -> str | None:
    """Whose table ``table`` would meet (the same name, or a relational root's children), if anyone's."""
    lowered = table.lower()
    return next((owner for name, owner in taken.items()
                 if name == lowered or lowered.startswith(name + "__") or name.startswith(lowered + "__")), None)


def check_create(manifest: Manifest | None, declaration: Declaration, records: Iterable[ConnectionRow]) -> None:
    """Refuse (``ConnectionRequestMalformed``) a new connection the applied version cannot run, or whose
    table the manifest or another connection's record (of any state) holds."""
    templates = {} if manifest is None else {p.id: p for p in manifest.pipelines}
    template = templates.get(declaration.pipeline)
    if manifest is None or template is None:
        raise ConnectionRequestMalformed(f"'pipeline' {declaration.pipeline!r} is no [[pipeline]] of the applied "
                                         "version")
    problem = instance_problem(template, declaration.selection)
    if problem is not None:
        raise ConnectionRequestMalformed(problem)
    table = instance_table(template.table, declaration.connection)
    taken = manifest_tables(manifest) | {
        instance_table(templates[r.pipeline].table, r.connection_id).lower(): f"connection {r.connection_id!r}"
        for r in records if r.connection_id != declaration.connection and r.pipeline in templates}
    owner = _collision(table, taken)
    if owner is not None:
        raise ConnectionRequestMalformed(f"its table {table!r} would meet the table of {owner}: choose another id")


def connection_entries(manifest: Manifest, rows: Iterable[ConnectionRow]) -> tuple[dict[str, PipelineSpec],
                                                                                  list[Unarmed]]:
    """The instances the active connections of ``rows`` arm under ``manifest`` by entry id, and the
    active ones that arm nothing with their reason (module docstring: created earlier wins a table)."""
    from contextful.engine.control.arm import Unarmed

    armed: dict[str, PipelineSpec] = {}
    unarmed: list[Unarmed] = []
    taken = manifest_tables(manifest)
    active = sorted((r for r in rows if r.state == "active"), key=lambda r: (r.claimed_us, r.connection_id))
    for row in active:  # an active record was claimed once, at its create: claimed_us is when it was created
        entry = entry_of(row.connection_id)
        template = next((p for p in manifest.pipelines if p.id == row.pipeline), None)
        if template is None:
            unarmed.append(Unarmed(entry, f"pipeline {row.pipeline!r} is no [[pipeline]] of the applied version"))
            continue
        problem = instance_problem(template, json.loads(row.selection))
        if problem is not None:
            unarmed.append(Unarmed(entry, f"ConnectionRequestMalformed: {problem}"))
            continue
        instance = instance_spec(template, row)
        owner = _collision(instance.table, taken)
        if owner is not None:
            error = TableNameCollision(instance.table, owner, f"connection {row.connection_id!r}",
                                       "a later-created connection arms nothing")
            unarmed.append(Unarmed(entry, f"{error.name}: {error.detail}", error))
            continue
        taken[instance.table.lower()] = f"connection {row.connection_id!r}"
        armed[entry] = instance
    return armed, unarmed


MARK_RETRY_S = 0.1
"""How often a stopped fire looks again for its execution to mark when it has not claimed one yet."""


def _mark_canceled(store: Any, scope: str, cancel: threading.Event, done: threading.Event) -> None:
    """Once serve asks the fire to stop (SIGTERM sets ``cancel``), write the cancel mark on its pending
    execution (``engine.run.cancel``): the run stops at its next boundary, its commit boundary
    included, so a pause lands nothing of the fire in flight (one that claimed no execution yet is
    marked as soon as it does)."""
    from contextful.engine.run.cancel import request_cancel
    from contextful.storage.errors import CancelTargetNotInFlight

    cancel.wait()
    while not done.is_set():
        try:
            request_cancel(store.journal, scope)
            return
        except CancelTargetNotInFlight:
            done.wait(MARK_RETRY_S)


def armable_connections(manifest: Manifest, rows: Iterable[ConnectionRow]) -> tuple[list[ArmedEntry],
                                                                                     list[Unarmed]]:
    """The armed entries of the active connections of ``rows`` (their schedules read) and the ones
    arming nothing, with their reasons: what serve and ``pipeline status`` arm."""
    from contextful.engine.control.arm import arm_entries

    instances, unarmed = connection_entries(manifest, rows)
    entries, unreadable = arm_entries([(e, spec.schedule, 0) for e, spec in sorted(instances.items())])
    return entries, unarmed + unreadable


def fire_connection(root: Path, version: int, entry: str, store_url: str | None, *, cancel: threading.Event,
                    clock: Clock | None = None) -> dict[str, Any]:
    """Run the instance of connection ``entry`` under applied version ``version``, re-reading its record
    first: a connection no longer active (paused or deleted since it was dispatched) runs nothing. The
    outcome document of ``engine.control.child``."""
    from contextful.engine.control.arming import load_armable
    from contextful.engine.project import open_project_store
    from contextful.engine.run.units import Unit, run_unit

    manifest, _refused = load_armable(root, version)
    store = open_project_store(manifest.root, store_url, project=manifest.project, create=True, clock=clock)
    try:
        row = store.catalog.connection(manifest.project.name, entry[len(PREFIX):])
        if row is None or row.state != "active":
            state = "never created" if row is None else row.state
            return {"ok": True, "members": [], "failures": [], "skipped": f"{entry}: {state}: nothing run"}
        instances, unarmed = connection_entries(manifest, store.catalog.connections(manifest.project.name))
        if entry not in instances:
            reason = next((u.reason for u in unarmed if u.id == entry), "not armable")
            return {"ok": False, "members": [entry], "failures": [f"{entry}: {reason}"]}
        instance = instances[entry]
        alone = replace(manifest, pipelines=(instance,))
        done = threading.Event()
        marker = threading.Thread(target=_mark_canceled, args=(store, f"pipeline:{entry}", cancel, done),
                                  name=f"cancel-{entry}", daemon=True)
        marker.start()
        try:
            outcome = run_unit(store, alone, Unit(entry, (), (), (entry,)), cancel=cancel)
        finally:
            done.set()
            cancel.set()  # wakes the marker, which finds the run done
            marker.join()
    finally:
        store.close()
    return {"ok": outcome.ok, "members": [entry], "canceled": list(outcome.canceled),
            "failures": [f"{r.pipeline}: {f.error}: {f.detail}" for r in outcome.results for f in r.failures]}
