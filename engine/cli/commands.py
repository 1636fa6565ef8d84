"""The inspection commands: ``sql``, ``table list|show|load|fold``, ``store collect``, ``run history``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.output import (
    describe_event,
    emit_json,
    emit_pairs,
    emit_rows,
    end_progress,
    progress_line,
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


@click.group()
def table() -> None:
    """Inspect and load store tables."""


@table.command("list")
@click.option("--all", "include_reserved", is_flag=True, help="Include reserved tables such as _runs.")
@click.pass_context
def table_list(ctx: click.Context, include_reserved: bool) -> None:
    """Every table with its head commit, parts and stored rows."""
    with _store(ctx) as store:
        rows = []
        snaps = store.snapshots(store.table_names(include_reserved=include_reserved))  # one point for all
        for name, snap in snaps.items():
            rows.append({"table": name, "commit_seq": snap.commit_seq, "parts": len(snap.parts),
                         "rows_stored": snap.rows_stored, "primary_key": list(snap.primary_key)})
    if _json(ctx):
        emit_json(rows)
    else:
        emit_rows(["table", "commit_seq", "parts", "rows_stored", "primary_key"],
                  [(r["table"], r["commit_seq"], r["parts"], r["rows_stored"], ",".join(r["primary_key"]) or "-")  # type: ignore[arg-type]
                   for r in rows])


@table.command("show")
@click.argument("name")
@click.pass_context
def table_show(ctx: click.Context, name: str) -> None:
    """A table's schema, commits and row count."""
    from contextful.storage.clock import from_us

    with _store(ctx) as store:
        t = store.table(name)
        snap = t.snapshot()
        info: dict[str, Any] = {
            "table": name,
            "uuid": t.head.uuid,
            "commit_seq": snap.commit_seq,
            "primary_key": list(t.primary_key),
            "order_by": t.head.order_by,
            "rows": t.count(),
            "parts": len(snap.parts),
            "schema": [{"name": f.name, "type": str(f.type)} for f in (snap.schema or [])],
            "commits": [{"commit_seq": c.commit_seq, "run_id": c.run_id, "kind": c.kind, "rows": c.rows,
                         "committed_at": from_us(c.committed_us).isoformat()} for c in t.commits()],
        }
    if _json(ctx):
        emit_json(info)
        return
    emit_pairs([("table", name), ("uuid", info["uuid"]), ("commit_seq", str(info["commit_seq"])),
                ("primary key", ",".join(info["primary_key"]) or "-"), ("order by", info["order_by"] or "-"),
                ("rows", str(info["rows"])),
                ("parts", str(info["parts"]))])
    click.echo("\nschema")
    emit_rows(["column", "type"], [(c["name"], c["type"]) for c in info["schema"]])
    click.echo("\ncommits")
    emit_rows(["commit_seq", "run_id", "kind", "rows", "committed_at"],
              [(c["commit_seq"], c["run_id"], c["kind"], c["rows"], c["committed_at"]) for c in info["commits"]])


@table.command("load")
@click.argument("name")
@click.argument("file")
@click.option("--primary-key", default="", help="Comma-separated key columns (fixed when the table is created).")
@click.option("--replace", is_flag=True, help="Replace every row the table answers instead of appending.")
@click.option("--format", "fmt", type=click.Choice(["csv", "ndjson", "json", "parquet"]), default=None,
              help="Input format (default: from the file name).")
@click.pass_context
def table_load(ctx: click.Context, name: str, file: str, primary_key: str, replace: bool, fmt: str | None) -> None:
    """Land one CSV, NDJSON or Parquet file (optionally gzip/zstd) as one run."""
    from contextful.engine.load import load_file

    keys = tuple(k.strip() for k in primary_key.split(",") if k.strip())
    with _store(ctx, create=True) as store:
        result = load_file(store, name, file, primary_key=keys, replace=replace, fmt=fmt,
                           progress=lambda n: progress_line(f"{name}: {n:,} rows staged"))
        end_progress()
    if _json(ctx):
        emit_json(result.to_json())
        return
    click.echo(f"{name}: run {result.run_id} committed at commit_seq {result.commit_seq}: "
               f"{result.rows:,} rows in {result.parts} part(s), {result.bytes:,} bytes")
    for event in result.downgrade_events:
        click.echo(f"  {describe_event(event.to_json())}")


@table.command("fold")
@click.argument("name")
@click.pass_context
def table_fold(ctx: click.Context, name: str) -> None:
    """Compact a table's small parts (answers stay the same)."""
    with _store(ctx) as store:
        result = store.fold(name)
    if _json(ctx):
        emit_json(None if result is None else {"table": result.table, "commit_seq": result.commit_seq,
                                               "parts_removed": result.parts_removed,
                                               "parts_added": result.parts_added})
    elif result is None:
        click.echo(f"{name}: nothing to fold")
    else:
        click.echo(f"{name}: folded {result.parts_removed} parts into {result.parts_added} at commit_seq {result.commit_seq}")


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
    for row in runs:
        events: list[dict[str, Any]] = []
        if row["phase"] == "commit":
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

    for command in (init, sql, table, store_group, run, pipeline, build, export):
        cli.add_command(command)
