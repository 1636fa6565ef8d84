"""``contextful pipeline validate|plan|run|reset|serve|key|import|apply|versions``: the manifest's pipelines from the terminal."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import click
from contextful.engine.cli.apply import register_apply
from contextful.engine.cli.output import (
    declared,
    describe_event,
    emit_issued,
    emit_json,
    emit_rows,
)
from contextful.engine.cli.progress import Reporter
from contextful.engine.cli.reset import register_reset
from contextful.engine.cli.serve import register_serve
from contextful.engine.cli.status import register_status
from contextful.engine.cli.values import at_least

if TYPE_CHECKING:
    from contextful.engine.config import Manifest
    from contextful.engine.derive.bind import MachineConfig
    from contextful.engine.land.pipeline import PipelinePlan
    from contextful.engine.land.results import Progress
    from contextful.engine.run.plan import CompiledPlan
    from contextful.storage import Store


def _manifest(ctx: click.Context) -> Manifest:
    from contextful.engine.config import load_manifest

    return load_manifest(ctx.obj["project"])


def _store(ctx: click.Context, manifest: Manifest, *, create: bool = False) -> Store:
    """The store of ``--store``, else the manifest's project's; only a writer passes ``create``."""
    from contextful.engine.project import open_project_store

    return open_project_store(manifest.root, ctx.obj["store"], project=manifest.project, create=create)


def _machine(ctx: click.Context, manifest: Manifest) -> MachineConfig:
    """The machine configuration ``--machine`` (or CONTEXTFUL_MACHINE, or the default file) names."""
    from contextful.engine.derive.bind import load_machine

    return load_machine(manifest.root, ctx.obj.get("machine"))


def _compiled(manifest: Manifest) -> CompiledPlan:
    """The plan :func:`load_manifest` compiled (it compiles one for every manifest it returns)."""
    if manifest.plan is None:
        raise RuntimeError("a manifest load_manifest returned carries its compiled plan")
    return manifest.plan


def _check_ids(manifest: Manifest, ids: tuple[str, ...]) -> list[str] | None:
    known = {p.id for p in manifest.pipelines}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise click.BadParameter(f"no pipeline {', '.join(map(repr, unknown))} ({declared(known)})",
                                 param_hint="ID")
    return list(ids) or None


@click.group()
def pipeline() -> None:
    """Validate, plan and run the manifest's pipelines."""


@pipeline.command()
@click.pass_context
def validate(ctx: click.Context) -> None:
    """Check contextful.toml; print every problem, each by its spec error."""
    from contextful.engine.cli.errors import validated_or_reported

    manifest = validated_or_reported(ctx)
    from contextful.engine.export.preflight import caller_sql_warnings
    from contextful.engine.land.files import unmatched_warnings
    from contextful.engine.land.http import rereads_warning

    rereads = [rereads_warning(p.id, p.source.kind, p.incremental) for p in manifest.pipelines]
    unmatched = [w for p in manifest.pipelines if p.source.kind == "files"
                 for w in unmatched_warnings(p.id, p.source.config, manifest.root)]
    warnings = caller_sql_warnings(manifest.exports) + [w for w in rereads if w] + unmatched
    compiled = _compiled(manifest)
    if ctx.obj["json"]:
        emit_json({"ok": True, "pipelines": [p.id for p in manifest.pipelines], "warnings": warnings,
                   "plan_reference": compiled.reference})
    else:
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        click.echo(f"{manifest.root / 'contextful.toml'}: ok, {len(manifest.pipelines)} pipeline(s), "
                   f"plan {compiled.reference}")


@pipeline.command()
@click.argument("ids", nargs=-1)
@click.pass_context
def plan(ctx: click.Context, ids: tuple[str, ...]) -> None:
    """What a run would pull and land, without running it; --json adds the compiled plan and its hash."""
    from contextful.engine.land.pipeline import plan_pipeline
    from contextful.storage.errors import StoreNotFound

    manifest = _manifest(ctx)
    selected = _check_ids(manifest, ids)
    try:
        store = _store(ctx, manifest)
    except StoreNotFound:  # nothing has run yet: plan against an empty store, and create none
        plans = [plan_pipeline(None, manifest, spec) for spec in manifest.in_dependency_order(selected)]
    else:
        with store:
            plans = [plan_pipeline(store, manifest, spec) for spec in manifest.in_dependency_order(selected)]
    if ctx.obj["json"]:  # the compiled plan whole (the reference pins every unit), each pipeline's pull
        emit_json({**_compiled(manifest).to_json(), "pipelines": [p.to_json() for p in plans]})
        return
    for p in plans:
        _print_plan(p)
    from contextful.engine.land.http import rereads_warning

    for spec in manifest.in_dependency_order(selected):
        if (warning := rereads_warning(spec.id, spec.source.kind, spec.incremental)) is not None:
            click.echo(f"warning: {warning}", err=True)
    for p in plans:
        for item in p.changed:
            click.echo(f"warning: pipeline {p.pipeline!r}: input {item.path} changed since it landed; a run fails "
                       "it with InputChanged", err=True)


PLAN_INPUTS_SHOWN = 5
"""Inputs to pull a plan's text names before it gives the count of the rest (``--json`` lists all)."""


def _print_plan(p: PipelinePlan) -> None:
    """What ``--json`` says of one pipeline's plan, in words."""
    import json

    click.echo(f"{p.pipeline} -> {p.table} ({p.source})")
    if p.source == "files":
        size = sum(i.size - i.offset for i in p.pull)
        click.echo(f"  inputs to pull: {len(p.pull)} ({size:,} bytes)")
        for item in p.pull[:PLAN_INPUTS_SHOWN]:
            start = f", from byte {item.offset:,}" if item.offset else ""
            click.echo(f"    {item.path} ({item.size - item.offset:,} bytes{start})")
        if len(p.pull) > PLAN_INPUTS_SHOWN:
            click.echo(f"    … and {len(p.pull) - PLAN_INPUTS_SHOWN:,} more (--json lists every one)")
        click.echo(f"  already landed: {len(p.skip)}")
        for item in p.changed:
            click.echo(f"  changed since it landed: {item.path}")
    elif p.source == "http":
        position = json.dumps(p.position) if p.position is not None else "none (a first run starts from the beginning)"
        click.echo(f"  stored position: {position}")
        click.echo(f"  first request: {p.first_request}")
        click.echo("  rereads all: " + ("yes, every run reads the whole source (no incremental field)"
                                        if p.rereads_all else "no"))
    elif p.source == "derive":
        click.echo(f"  derives the outstanding units of what it reads: `contextful pipeline run --dry-run {p.pipeline}` "
                   "counts them")
    else:
        click.echo("  nothing to pull: senders push batches to it (contextful pipeline serve)")


@pipeline.command()
@click.argument("ids", nargs=-1)
@click.option("--checkpoint-mib", type=float, default=512, show_default=True, callback=at_least(0, "MiB"),
              help="Commit and keep pulling once this much is staged.")
@click.option("--dry-run", is_flag=True,
              help="Run nothing: print what each pipeline would do (a derive pipeline: its eligible, already-derived "
                   "and outstanding units, from one selection, calling no engine).")
@click.pass_context
def run(ctx: click.Context, ids: tuple[str, ...], checkpoint_mib: float, dry_run: bool) -> None:
    """Run pipelines (default: all, in dependency order; a derive pipeline runs after the pipelines it
    reads, on their run)."""
    from contextful.engine.run.script_runtime import refuse_script_runtime
    from contextful.engine.run.units import run_pipelines
    from contextful.storage.lazy import spare_pandas

    refuse_script_runtime()  # before the store opens: a refused environment writes nothing
    spare_pandas()
    manifest = _manifest(ctx)
    selected = _check_ids(manifest, ids)
    if dry_run:
        _dry_run(ctx, manifest, selected)
        return
    machine = None
    if any(p.source.kind == "derive" for p in manifest.pipelines):
        from contextful.engine.derive.run import check_tiers

        machine = _machine(ctx, manifest)
        if problems := check_tiers(manifest.in_dependency_order(selected), machine):
            raise problems[0]  # before the store opens: a derive tier that cannot run arms nothing

    with Reporter(enabled=not ctx.obj["json"]) as reporter, _store(ctx, manifest, create=True) as store:
        results = run_pipelines(store, manifest, selected, checkpoint_bytes=int(checkpoint_mib * 2**20),
                                progress=None if ctx.obj["json"] else partial(_show_progress, reporter),
                                machine=machine)
    if ctx.obj["json"]:
        emit_json([r.to_json() for r in results])
    else:
        _print_results(results)
    failed = [f for r in results for f in r.failures]
    if failed:
        ctx.exit(failed[0].exit_code)


def _show_progress(reporter: Reporter, p: Progress) -> None:
    """One pipeline run's progress line (docs/cli.md): units of a derive run; inputs and, within the
    input being landed, bytes read of the run's bytes (the fraction a plain log's lines follow); pages."""
    if p.unit == "units":
        rate = p.done / max(p.seconds, 1e-9)
        reporter.show(f"{p.pipeline}: {p.done:,}/{p.total or 0:,} units, {p.failed:,} failed, {p.rows:,} rows, "
                      f"{rate:,.1f} units/s", done=p.done / p.total if p.total else None)
        return
    rate = p.bytes_read / max(p.seconds, 1e-9) / 2**20
    share = p.bytes_read / p.bytes_total if p.bytes_total else None
    if not p.closes:
        percent = f" ({share:.0%})" if share is not None else ""
        if p.scanning:
            reporter.show(f"{p.pipeline}: input {p.done + 1:,}/{p.total or 0:,}: scanning column types, "
                          f"{p.bytes_read / 2**20:,.1f} MiB{percent}")
            return
        of = f" of {p.bytes_total / 2**20:,.1f}" if p.bytes_total is not None else ""
        reporter.show(f"{p.pipeline}: input {p.done + 1:,}/{p.total or 0:,}: {p.bytes_read / 2**20:,.1f}{of} MiB "
                      f"read{percent}, {rate:,.1f} MiB/s", done=share)
        return
    unit = p.unit if p.done != 1 or p.total is not None else p.unit.removesuffix("s")
    done = f"{p.done:,}/{p.total:,} {unit}" if p.total is not None else f"{p.done:,} {unit}"
    moved = "read" if p.unit == "inputs" else "staged"
    reporter.show(f"{p.pipeline}: {done}, {p.rows:,} rows, {p.bytes_read / 2**20:,.1f} MiB {moved},"
                  f" {p.tables} table(s), {rate:,.1f} MiB/s", done=share, closes=p.unit == "inputs")


def _dry_run(ctx: click.Context, manifest: Manifest, selected: list[str] | None) -> None:
    """``run.select.dry-run``: what a run would do, running nothing and creating no store."""
    from contextful.engine.derive.run import dry_run
    from contextful.engine.land.pipeline import plan_pipeline
    from contextful.storage.errors import StoreNotFound

    specs = manifest.in_dependency_order(selected)
    machine = _machine(ctx, manifest) if any(p.source.kind == "derive" for p in specs) else None
    try:
        store: Store | None = _store(ctx, manifest)
    except StoreNotFound:
        store = None
    out: list[dict[str, Any]] = []
    try:
        for spec in specs:
            if spec.source.kind == "derive":
                assert machine is not None
                counts = dry_run(store, manifest, spec, machine)
                out.append({"pipeline": spec.id, "table": spec.table, "source": "derive", **counts.to_json()})
                if not ctx.obj["json"]:
                    click.echo(f"{spec.id} -> {spec.table} (derive): {counts.eligible:,} eligible, "
                               f"{counts.derived:,} already derived, {counts.outstanding:,} outstanding, "
                               f"{counts.retiring:,} to retire (parent gone)")
            else:
                planned = plan_pipeline(store, manifest, spec)
                out.append(planned.to_json())
                if not ctx.obj["json"]:
                    _print_plan(planned)
    finally:
        if store is not None:
            store.close()
    if ctx.obj["json"]:
        emit_json(out)


def _print_results(results: list[Any]) -> None:
    for r in results:
        for t in r.tables if r.ok else [t for t in r.tables if t.run_ids]:  # a failed run: only what committed
            source = (f"{r.pulls} request(s)" if r.pulls else
                      f"{r.derive['done']:,} unit(s) derived" if r.derive is not None else
                      f"{len(r.inputs_landed)} input(s) landed, {r.inputs_skipped} already landed")
            click.echo(f"{r.pipeline} -> {t.table}: {t.rows:,} rows in {t.parts} part(s), {t.bytes:,} bytes,"
                       f" {source}, {len(t.run_ids)} commit(s) in {r.seconds:.1f}s")
            for e in t.downgrade_events:
                click.echo(f"  {describe_event(e.to_json())}")
            if t.masked_cells:
                shown = ", ".join(f"{column} ({n:,})" for column, n in sorted(t.masked_cells.items()))
                click.echo(f"  secret guard masked {sum(t.masked_cells.values()):,} cell(s): {shown}")
        if r.derive is not None:
            d = r.derive
            click.echo(f"  units: {d['outstanding']:,} outstanding of {d['eligible']:,}; {d['ok']:,} ok, "
                       f"{d['empty']:,} empty, {d['unavailable']:,} unavailable, {d['failed']:,} failed"
                       + (f", {d['replayed']:,} answered before a restart" if d['replayed'] else "")
                       + (f"; {d['retired']:,} retired (parent gone)" if d['retired'] else ""))
        for hit in r.bound_hits:
            click.echo(f"  bound hit: {hit['step']}, attempt {hit['attempt']}: {hit['bound']}")
        for note in r.notes:
            click.echo(f"  {note}")
        for warning in r.warnings:
            click.echo(f"warning: {warning}", err=True)
        for f in r.failures:
            click.echo(f"error: {f.error}: {f.detail}", err=True)
        if r.failures_not_shown:
            click.echo(f"  and {r.failures_not_shown:,} more failed unit(s): each marker row holds its error "
                       f"(last_error)", err=True)


@pipeline.group("key")
def key() -> None:
    """Writer keys: how a sender proves it may push batches to 'receive' pipelines."""


@key.command("issue")
@click.argument("pipelines", nargs=-1, required=True)
@click.pass_context
def key_issue(ctx: click.Context, pipelines: tuple[str, ...]) -> None:
    """Mint a writer key for PIPELINES ('receive' pipelines); printed once, stored hashed."""
    from contextful.engine.land.receive import writers

    manifest = _manifest(ctx)
    receiving = sorted(p.id for p in manifest.pipelines if p.source.kind == "receive")
    unknown = [p for p in pipelines if p not in receiving]
    if unknown:
        raise click.BadParameter(f"no receive pipeline {', '.join(map(repr, unknown))} (receive pipelines: "
                                 f"{', '.join(receiving) or 'none'})", param_hint="PIPELINES")
    issued = writers.issue(manifest.root, list(pipelines))
    emit_issued(ctx, issued, f"writer key {issued.key.key_id} for {', '.join(issued.key.pipelines)}")


@key.command("list")
@click.pass_context
def key_list(ctx: click.Context) -> None:
    """Every writer key (revoked ones too); never the secrets."""
    from contextful.engine.land.receive import writers

    keys = writers.list_keys(_manifest(ctx).root)
    if ctx.obj["json"]:
        emit_json([k.public() for k in keys])
        return
    emit_rows(["key_id", "pipelines", "created_at", "revoked_at"],
              [(k.key_id, ", ".join(k.pipelines), k.created_at, k.revoked_at or "-") for k in keys])


@key.command("revoke")
@click.argument("key_id")
@click.pass_context
def key_revoke(ctx: click.Context, key_id: str) -> None:
    """Revoke a writer key; the receive routes refuse it from the next request on."""
    from contextful.engine.land.receive import writers

    try:
        revoked = writers.revoke(_manifest(ctx).root, key_id)
    except KeyError:
        raise click.BadParameter(f"no writer key {key_id!r} (see `contextful pipeline key list`)",
                                 param_hint="KEY_ID") from None
    click.echo(f"writer key {revoked.key_id} ({', '.join(revoked.pipelines)}) revoked at {revoked.revoked_at}")


register_serve(pipeline)
register_apply(pipeline)
register_status(pipeline)
register_reset(pipeline)
