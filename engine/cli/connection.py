"""``contextful connection list|show``: the tenant connections the served routes recorded.

Reads the records ``engine.control.connection`` keeps in the store's catalog (docs/served.md,
"Connections"); reading never creates a store. ``show`` of an id no record holds is ``ConnectionUnknown``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from contextful.storage.catalog import ConnectionRow


def _records(ctx: click.Context, connection_id: str | None = None) -> list[ConnectionRow]:
    """Every connection record the project's store holds, or the one of ``connection_id`` (none when
    it has no store yet)."""
    from contextful.engine.config import load_manifest
    from contextful.engine.project import open_project_store
    from contextful.storage.errors import StoreNotFound

    manifest = load_manifest(ctx.obj["project"])
    try:
        store = open_project_store(manifest.root, ctx.obj["store"], project=manifest.project)
    except StoreNotFound:
        return []
    with store:
        if connection_id is None:
            return store.catalog.connections(manifest.project.name)
        row = store.catalog.connection(manifest.project.name, connection_id)
        return [] if row is None else [row]


@click.group("connection")
def connection() -> None:
    """Tenant connections (created, paused and deleted over `pipeline serve --http`)."""


@connection.command("list")
@click.pass_context
def connection_list(ctx: click.Context) -> None:
    """List every connection: id, version, state, tenant, principal, pipeline and schedule."""
    from contextful.engine.cli.output import emit_json, emit_rows
    from contextful.engine.control.connection import connection_json

    rows = _records(ctx)
    if ctx.obj.get("json"):
        emit_json([connection_json(row) for row in rows])
        return
    emit_rows(["connection", "version", "state", "tenant", "principal", "pipeline", "schedule"],
              [(r.connection_id, r.version, r.state, r.tenant, r.principal, r.pipeline, r.schedule) for r in rows])


@connection.command("show")
@click.argument("connection_id")
@click.pass_context
def connection_show(ctx: click.Context, connection_id: str) -> None:
    """Show one connection's record as its last claim left it (its selection and secret name too)."""
    import json

    from contextful.engine.cli.output import emit_json
    from contextful.engine.control.connection import connection_json
    from contextful.storage.errors import ConnectionUnknown

    found = _records(ctx, connection_id)
    if not found:
        raise ConnectionUnknown(connection_id)
    doc = connection_json(found[0])
    if ctx.obj.get("json"):
        emit_json(doc)
        return
    for key, value in doc.items():
        click.echo(f"{key}: {json.dumps(value) if isinstance(value, dict) else ('-' if value is None else value)}")
