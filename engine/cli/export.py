"""``contextful export run|status``: the manifest's Iceberg exports from the terminal (docs/exports.md)."""

from __future__ import annotations

import click

from engine.cli.output import emit_json, emit_rows


@click.group()
def export() -> None:
    """Run the manifest's Iceberg exports and show their state."""


@export.command("run")
@click.argument("names", nargs=-1)
@click.pass_context
def export_run(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Run exports (default: all): each replaces its Iceberg table's rows with its source's."""
    from engine.cli.pipeline import _manifest, _store
    from engine.export.run import run_exports

    manifest = _manifest(ctx)
    known = {e.name for e in manifest.exports}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"no export {', '.join(map(repr, unknown))} (declared: {', '.join(sorted(known))})",
                                 param_hint="NAME")
    with _store(ctx, manifest) as store:
        results = run_exports(store, manifest, list(names) or None)
    if ctx.obj["json"]:
        emit_json([r.to_json() for r in results])
        return
    for r in results:
        src = r.source
        what = f"model {src['name']} build {src['build_id']}" if src["kind"] == "model" else \
            f"table {src['name']}@{src['commit_seq']}"
        click.echo(f"{r.export}: {r.operation} snapshot {r.snapshot_id} of {r.identifier}, {r.rows:,} rows in "
                   f"{r.files} file(s) from {what}")


@export.command("status")
@click.pass_context
def export_status_command(ctx: click.Context) -> None:
    """Per export: the Iceberg table, current snapshot, source exported, rows and files."""
    from engine.cli.pipeline import _manifest
    from engine.export.run import export_status

    found = export_status(_manifest(ctx))
    if ctx.obj["json"]:
        emit_json([s.to_json() for s in found])
        return

    def source(s: dict | None) -> str:
        if s is None:
            return "-"
        return f"{s['name']} build {s['build_id']}" if s["kind"] == "model" else f"{s['name']}@{s['commit_seq']}"

    emit_rows(["export", "table", "snapshot_id", "source", "rows", "files"],
              [(s.export, s.identifier, s.snapshot_id, source(s.source), s.rows, s.files) for s in found])
