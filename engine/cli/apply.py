"""``contextful pipeline import | apply [--pipelines-only] | versions``: the applied versions of the
manifest (``engine.control.apply``, docs/control.md). ``register_apply(pipeline)`` adds them to the
``pipeline`` group. In a project with ``[sync]``, import and apply take ``--signing-key`` (else
``CONTEXTFUL_CONTROL_SIGNING_KEY``) and ``--public-key`` (docs/control.md, "Synced control")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.output import emit_json, emit_rows

if TYPE_CHECKING:
    from contextful.engine.control.apply import ApplyOutcome
    from contextful.engine.control.synced import Offered


def public_key_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--public-key ed25519:…`` (repeatable): an issuer key a pulled head may be signed by, beside the pins."""
    return click.option("--public-key", "public_keys", multiple=True, metavar="ed25519:KEY",
                        help="An issuer public key a pulled control head may be signed by, beside [project] "
                             "issuer_keys or CONTEXTFUL_ISSUER_PUBKEY (repeatable).")(command)


def signing_key_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--signing-key", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        help="With [sync]: the issuer private key that signs each claimed version's receipt "
                             "(default: CONTEXTFUL_CONTROL_SIGNING_KEY).")(command)


def _offered(signing_key: Path | None, public_keys: tuple[str, ...]) -> Offered:
    from contextful.engine.control.synced import Offered

    return Offered(signing_key=signing_key, public_keys=public_keys)


def _schedule_warnings(ctx: click.Context, outcome: ApplyOutcome) -> list[str]:
    """What the applied version arms nothing for, by its schedule (``surface.arm.unreadable-schedule``:
    a version holding one is applied, its other entries arm; serve names the pipeline unarmed)."""
    import tomllib

    from contextful.engine.control.apply import load_version
    from contextful.engine.control.arm import schedule_problems
    from contextful.engine.project import locate_project

    root = locate_project(ctx.obj["project"])
    doc = tomllib.loads(outcome.snapshot.read_text(encoding="utf-8"))
    problems = schedule_problems(doc, load_version(root, outcome.version))
    return [f"{p}; it arms nothing until a version fixes it" for p in problems]


def _emit(ctx: click.Context, outcome: ApplyOutcome) -> None:
    warnings = _schedule_warnings(ctx, outcome)
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    if ctx.obj["json"]:
        emit_json(outcome.to_json() | {"warnings": warnings})
    elif outcome.claimed:
        click.echo(f"claimed v{outcome.version} (applied)")
    elif outcome.adopted:
        click.echo(f"adopted v{outcome.version} from the bucket (applied); import claims nothing")
    elif outcome.verb == "import":
        click.echo(f"v{outcome.version} is applied already; import claims nothing")
    else:
        click.echo(f"unchanged: v{outcome.version} is applied")


@click.command("import")
@signing_key_option
@public_key_option
@click.pass_context
def import_(ctx: click.Context, signing_key: Path | None, public_keys: tuple[str, ...]) -> None:
    """Claim v1 from contextful.toml while no version is claimed; afterwards, claim nothing and name the applied one."""
    from contextful.engine.control.apply import import_manifest

    _emit(ctx, import_manifest(ctx.obj["project"], store=ctx.obj["store"], machine=ctx.obj.get("machine"),
                               offered=_offered(signing_key, public_keys)))


@click.command("apply")
@click.option("--pipelines-only", is_flag=True,
              help="Take only the [[pipeline]] blocks of contextful.toml; everything else as applied.")
@signing_key_option
@public_key_option
@click.pass_context
def apply(ctx: click.Context, pipelines_only: bool, signing_key: Path | None, public_keys: tuple[str, ...]) -> None:
    """Validate contextful.toml and claim it as the next applied version (what serve runs)."""
    from contextful.engine.control.apply import apply_manifest

    _emit(ctx, apply_manifest(ctx.obj["project"], pipelines_only=pipelines_only, store=ctx.obj["store"],
                              machine=ctx.obj.get("machine"), offered=_offered(signing_key, public_keys)))


@click.command("versions")
@click.pass_context
def versions(ctx: click.Context) -> None:
    """Every claimed version of the manifest, when it was claimed, and which one is applied."""
    from contextful.engine.control.apply import versions as claimed

    found = claimed(ctx.obj["project"])
    if ctx.obj["json"]:
        emit_json([v.to_json() for v in found])
    elif not found:
        click.echo("no version claimed yet: `contextful pipeline import` claims v1")
    else:
        emit_rows(["version", "claimed_at", "applied"],
                  [(f"v{v.version}", v.claimed_at, "applied" if v.applied else "") for v in found])


def register_apply(pipeline_group: click.Group) -> None:
    """Add ``import``, ``apply`` and ``versions`` to the ``pipeline`` command group."""
    for command in (import_, apply, versions):
        pipeline_group.add_command(command)
