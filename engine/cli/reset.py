"""``contextful pipeline reset PIPELINE``: forget a pipeline's cursor so its next run reads everything again."""

from __future__ import annotations

import sys
from contextlib import ExitStack

import click

PLAN_INPUTS_SHOWN = 10
"""Inputs the text names before it gives the count of the rest (``--json`` lists all)."""


@click.command("reset")
@click.argument("pipeline_id", metavar="PIPELINE")
@click.option("--yes", is_flag=True, help="Go ahead without asking (required when stdin is not a terminal).")
@click.pass_context
def reset(ctx: click.Context, pipeline_id: str, yes: bool) -> None:
    """Forget PIPELINE's cursor (its landed inputs, or its http position): the next run reads every
    input again. Deletes no rows: what is read again merges by key, replaces the table, or (an
    unkeyed appending pipeline) lands a second time. Asks first; --yes off a terminal."""
    from contextful.engine.cli.output import declared, emit_json
    from contextful.engine.config import load_manifest
    from contextful.engine.land.reset import plan_reset, reset_pipeline
    from contextful.engine.project import open_project_store
    from contextful.storage.errors import ConfirmationRequired, StoreNotFound

    manifest = load_manifest(ctx.obj["project"])
    known = [p.id for p in manifest.pipelines]
    if pipeline_id not in known:
        raise click.BadParameter(f"no pipeline {pipeline_id!r} ({declared(known)})", param_hint="PIPELINE")
    spec = manifest.pipeline(pipeline_id)
    try:
        store = open_project_store(manifest.root, ctx.obj["store"], project=manifest.project)
    except StoreNotFound:  # nothing has run: nothing to forget, and no store is created
        store = None
    as_json = bool(ctx.obj.get("json"))
    with ExitStack() as stack:
        if store is not None:
            stack.enter_context(store)
        plan = plan_reset(store, spec)
        if plan.nothing:
            if as_json:
                emit_json(plan.to_json())
            else:
                click.echo(f"pipeline {spec.id!r}: no cursor to forget (nothing landed, or reset already); "
                           "nothing changed")
            return
        if not as_json:
            _describe(plan)
        if not yes:
            if not sys.stdin.isatty():
                raise ConfirmationRequired(f"pipeline reset {spec.id}", f"the cursor of pipeline {spec.id!r}")
            click.confirm(f"forget the cursor of pipeline {spec.id!r}?", default=False, abort=True)
        assert store is not None
        committed = reset_pipeline(store, spec)
    if as_json:
        emit_json({**plan.to_json(), "run_id": committed.run_id if committed else None,
                   "commit_seq": committed.commit_seq if committed else None})
    else:
        click.echo(f"pipeline {spec.id!r}: cursor forgotten" + (f" (commit_seq {committed.commit_seq})"
                                                                 if committed else "") + "; run it to read again")


def _describe(plan: object) -> None:
    """What the reset forgets and what the next run does, in words."""
    import json

    from contextful.engine.land.reset import ResetPlan

    assert isinstance(plan, ResetPlan)
    click.echo(f"pipeline {plan.pipeline!r} -> {plan.table} ({plan.source}, write_disposition = "
               f"{plan.disposition!r})")
    if plan.source == "files":
        click.echo(f"  forgets {len(plan.inputs)} landed input(s); the next run reads them again:")
        for name in plan.inputs[:PLAN_INPUTS_SHOWN]:
            click.echo(f"    {name}")
        if len(plan.inputs) > PLAN_INPUTS_SHOWN:
            click.echo(f"    ... and {len(plan.inputs) - PLAN_INPUTS_SHOWN:,} more")
    else:
        click.echo(f"  forgets its position {json.dumps(plan.position, sort_keys=True)}; the next run walks "
                   "the source from its start")
    click.echo(f"  reset deletes no rows: {plan.table} keeps its {plan.rows:,} row(s)")
    click.echo(f"  {plan.consequence()}")


def register_reset(pipeline_group: click.Group) -> None:
    pipeline_group.add_command(reset)
