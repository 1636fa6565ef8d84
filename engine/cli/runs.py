"""``contextful run history|executions|rewind``: run records and execution owners."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.commands import _json, _store
from contextful.engine.cli.output import describe_event, emit_json, emit_rows

if TYPE_CHECKING:
    from contextful.storage import Store


@click.group()
def run() -> None:
    """Run records."""


@run.command("history")
@click.option("--table", "table_name", default=None, help="Only runs of this table.")
@click.option("--limit", default=50, show_default=True, help="Newest runs to show.")
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
    for row in runs:
        events: list[dict[str, Any]] = []
        if row["phase"] == "commit":
            events = [e.to_json() for e in store.table(row["table_name"]).manifest(row["run_id"]).downgrade_events]
        out.append({"run_id": row["run_id"], "table": row["table_name"], "kind": row["kind"],
                    "status": row["status"], "recorded_at": row["recorded_at"], "commit_seq": row["commit_seq"],
                    "rows": row["rows"], "downgrade_events": events})
    return out


