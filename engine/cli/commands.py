"""``contextful store collect``, ``store compaction``, ``store provision``, ``store backup`` and ``store restore``, the shared ``_store``/``_json`` of the store commands, and ``register()``,
which adds every command group (``table``, ``sql``, ``run``, ``pipeline``, ... each in its own module)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.output import emit_json, emit_rows
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


@store_group.command("compaction")
@click.argument("tables", nargs=-1)
@click.option("--on/--off", "enabled", default=None, help="Turn the automatic compaction on or off.")
@click.option("--fanout", type=int, default=None, callback=at_least(2, "parts"),
              help="How many parts of a tier fold into one (default 8).")
@click.option("--small-mib", type=float, default=None, callback=at_least(0.001, "MiB"),
              help="Parts of this size or larger are never rewritten (default 16).")
@click.option("--reset", is_flag=True, help="Remove the store's (or the named tables') own setting.")
@click.pass_context
def store_compaction(ctx: click.Context, tables: tuple[str, ...], enabled: bool | None, fanout: int | None,
                     small_mib: float | None, reset: bool) -> None:
    """Show or set the automatic compaction policy: the store's, or TABLES' own (docs/store.md).

    Without --on/--off, --fanout, --small-mib or --reset it shows the policy in force for every table
    (or TABLES) and where each field comes from; with them it sets the store's setting, or each of
    TABLES' own, naming only the fields given."""
    from contextful.storage.compaction import FIELDS, own_settings, policy_for, set_policy, update_policy
    from contextful.storage.errors import ArgumentInvalid, TableNotFound
    from contextful.storage.reserved import RESERVED_TABLES

    fields: dict[str, object] = {}
    if enabled is not None:
        fields["enabled"] = enabled
    if fanout is not None:
        fields["fanout"] = fanout
    if small_mib is not None:
        fields["small_bytes"] = max(1, round(small_mib * 2**20))
    if reset and fields:
        raise ArgumentInvalid("--reset", "with --on/--off, --fanout or --small-mib",
                              "give --reset alone: it removes a setting, the other options set one")
    with _store(ctx) as store:
        known = [name for name in store.table_names() if name not in RESERVED_TABLES]
        for name in tables:
            if name not in known:
                raise TableNotFound(name)
        targets: list[str | None] = list(tables) or [None]
        if reset:
            for target in targets:
                set_policy(store, None, target)
        elif fields:
            for target in targets:
                update_policy(store, fields, target)
        store_own = own_settings(store)
        rows: list[dict[str, Any]] = []
        for name in tables or tuple(known):
            policy, own = policy_for(store, name), own_settings(store, name)
            live = store.catalog.live_parts(name, store.table(name).head.commit_seq)
            rows.append({"table": name, "enabled": policy.enabled, "fanout": policy.fanout,
                         "small_bytes": policy.small_bytes, "live_parts": len(live),
                         "from": {f: "table" if f in own else "store" if f in store_own else "default"
                                  for f in FIELDS}})
    if _json(ctx):
        emit_json({"store": store_own, "tables": rows})
        return
    click.echo("store setting: " + (", ".join(f"{k} = {v}" for k, v in sorted(store_own.items())) or "none (defaults)"))
    emit_rows(["table", "compaction", "fanout", "small_mib", "live_parts", "set_by"],
              [(r["table"], "on" if r["enabled"] else "off", r["fanout"], f"{r['small_bytes'] / 2**20:g}",
                r["live_parts"], ", ".join(f"{f}: {src}" for f, src in r["from"].items() if src != "default")
                or "defaults") for r in rows])


@store_group.command("provision")
@click.pass_context
def store_provision(ctx: click.Context) -> None:
    """Create the execution tables and record the project recovery identity (container or D1 profile)."""
    from dataclasses import asdict

    from contextful.storage.container import provision

    with _store(ctx, create=True) as store:
        if store.d1 is not None:
            from contextful.storage.d1.recovery import provision as provision_d1

            d1_identity = provision_d1(store)
            fields, bound = asdict(d1_identity), f"schema {d1_identity.schema!r}, R2 generation {d1_identity.generation}"
        else:
            identity = provision(store)
            fields, bound = asdict(identity), f"schema {identity.schema}, corpus {identity.corpus}"
    if _json(ctx):
        emit_json(fields)
    else:
        click.echo(f"recovery identity {fields['recovery_id']}: store {fields['store_uuid']}, {bound}")


@store_group.command("backup")
@click.argument("destination", type=click.Path(dir_okay=False, writable=True))
@click.pass_context
def store_backup(ctx: click.Context, destination: str) -> None:
    """Capture the D1 profile's execution database, R2 frontier, recovery identity and schema to DESTINATION."""
    import json
    import os

    from contextful.storage.d1.recovery import capture

    with _store(ctx) as store:
        document = capture(store)
    tmp = f"{destination}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(document, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, destination)
    summary = {"destination": destination, "recovery_id": document["identity"]["recovery_id"],
               "tables": len(document["database"]), "objects": len(document["r2_frontier"])}
    if _json(ctx):
        emit_json(summary)
    else:
        click.echo(f"backup of recovery identity {summary['recovery_id']}: {summary['tables']} tables, "
                   f"{summary['objects']} R2 objects, to {destination}")


@store_group.command("restore")
@click.argument("source", type=click.Path(dir_okay=False))
@click.pass_context
def store_restore(ctx: click.Context, source: str) -> None:
    """Restore the D1 profile's lost execution database from a SOURCE written by ``store backup``."""
    import json

    from contextful.storage.d1.restore import restore
    from contextful.storage.errors import ArgumentInvalid

    try:
        with open(source, encoding="utf-8") as fh:
            document = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ArgumentInvalid("SOURCE", source, f"not a readable backup document ({exc})") from exc
    if not isinstance(document, dict):
        raise ArgumentInvalid("SOURCE", source, "not a backup document (a JSON object)")
    with _store(ctx) as store:
        restored = restore(store, document, progress=lambda line: click.echo(line, err=True))
    if _json(ctx):
        emit_json(restored.to_json())
    else:
        click.echo(f"restored recovery identity {restored.identity.recovery_id}: {restored.tables} tables, "
                   f"{restored.rows} rows; {restored.objects_checked} R2 objects checked")


def register(cli: click.Group) -> None:
    from contextful.engine.cli.build import build
    from contextful.engine.cli.connection import connection
    from contextful.engine.cli.control import control
    from contextful.engine.cli.export import export
    from contextful.engine.cli.init import init
    from contextful.engine.cli.jobs import job
    from contextful.engine.cli.keys import key
    from contextful.engine.cli.pipeline import pipeline
    from contextful.engine.cli.runs import run
    from contextful.engine.cli.sql import sql
    from contextful.engine.cli.storage import storage
    from contextful.engine.cli.table import table
    from contextful.engine.cli.worker import worker

    for command in (init, sql, table, store_group, run, pipeline, build, export, key, job, control, connection,
                    worker, storage):
        cli.add_command(command)
