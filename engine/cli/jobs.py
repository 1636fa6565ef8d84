"""``contextful job list|validate``: the manifest's ``[[job]]`` blocks from the terminal
(``engine.config.jobs``; docs/jobs.md). ``job fire NAME`` and ``job history NAME`` arrive with the
fire stage."""

from __future__ import annotations

import click
from contextful.engine.cli.output import emit_json, emit_rows


@click.group()
def job() -> None:
    """List and validate the manifest's jobs."""


def _jobs_json(ctx: click.Context) -> list[dict[str, object]]:
    from contextful.engine.config.validate import validated_manifest
    from contextful.engine.project import locate_project

    manifest = validated_manifest(locate_project(ctx.obj["project"]), store=ctx.obj["store"],
                                  machine=ctx.obj.get("machine"))
    return [{"name": j.name, "kind": j.kind, "identity": j.identity, "schedule": j.schedule, "after": j.after,
             "target": list(j.target), "body": j.body, "delegate": j.delegate, "max_in_flight": j.max_in_flight}
            for j in manifest.jobs]


@job.command("list")
@click.pass_context
def job_list(ctx: click.Context) -> None:
    """Each job: its kind, when it fires (a schedule, or after a pipeline) and what it targets."""
    jobs = _jobs_json(ctx)
    if ctx.obj["json"]:
        emit_json(jobs)
        return
    emit_rows(["job", "kind", "fires", "target"],
              [(j["name"], j["kind"], j["schedule"] or (f"after {j['after']}" if j["after"] else "on `job fire`"),
                ",".join(j["target"]) or j["body"] or j["delegate"] or "-")  # type: ignore[arg-type]
               for j in jobs])


@job.command("validate")
@click.pass_context
def job_validate(ctx: click.Context) -> None:
    """Check contextful.toml as `pipeline validate` does (schedules included); with no problem, name the jobs."""
    from contextful.engine.cli.errors import validated_or_reported

    jobs = [j.name for j in validated_or_reported(ctx).jobs]
    if ctx.obj["json"]:
        emit_json({"ok": True, "jobs": jobs})
    else:
        click.echo(f"{len(jobs)} job(s) valid: {', '.join(jobs) or 'none'}")
