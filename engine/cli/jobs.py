"""``contextful job list|validate|fire|history``: the manifest's ``[[job]]`` blocks from the terminal
(``engine.config.jobs``; docs/jobs.md). ``job fire`` and ``job history`` work on the applied
version and the store (``engine.jobs.fire``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click
from contextful.engine.cli.output import emit_json, emit_rows
from contextful.engine.cli.values import at_least

if TYPE_CHECKING:
    from contextful.engine.jobs.fire import Fired


@click.group()
def job() -> None:
    """List, validate, fire and read the history of the manifest's jobs."""


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


@job.command("fire")
@click.argument("name")
@click.option("--version", "version", type=int, default=None, callback=at_least(1, "(a version number)"),
              help="Fire the job as applied version N declares it (default: the applied version).")
@click.option("--force", is_flag=True, help="Do the work even where there is nothing to do (build current models).")
@click.option("--result", "result", default=None, hidden=True, help="Write the outcome here (serve's job children).")
@click.pass_context
def job_fire(ctx: click.Context, name: str, version: int | None, force: bool, result: str | None) -> None:
    """Fire the applied job NAME once: one execution under job:NAME, recorded for `job history`.

    Exits 0 when the fire succeeded, else with its failure's code (docs/cli.md)."""
    import signal
    import threading

    from contextful.engine.jobs.fire import fire_job
    from contextful.engine.project import locate_project

    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())  # serve stopping: the runner stops at its next boundary
    root = locate_project(ctx.obj["project"])
    say = (lambda line: click.echo(f"{name}: {line}", err=True))
    try:
        fired = fire_job(root, name, version=version, force=force, store_url=ctx.obj["store"], cancel=cancel, say=say)
    except Exception as exc:
        if result is not None:
            _write_result(result, name, False, [_line(exc)])
        raise
    if result is not None:
        _write_result(result, name, fired.ok, [f"job:{name}: {line}" for line in _failures(fired)])
    if ctx.obj["json"]:
        emit_json(fired.to_json())
    else:
        outcome = fired.outcome
        click.echo(f"job:{name} v{fired.version}: {fired.status}: {outcome.summary if outcome else ''}")
    for line in _failures(fired):
        click.echo(f"error: {line}", err=True)
    if not fired.ok:
        ctx.exit(fired.exit_code or 1)


def _failures(fired: Fired) -> list[str]:
    return list(fired.outcome.failures) if fired.outcome is not None else []


def _line(exc: BaseException) -> str:
    from contextful.engine.guard import mask_message
    from contextful.storage.errors import ContextfulError

    return mask_message(str(exc) if isinstance(exc, ContextfulError) else f"{type(exc).__name__}: {exc}")


def _write_result(path: str, name: str, ok: bool, failures: list[str]) -> None:
    """The outcome serve's child launcher reads (written whole, then renamed into place)."""
    target = Path(path)
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps({"ok": ok, "members": [f"job:{name}"], "failures": failures}))
    os.replace(partial, target)


@job.command("history")
@click.argument("name")
@click.option("--limit", default=20, show_default=True, callback=at_least(1, "fires"), help="Newest fires to show.")
@click.pass_context
def job_history(ctx: click.Context, name: str, limit: int) -> None:
    """The job's newest fires, oldest first: start, outcome, rows, duration, version and summary,
    read from its executions' records."""
    from contextful.engine.jobs.fire import applied_job, fire_history
    from contextful.engine.project import locate_project, open_project_store
    from contextful.storage.errors import StoreNotFound

    root = locate_project(ctx.obj["project"])
    try:
        with open_project_store(root, ctx.obj["store"]) as store:
            fires = fire_history(store, name, limit)
    except StoreNotFound:
        fires = []
    if not fires:  # a job the applied version lacks and that never fired is no job (JobNotFound)
        applied_job(root, name)
    if ctx.obj["json"]:
        emit_json([f.to_json() for f in fires])
        return
    emit_rows(["started", "status", "rows", "duration_s", "version", "summary"],
              [(d["started"], d["status"], "-" if d["rows"] is None else d["rows"],
                "-" if d["duration_s"] is None else d["duration_s"], f"v{d['version']}", d["summary"] or "-")
               for d in (f.to_json() for f in fires)])
