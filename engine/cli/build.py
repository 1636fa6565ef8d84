"""``contextful build run|hold|release|list|status``: the manifest's models from the terminal (docs/models.md)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import click
from contextful.engine.cli.output import declared, emit_json, emit_rows

if TYPE_CHECKING:
    from contextful.engine.config import Manifest
    from contextful.storage import Store


def _open(ctx: click.Context) -> tuple[Manifest, Store | None]:
    """The manifest and its store; no store (None) before anything landed: then no model has a
    build, and the reading commands say so rather than fail or create one."""
    from contextful.engine.cli.pipeline import _manifest, _store
    from contextful.storage.errors import StoreNotFound

    manifest = _manifest(ctx)
    try:
        return manifest, _store(ctx, manifest)
    except StoreNotFound:
        return manifest, None


@click.group()
def build() -> None:
    """Build, hold and list the manifest's models."""


@build.command("run")
@click.argument("models", nargs=-1)
@click.pass_context
def build_run(ctx: click.Context, models: tuple[str, ...]) -> None:
    """Build models (default: all), each after the models it reads.

    A failing model does not stop the others: every published build is reported, then one ``error:``
    line per failed model; models reading a failed one are skipped. Exits with the first failure's code.
    """
    from contextful.engine.cli.errors import error_line
    from contextful.engine.cli.pipeline import _manifest, _store
    from contextful.engine.model.build import build_each

    manifest = _manifest(ctx)
    known = {m.name for m in manifest.models}
    unknown = [m for m in models if m not in known]
    if unknown:  # before the store opens: a mistyped name touches nothing
        raise click.BadParameter(f"no model {', '.join(map(repr, unknown))} ({declared(known)})",
                                 param_hint="MODEL")
    with _store(ctx, manifest) as store:
        outcomes = build_each(store, manifest, list(models) or None)
    if ctx.obj["json"]:
        emit_json([o.to_json() for o in outcomes])
    else:
        for o in outcomes:
            if (r := o.result) is not None:
                marks = ", ".join(f"{k}@{v}" for k, v in r.watermark.items()) or "no inputs"
                click.echo(f"{r.model}: build {r.build_id} published, {r.rows:,} rows in {r.parts} part(s),"
                           f" read {marks}")
            elif o.after:
                click.echo(f"{o.model}: skipped, it reads {', '.join(o.after)}, which did not build")
    failed = [o.error for o in outcomes if o.error is not None]
    for error in failed:
        click.echo(error_line(error), err=True)
    if failed:
        ctx.exit(failed[0].exit_code)


@build.command("hold")
@click.argument("model")
@click.argument("build_id", type=int)
@click.option("--reason", default="", help="Why the build is kept (stored in the hold record).")
@click.pass_context
def build_hold(ctx: click.Context, model: str, build_id: int, reason: str) -> None:
    """Keep a build's parts past retention (holds/<build id>.json)."""
    from contextful.engine.cli.commands import _store
    from contextful.storage.holds import hold_build

    with _store(ctx) as store:
        record = hold_build(store, model, build_id, reason)
    if ctx.obj["json"]:
        emit_json(record.__dict__)
    else:
        click.echo(f"{model}: build {build_id} held ({reason or 'no reason given'})")


@build.command("release")
@click.argument("model")
@click.argument("build_id", type=int)
@click.pass_context
def build_release(ctx: click.Context, model: str, build_id: int) -> None:
    """Remove the hold on a build; collection may then remove it past retention."""
    from contextful.engine.cli.commands import _store
    from contextful.storage.holds import release_hold

    with _store(ctx) as store:
        released = release_hold(store, model, build_id)
    if ctx.obj["json"]:
        emit_json({"model": model, "build_id": build_id, "released": released})
    else:
        click.echo(f"{model}: build {build_id} {'released' if released else 'was not held'}")


@build.command("list")
@click.pass_context
def build_list(ctx: click.Context) -> None:
    """Every declared model with its published build, watermark and held builds."""
    from contextful.engine.model.build import published_build
    from contextful.storage.holds import holds

    manifest, store = _open(ctx)
    rows = []
    with nullcontext() if store is None else store:
        for spec in manifest.models:
            found = published_build(store, spec.name) if store is not None else None
            meta = found[1].meta if found else {}
            rows.append({"model": spec.name, "build_id": found[0] if found else None,
                         "watermark": meta.get("watermark", {}),
                         "contract": (meta.get("contract") or {}).get("version"),
                         "held": [h.build_id for h in holds(store, spec.name)] if store is not None and found else []})
    if ctx.obj["json"]:
        emit_json(rows)
        return
    emit_rows(["model", "build_id", "watermark", "contract", "held"],
              [(r["model"], r["build_id"], ", ".join(f"{k}@{v}" for k, v in r["watermark"].items()) or "-",
                r["contract"] or "-", ",".join(map(str, r["held"])) or "-") for r in rows])


@build.command("status")
@click.pass_context
def build_status_command(ctx: click.Context) -> None:
    """Each model's published build, stale inputs (older than its max_lag) and why it is stale."""
    from contextful.engine.model.status import ModelStatus, build_status

    manifest, store = _open(ctx)
    if store is None:
        found = [ModelStatus(m.name, None) for m in manifest.models]
    else:
        with store:
            found = build_status(store, manifest)
    if ctx.obj["json"]:
        emit_json([s.to_json() for s in found])
        return
    for s in found:  # what --json says, in words: a block per model, nothing cut short
        built = f"build {s.build_id}" if s.build_id is not None else "no build published"
        click.echo(f"{s.model}: {built}, {'stale' if s.stale else 'current'}")
        click.echo(f"  watermark: {', '.join(f'{k}@{v}' for k, v in s.watermark.items()) or '-'}")
        click.echo(f"  stale inputs: {', '.join(s.stale_inputs) or 'none'}")
        click.echo(f"  changed: {', '.join(s.changed) or 'nothing'}")
        if s.why:
            click.echo(f"  why: {'; '.join(s.why)}")
