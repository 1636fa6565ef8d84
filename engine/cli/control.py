"""``contextful control push | pull``: a synced project's applied versions and its ``[sync]`` bucket
(``engine.control.synced``, ``engine.control.bucket``; docs/control.md, "Synced control")."""

from __future__ import annotations

import click
from contextful.engine.cli.apply import public_key_option
from contextful.engine.cli.output import emit_json


@click.group("control")
def control() -> None:
    """Push a synced project's applied versions to its [sync] bucket, or pull the bucket's head."""


@control.command("push")
@public_key_option
@click.pass_context
def push(ctx: click.Context, public_keys: tuple[str, ...]) -> None:
    """Upload the applied version and its signed chain, then advance the bucket head (a conditional write)."""
    from contextful.engine.control.synced import push_control

    outcome = push_control(ctx.obj["project"], public_keys=public_keys)
    if ctx.obj["json"]:
        emit_json(outcome.to_json())
    elif outcome.pushed:
        click.echo(f"pushed v{', v'.join(str(v) for v in outcome.pushed)}: the bucket head is v{outcome.head.version}")
    else:
        click.echo(f"nothing to push: the bucket head is v{outcome.head.version}, this node's applied version")


@control.command("pull")
@public_key_option
@click.pass_context
def pull(ctx: click.Context, public_keys: tuple[str, ...]) -> None:
    """Adopt the bucket head when it descends from the applied version: receipts verified, snapshot self-valid."""
    from contextful.engine.control.synced import pull_control

    adoption = pull_control(ctx.obj["project"], public_keys=public_keys, store=ctx.obj["store"],
                            machine=ctx.obj.get("machine"))
    if ctx.obj["json"]:
        emit_json(adoption.to_json())
    elif adoption.installed is not None:
        click.echo(f"adopted v{adoption.installed} (applied)")
    elif adoption.head is None:
        click.echo("nothing to pull: the bucket holds no head")
    else:
        click.echo(f"nothing to pull: the bucket head is v{adoption.head}, this node's is v{adoption.local}")
