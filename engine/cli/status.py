"""``contextful pipeline status``: the control plane's armed entries, fires in flight and unarmed pipelines."""

from __future__ import annotations

import click


@click.command("status")
@click.pass_context
def status(ctx: click.Context) -> None:
    """Show what the applied version arms: last and next fire of each entry, units in flight,
    pipelines that arm nothing (and why), and who holds the cadence lease."""
    from contextful.engine.cli.output import emit_json
    from contextful.engine.config import load_manifest
    from contextful.engine.control.fire import rfc3339
    from contextful.engine.control.status import control_status
    from contextful.engine.project import open_project_store
    from contextful.storage.errors import StoreNotFound

    manifest = load_manifest(ctx.obj["project"])
    try:
        store = open_project_store(manifest.root, ctx.obj["store"], project=manifest.project)
    except StoreNotFound:
        found = control_status(manifest.root, None)  # nothing has run yet
    else:
        try:
            found = control_status(manifest.root, store)
        finally:
            store.close()
    if ctx.obj.get("json"):
        emit_json(found.to_json())
        return
    if found.version is None:
        click.echo("no applied version: nothing armed (contextful pipeline import claims v1)")
        return
    click.echo(f"applied v{found.version}; cadence lease: "
               + (f"held by {found.lease_holder} until {rfc3339(found.lease_expires_us)}"
                  if found.lease_holder else "free (no serve is dispatching)"))
    for e in found.entries:
        click.echo(f"armed {e.id} [{e.schedule}]: last fire {rfc3339(e.last_fire_us) or '-'}, next fire "
                   f"{rfc3339(e.next_fire_us) or '-'}" + (" (in flight)" if e.in_flight else "")
                   + (f"; unit {', '.join(e.members)}" if len(e.members) > 1 else ""))
    for u in found.unarmed:
        click.echo(f"unarmed {u['pipeline']}: {u['reason']}")


def register_status(pipeline_group: click.Group) -> None:
    pipeline_group.add_command(status)
