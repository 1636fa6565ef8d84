"""``contextful run history|show|executions|cancel|rewind``: run records and execution owners."""

from __future__ import annotations

import click
from contextful.engine.cli.commands import _json, _store
from contextful.engine.cli.output import describe_event, emit_json, emit_pairs, emit_rows
from contextful.engine.cli.values import at_least


@click.group()
def run() -> None:
    """Run records."""


@run.command("history")
@click.option("--table", "table_name", default=None, help="Only runs of this table.")
@click.option("--limit", default=50, show_default=True, callback=at_least(1, "runs"), help="Newest runs to show.")
@click.pass_context
def run_history(ctx: click.Context, table_name: str | None, limit: int) -> None:
    """Runs from _runs, newest last: committed, failed, canceled or interrupted (with the error) or planned, and
    downgrade events."""
    from contextful.engine.run.records import run_history as history

    with _store(ctx) as store:
        runs = history(store, table_name, limit)
    if _json(ctx):
        emit_json(runs)
        return
    emit_rows(["run_id", "table", "kind", "status", "recorded_at", "commit_seq", "rows", "events"],
              [(r["run_id"], r["table"], r["kind"], r["status"], r["recorded_at"], _or_dash(r["commit_seq"]),
                _or_dash(r["rows"]), len(r["downgrade_events"])) for r in runs])
    for r in runs:
        for e in r["downgrade_events"]:
            click.echo(f"  {r['run_id']} {describe_event(e)}")
        if r["failure"] is not None:
            click.echo(f"  {r['run_id']} {r['status']}: {_failure_line(r['failure'])}")


@run.command("show")
@click.argument("run_id")
@click.pass_context
def run_show(ctx: click.Context, run_id: str) -> None:
    """One run whole: inputs, rows and bytes per table, downgrade events, masked cells, error."""
    from contextful.engine.run.records import run_detail

    with _store(ctx) as store:
        run = run_detail(store, run_id)
    if _json(ctx):
        emit_json(run)
        return
    emit_pairs([("run", run["run_id"]), ("table", run["table"]), ("kind", run["kind"]), ("status", run["status"]),
                ("made by", run["origin"] or "-"), ("planned at", run["planned_at"] or "-"),
                ("finished at", run["finished_at"] or "-"), ("commit_seq", _or_dash(run["commit_seq"]))])
    if run["failure"] is not None:
        click.echo(f"error: {_failure_line(run['failure'])}")
    if run["status"] != "committed":
        return
    inputs = run["inputs"]
    click.echo(f"\ninputs ({len(inputs)})")
    for name in inputs:
        click.echo(f"  {name}")
    click.echo("\ntables")
    emit_rows(["table", "run_id", "rows", "parts", "bytes"],
              [(t["table"], t["run_id"], t["rows"], t["parts"], t["bytes"]) for t in run["tables"]])
    events = run["downgrade_events"]
    click.echo(f"\ndowngrade events ({len(events)})")
    for e in events:
        click.echo(f"  {describe_event(e)}")
    masked = run["masked_cells"]
    click.echo(f"\nmasked cells ({sum(masked.values())})")
    for column, n in sorted(masked.items()):
        click.echo(f"  {column}: {n:,}")
    for hit in run["bound_hits"]:
        click.echo(f"bound hit: {hit['step']}, attempt {hit['attempt']}: {hit['bound']}")


def _or_dash(value: int | None) -> int | str:
    return "-" if value is None else value


def _failure_line(failure: dict[str, str]) -> str:
    return f"{failure['error']}: {failure['detail']}"


@run.command("executions")
@click.option("--pending", "pending_only", is_flag=True,
              help="Only executions in flight (pending): what `run cancel` and `run rewind` accept.")
@click.pass_context
def run_executions(ctx: click.Context, pending_only: bool) -> None:
    """Execution owners by scope: pending ones are in flight or hold a checkpoint and resume on the next run."""
    from contextful.engine.run.owners import Scope
    from contextful.storage.clock import from_us
    from contextful.storage.journal import PENDING

    with _store(ctx) as store:
        owners = store.journal.owners()
    rows = [{"scope": o.scope, "execution": o.execution_id, "status": o.status, "attempts": o.attempts,
             "holder": o.holder, "plan": o.plan_ref[:12], "kind": Scope.parse(o.scope).kind, "pins": o.pin_map(),
             "cancel_requested_at": None if o.cancel_requested_us is None else from_us(o.cancel_requested_us).isoformat()}
            for o in owners if not pending_only or o.status == PENDING]
    if _json(ctx):
        emit_json(rows)
        return
    columns = ["scope", "execution", "status", "attempts", "holder", "plan"]
    emit_rows([*columns, "cancel requested"],
              [(*(r[c] for c in columns), r["cancel_requested_at"] or "-") for r in rows])


@run.command("cancel")
@click.argument("run")
@click.pass_context
def run_cancel(ctx: click.Context, run: str) -> None:
    """Mark a run in flight canceled: RUN is a pending execution's id or its scope (`run executions --pending`).

    The run stops at its next pull or commit boundary: nothing it staged since its last commit
    lands, its record closes `canceled`, its position stays. Marking twice is marking once; RUN
    matching nothing pending is ``CancelTargetNotInFlight``.
    """
    from contextful.engine.run.cancel import request_cancel
    from contextful.storage.clock import from_us

    with _store(ctx) as store:
        owner = request_cancel(store.journal, run)
    assert owner.cancel_requested_us is not None
    if _json(ctx):
        emit_json({"execution": owner.execution_id, "scope": owner.scope, "status": owner.status,
                   "cancel_requested_at": from_us(owner.cancel_requested_us).isoformat()})
    else:
        click.echo(f"cancel requested for execution {owner.execution_id} on {owner.scope}: "
                   "it stops at its next pull or commit")


@run.command("rewind")
@click.argument("execution_id")
@click.option("--reason", required=True, help="Why the execution is abandoned (kept in the output).")
@click.option("--force", is_flag=True,
              help="Overrides none of the refusals: an unsafe rewind stays refused (spec run.own.rewind-unsafe).")
@click.pass_context
def run_rewind(ctx: click.Context, execution_id: str, reason: str, force: bool) -> None:
    """Retire a pending execution; its scope keeps its committed position and the next run starts fresh.

    Refused while an attempt holds the execution's lease (``ExecutionRewindUnsafe``). The spec
    (run.own.rewind-unsafe) names ``--force`` and has it override none of the refusals: a script
    passing it is refused the same way, never told an unsafe rewind happened.
    """
    from contextful.engine.run.rewind import rewind

    with _store(ctx) as store:
        done = rewind(store.journal, execution_id, reason)
    if _json(ctx):
        emit_json({"execution": execution_id, "scope": done.owner.scope, "status": done.owner.status,
                   "reason": reason})
    else:
        click.echo(f"rewound execution {execution_id} on {done.owner.scope}: {reason}")
