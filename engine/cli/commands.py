"""``contextful store collect`` and ``store provision``, the shared ``_store``/``_json`` of the store commands, and ``register()``,
which adds every command group (``table``, ``sql``, ``run``, ``pipeline``, ... each in its own module)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from contextful.engine.cli.output import emit_json
from contextful.engine.cli.values import at_least

if TYPE_CHECKING:
    from contextful.storage import Store


def _store(ctx: click.Context, *, create: bool = False) -> Store:
    """The store of ``--store``, else of the project at or above ``--project``; only a writer
    passes ``create`` (``engine.project.open_project_store``)."""
    from contextful.engine.project import open_project_store

    return open_project_store(ctx.obj["project"], ctx.obj["store"], create=create)


def _json(ctx: click.Context) -> bool:
    return bool(ctx.obj["json"])


@click.group("store")
def store_group() -> None:
    """Store upkeep."""


@store_group.command("collect")
@click.option("--retain-seconds", type=float, default=7 * 24 * 3600, show_default=True, callback=at_least(0, "seconds"),
              help="Keep parts that snapshots younger than this still read.")
@click.option("--grace-seconds", type=float, default=3600, show_default=True, callback=at_least(0, "seconds"),
              help="Leave unreferenced objects younger than this alone (runs in flight).")
@click.pass_context
def store_collect(ctx: click.Context, retain_seconds: float, grace_seconds: float) -> None:
    """Delete parts past retention and orphaned objects."""
    with _store(ctx) as store:
        result = store.collect(retain_seconds=retain_seconds, grace_seconds=grace_seconds)
    if _json(ctx):
        emit_json(result.to_json())
    else:
        click.echo(f"collected {len(result.removed_parts)} removed part(s) and {len(result.orphans)} orphan(s)")


@store_group.command("provision")
@click.pass_context
def store_provision(ctx: click.Context) -> None:
    """Create the execution tables and record the project recovery identity (container profile)."""
    from dataclasses import asdict

    from contextful.storage.container import provision

    with _store(ctx, create=True) as store:
        identity = provision(store)
    if _json(ctx):
        emit_json(asdict(identity))
    else:
        click.echo(f"recovery identity {identity.recovery_id}: store {identity.store_uuid}, schema {identity.schema}, "
                   f"corpus {identity.corpus}")


def register(cli: click.Group) -> None:
    from contextful.engine.cli.build import build
    from contextful.engine.cli.export import export
    from contextful.engine.cli.init import init
    from contextful.engine.cli.keys import key
    from contextful.engine.cli.pipeline import pipeline
    from contextful.engine.cli.runs import run
    from contextful.engine.cli.sql import sql
    from contextful.engine.cli.table import table

    for command in (init, sql, table, store_group, run, pipeline, build, export, key):
        cli.add_command(command)
