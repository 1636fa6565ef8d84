"""The inspection commands: ``sql``, ``store collect``, ``run history`` (``table`` is ``engine.cli.table``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.output import (
    describe_event,
    emit_json,
    emit_rows,
)
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


@click.command()
@click.argument("query")
@click.option("--as-of", default=None, help="Read every table as of this transaction time (ISO-8601).")
@click.pass_context
def sql(ctx: click.Context, query: str, as_of: str | None) -> None:
    """Run a DuckDB query over the store's tables (each a view)."""
    import duckdb
    from contextful.engine.read import connect, deferred_error, parse_instant
    from contextful.storage.errors import QueryInvalid, first_line

    instant = parse_instant(as_of, "--as-of")  # before the store opens: a mistyped instant touches nothing
    with _store(ctx) as store:
        con = connect(store, as_of=instant)
        try:
            rel = con.sql(query)
            if rel is None:
                return
            result = rel.to_arrow_table()
        except duckdb.Error as exc:
            raise deferred_error(exc) or QueryInvalid(query, first_line(exc)) from exc
    if _json(ctx):
        emit_json(result.to_pylist())
    else:
        emit_rows(result.column_names, [tuple(r.values()) for r in result.slice(0, 100).to_pylist()],
                  total=result.num_rows)


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


@click.group()
def run() -> None:
    """Run records."""


@run.command("history")
@click.option("--table", "table_name", default=None, help="Only runs of this table.")
@click.option("--limit", default=50, show_default=True, callback=at_least(1, "runs"), help="Newest runs to show.")
@click.pass_context
def run_history(ctx: click.Context, table_name: str | None, limit: int) -> None:
    """Runs from _runs, newest last, each with its downgrade events."""
    with _store(ctx) as store:
        runs = _history(store, table_name, limit)
    if _json(ctx):
        emit_json(runs)
        return
    emit_rows(["run_id", "table", "kind", "status", "recorded_at", "commit_seq", "rows", "events"],
              [(r["run_id"], r["table"], r["kind"], r["status"], r["recorded_at"], r["commit_seq"], r["rows"],
                len(r["downgrade_events"])) for r in runs])
    for r in runs:
        for e in r["downgrade_events"]:
            click.echo(f"  {r['run_id']} {describe_event(e)}")


@run.command("executions")
@click.pass_context
def run_executions(ctx: click.Context) -> None:
    """Execution owners by scope: pending ones hold a checkpoint and resume on the next run."""
    with _store(ctx) as store:
        owners = store.journal.owners()
    rows = [{"scope": o.scope, "execution": o.execution_id, "status": o.status, "attempts": o.attempts,
             "holder": o.holder, "plan": o.plan_ref[:12]} for o in owners]
    if _json(ctx):
        emit_json(rows)
        return
    emit_rows(["scope", "execution", "status", "attempts", "holder", "plan"], [tuple(r.values()) for r in rows])


@run.command("rewind")
@click.argument("execution_id")
@click.option("--reason", required=True, help="Why the execution is abandoned (kept in the output).")
@click.option("--force", is_flag=True, help="Accepted, and overrides none of the refusals.")
@click.pass_context
def run_rewind(ctx: click.Context, execution_id: str, reason: str, force: bool) -> None:
    """Retire a pending execution; its scope keeps its committed position and the next run starts fresh."""
    from contextful.engine.run.rewind import rewind

    with _store(ctx) as store:
        done = rewind(store.journal, execution_id, reason, force=force)
    if _json(ctx):
        emit_json({"execution": execution_id, "scope": done.owner.scope, "status": done.owner.status,
                   "reason": reason})
    else:
        click.echo(f"rewound execution {execution_id} on {done.owner.scope}: {reason}")


def _history(store: Store, table_name: str | None, limit: int) -> list[dict[str, Any]]:
    """Latest row per run (commit over plan), with the run's downgrade events from its manifest."""
    latest: dict[str, dict[str, Any]] = {}
    for row in store.runs.history().to_pylist():  # one row per run phase: bounded by run count
        if table_name is not None and row["table_name"] != table_name:
            continue
        if row["run_id"] not in latest or row["phase"] == "commit":
            latest[row["run_id"]] = row
    runs = sorted(latest.values(), key=lambda r: r["recorded_at"])[-limit:]
    out = []
    tables = set(store.table_names(include_reserved=True))  # a dropped table's runs keep no manifest
    for row in runs:
        events: list[dict[str, Any]] = []
        if row["phase"] == "commit" and row["table_name"] in tables:
            events = [e.to_json() for e in store.table(row["table_name"]).manifest(row["run_id"]).downgrade_events]
        out.append({"run_id": row["run_id"], "table": row["table_name"], "kind": row["kind"],
                    "status": row["status"], "recorded_at": row["recorded_at"], "commit_seq": row["commit_seq"],
                    "rows": row["rows"], "downgrade_events": events})
    return out


def register(cli: click.Group) -> None:
    from contextful.engine.cli.build import build
    from contextful.engine.cli.export import export
    from contextful.engine.cli.init import init
    from contextful.engine.cli.pipeline import pipeline
    from contextful.engine.cli.table import table

    for command in (init, sql, table, store_group, run, pipeline, build, export):
        cli.add_command(command)
