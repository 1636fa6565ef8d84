"""``contextful table list|show|load|fold|drop``: inspect, load and drop store tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.commands import _json, _store
from contextful.engine.cli.output import (
    describe_event,
    emit_json,
    emit_pairs,
    emit_rows,
)
from contextful.engine.cli.progress import Reporter

if TYPE_CHECKING:
    from contextful.engine.config import Manifest
    from contextful.engine.land.csv_options import CsvOptions


@click.group()
def table() -> None:
    """Inspect, load and drop store tables."""


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
@click.option("--types", default=None,
              help='Column types, as a pipeline\'s `types`: a TOML inline table, e.g. \'{id = "bigint", '
                   'amount = "decimal(10, 2)"}\' (the braces may be left out).')
@click.option("--delimiter", default=None, help="CSV: the field delimiter, one character (default: sniffed among , ; tab |).")
@click.option("--quote", default=None, help='CSV: the quote character (default "; "" for no quoting).')
@click.option("--header/--no-header", default=None,
              help="CSV: whether the first line names the columns (default yes; no: column_1, column_2, ...).")
@click.option("--encoding", default=None, help="CSV: the file's encoding, e.g. latin-1 or cp1252 (default utf-8).")
@click.option("--null-value", "null_values", multiple=True,
              help="CSV: a text read as null in every column; repeat for more (default: pyarrow's list, typed columns only).")
@click.pass_context
def table_load(ctx: click.Context, name: str, file: str, primary_key: str, replace: bool, fmt: str | None,
               types: str | None, delimiter: str | None, quote: str | None, header: bool | None,
               encoding: str | None, null_values: tuple[str, ...]) -> None:
    """Land one CSV, NDJSON or Parquet file (optionally gzip/zstd) as one run."""
    from contextful.engine.load import load_file

    keys = tuple(k.strip() for k in primary_key.split(",") if k.strip())
    given = {"delimiter": delimiter, "quote": quote, "header": header, "encoding": encoding,
             "null_values": list(null_values) or None}
    csv = _csv_options(file, fmt, {k: v for k, v in given.items() if v is not None})
    declared = _types_option(types)
    notes: list[str] = []
    with _store(ctx, create=True) as store, Reporter(enabled=not _json(ctx)) as reporter:
        result = load_file(store, name, file, primary_key=keys, replace=replace, fmt=fmt, types=declared, csv=csv,
                           notes=notes, progress=lambda n: reporter.show(f"{name}: {n:,} rows staged"))
    if _json(ctx):
        emit_json({**result.to_json(), "notes": notes})
        return
    for note in notes:
        click.echo(f"{file}: {note}")
    click.echo(f"{name}: run {result.run_id} committed at commit_seq {result.commit_seq}: "
               f"{result.rows:,} rows in {result.parts} part(s), {result.bytes:,} bytes")
    for event in result.downgrade_events:
        click.echo(f"  {describe_event(event.to_json())}")


def _types_option(text: str | None) -> dict[str, str] | None:
    """``--types`` read as the manifest reads a pipeline's ``types`` (a TOML inline table)."""
    import tomllib

    from contextful.engine.land.typed import types_problems
    from contextful.storage.errors import ArgumentInvalid

    if text is None:
        return None
    body = text.strip() if text.strip().startswith("{") else "{" + text + "}"
    try:
        types = tomllib.loads(f"types = {body}")["types"]
    except tomllib.TOMLDecodeError as exc:
        raise ArgumentInvalid("--types", text, f"not a TOML inline table of column = \"type\" ({exc})") from exc
    if problems := types_problems("--types", types):
        raise problems[0]
    return dict(types)


def _csv_options(file: str, fmt: str | None, given: dict[str, Any]) -> CsvOptions | None:
    """The CSV options given to ``table load``, read as a pipeline's are (``engine.land.csv_options``)."""
    from contextful.engine.land.csv_options import csv_options
    from contextful.engine.land.decode import detect_format
    from contextful.storage.errors import ArgumentInvalid

    options, problems = csv_options("table load", given)
    option = {"null_values": "--null-value"}
    if problems:
        key = problems[0].key
        raise ArgumentInvalid(option.get(key, f"--{key}"), given.get(key), problems[0].problem)
    if given and (fmt or detect_format(file)) != "csv":
        key = next(iter(given))
        raise ArgumentInvalid(option.get(key, f"--{key}"), given[key], f"is a CSV option; {file} is not read as CSV")
    return options


@table.command("fold")
@click.argument("name")
@click.pass_context
def table_fold(ctx: click.Context, name: str) -> None:
    """Compact a table's small parts (answers stay the same)."""
    from contextful.storage.fold import FoldProgress

    def show(p: FoldProgress) -> None:
        done = max(p.parts / p.parts_total, min(p.rows / max(p.rows_total, 1), 1.0))
        reporter.show(f"{name}: {p.parts:,}/{p.parts_total:,} parts folded, {p.rows:,} of {p.rows_total:,} rows "
                      f"written ({done:.0%})", done=done)

    with Reporter(enabled=not _json(ctx)) as reporter, _store(ctx) as store:
        result = store.fold(name, progress=show)
    if _json(ctx):
        emit_json(None if result is None else {"table": result.table, "commit_seq": result.commit_seq,
                                               "parts_removed": result.parts_removed,
                                               "parts_added": result.parts_added})
    elif result is None:
        click.echo(f"{name}: nothing to fold")
    else:
        click.echo(f"{name}: folded {result.parts_removed} parts into {result.parts_added} at commit_seq {result.commit_seq}")


@table.command("drop")
@click.argument("name")
@click.option("--force", is_flag=True, help="Drop it even though a model or an [[export]] of the manifest reads it.")
@click.pass_context
def table_drop(ctx: click.Context, name: str, force: bool) -> None:
    """Drop a table: its head, history and objects (refused while a model or export reads it)."""
    from contextful.engine.drop import drop_table

    manifest = None if force else _project_manifest(ctx)
    with _store(ctx) as store:
        result = drop_table(store, name, manifest, force=force)
    if _json(ctx):
        emit_json(result.to_json())
    else:
        click.echo(f"{name}: dropped (was at commit_seq {result.commit_seq}; {result.objects} object(s) deleted)")


def _project_manifest(ctx: click.Context) -> Manifest | None:
    """The manifest of the project the command runs in (None when no contextful.toml is found: then no
    model or export is known to read anything)."""
    from contextful.engine.config import load_manifest
    from contextful.engine.project import find_project

    if find_project(ctx.obj["project"]) is None:
        return None
    return load_manifest(ctx.obj["project"])
