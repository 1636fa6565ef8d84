"""``contextful export run|status|group|rebuild|checkpoint|restore``: the manifest's Iceberg exports and coordinated publications from
the terminal (docs/exports.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from contextful.engine.cli.output import declared, emit_issued, emit_json, emit_rows

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.store import Store

T = TypeVar("T")


@click.group()
def export() -> None:
    """Run the manifest's Iceberg exports and show their state."""


@export.command("run")
@click.argument("names", nargs=-1)
@click.pass_context
def export_run(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Run exports (default: all): each replaces its Iceberg table's rows with its source's."""
    from contextful.engine.cli.pipeline import _manifest, _store
    from contextful.engine.cli.progress import Reporter
    from contextful.engine.export.run import ExportProgress, run_exports

    manifest = _manifest(ctx)
    known = {e.name for e in manifest.exports}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"no export {', '.join(map(repr, unknown))} ({declared(known)})",
                                 param_hint="NAME")
    def show(p: ExportProgress) -> None:
        reporter.show(f"{p.export}: {p.rows:,} rows written, {p.rows / max(p.seconds, 1e-9):,.0f} rows/s")

    with Reporter(enabled=not ctx.obj["json"]) as reporter, _store(ctx, manifest) as store:
        results = run_exports(store, manifest, list(names) or None, progress=None if ctx.obj["json"] else show)
    if ctx.obj["json"]:
        emit_json([r.to_json() for r in results])
        return
    for r in results:
        src = r.source
        what = f"model {src['name']} build {src['build_id']}" if src["kind"] == "model" else \
            f"table {src['name']}@{src['commit_seq']}"
        expired = f"; expired {len(r.expired)} old snapshot(s)" if r.expired else ""
        if r.operation == "unchanged":
            click.echo(f"{r.export}: unchanged, snapshot {r.snapshot_id} of {r.identifier} already holds {what}; "
                       f"nothing published{expired}")
            continue
        kept = (f"; kept optional (Iceberg cannot make a published optional column required): "
                f"{', '.join(r.kept_optional)}") if r.kept_optional else ""
        click.echo(f"{r.export}: {r.operation} snapshot {r.snapshot_id} of {r.identifier}, {r.rows:,} rows in "
                   f"{r.files} file(s) from {what}{expired}{kept}")


@export.command("group")
@click.argument("name")
@click.pass_context
def export_group_command(ctx: click.Context, name: str) -> None:
    """Stage (or resume) publication NAME's next group and deliver it to its receiver."""
    from contextful.engine.export.publications.sender import export_group

    done = _on_publication(ctx, name, lambda store, manifest: export_group(store, manifest, name))
    if ctx.obj["json"]:
        emit_json(done.to_json())
    elif done.group_id is None:
        click.echo(f"{name}: nothing new to publish; the receiver holds the producers' completed frontier")
    else:
        how = "resumed" if done.resumed else "staged"
        click.echo(f"{name}: {how} group {done.order} ({done.group_id[:12]}), delivered {done.delivered} of "
                   f"{done.events} event(s); the receiver activated it")


@export.command("rebuild")
@click.argument("name")
@click.option("--namespace", "namespace", required=True, metavar="EPOCH",
              help="the fresh receiver namespace the publication's full admitted state goes to")
@click.pass_context
def export_rebuild_command(ctx: click.Context, name: str, namespace: str) -> None:
    """Deliver publication NAME's full admitted state into the fresh namespace EPOCH (nothing executes)."""
    from contextful.engine.export.publications.rebuild import export_rebuild

    done = _on_publication(ctx, name, lambda store, manifest: export_rebuild(store, manifest, name, namespace))
    _emit(ctx, done, lambda: f"{name}: {'resumed' if done.resumed else 'staged'} rebuild group {done.order} "
          f"({(done.group_id or '')[:12]}) in namespace {namespace!r}, delivered {done.delivered} of {done.events} "
          "event(s); the receiver switched to it")


@export.command("checkpoint")
@click.argument("name")
@click.option("--to", "to", required=True, type=click.Path(dir_okay=False), help="the checkpoint file to write")
@click.pass_context
def export_checkpoint_command(ctx: click.Context, name: str, to: str) -> None:
    """Save publication NAME's delivery state (staged groups, their events, acknowledgements) to a file."""
    from pathlib import Path

    from contextful.engine.export.publications.checkpoint import save_checkpoint

    done = _on_publication(ctx, name, lambda store, manifest: save_checkpoint(store, manifest, name, Path(to)))
    _emit(ctx, done, lambda: f"{name}: saved {done.groups} group(s), {done.events} event(s) to {done.path}")


@export.command("restore")
@click.argument("name")
@click.option("--from", "source", required=True, type=click.Path(dir_okay=False),
              help="a checkpoint file `export checkpoint` wrote")
@click.pass_context
def export_restore_command(ctx: click.Context, name: str, source: str) -> None:
    """Load a compatible checkpoint of publication NAME and replay its events to the receiver."""
    from pathlib import Path

    from contextful.engine.export.publications.checkpoint import restore_checkpoint

    done = _on_publication(ctx, name,
                           lambda store, manifest: restore_checkpoint(store, manifest, name, Path(source)))
    _emit(ctx, done, lambda: f"{name}: restored {done.groups} group(s) from {done.path}, replayed {done.events} "
          "event(s); the receiver kept its active group")


def _on_publication(ctx: click.Context, name: str, call: Callable[[Store, Manifest], T]) -> T:
    """``call(store, manifest)`` for publication NAME, once it is declared and the storage profile keeps
    a coordinated-group outbox (``run.export.group-storage``: checked before the store opens, so nothing
    is read, staged or delivered), under the publication's exclusive hold: serve's units writing its
    inputs wait and are waited for (``surface.dispatch.export-quiesced``, ``export-claim``), and on D1
    the hold is the lease every sender write predicates on (``run.export.group-d1-lease``)."""
    from contextful.engine.cli.pipeline import _manifest, _store
    from contextful.engine.export.publications.holds import held
    from contextful.engine.export.publications.sender import check_profile, publication

    manifest = _manifest(ctx)
    publication(manifest, name)
    check_profile(name)
    with _store(ctx, manifest) as store, held(store, name):
        return call(store, manifest)


def _emit(ctx: click.Context, done: Any, text: Callable[[], str]) -> None:
    """``done.to_json()`` under ``--json``, else ``text()``."""
    if ctx.obj["json"]:
        emit_json(done.to_json())
    else:
        click.echo(text())


@export.command("status")
@click.pass_context
def export_status_command(ctx: click.Context) -> None:
    """Per export: the Iceberg table, current snapshot, source exported, rows and files."""
    from contextful.engine.cli.pipeline import _manifest
    from contextful.engine.export.run import export_status

    found = export_status(_manifest(ctx))
    if ctx.obj["json"]:
        emit_json([s.to_json() for s in found])
        return

    for s in found:  # what --json says, in words: a block per export
        click.echo(f"{s.export}: {s.identifier} (credential {s.credential})")
        if s.snapshot_id is None:
            click.echo("  snapshot: none yet (run `contextful export run`)")
            continue
        click.echo(f"  snapshot: {s.snapshot_id}")
        click.echo(f"  source read: {_source_read(s.source)}")
        click.echo(f"  rows: {_count(s.rows)}, files: {_count(s.files)}")


def _source_read(source: dict[str, Any] | None) -> str:
    """What the current snapshot holds, in words."""
    if source is None:
        return "unknown (another writer committed the current snapshot)"
    if source["kind"] == "model":
        return f"model {source['name']} build {source['build_id']}"
    return f"table {source['name']} at commit_seq {source['commit_seq']}"


def _count(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


@export.group("key")
def key() -> None:
    """Reader keys: how a reader proves an export's credential to the query gateway."""


@key.command("issue")
@click.argument("credential")
@click.pass_context
def key_issue(ctx: click.Context, credential: str) -> None:
    """Mint a reader key for CREDENTIAL (an [[export]]'s credential); printed once, stored hashed."""
    from contextful.engine.cli.pipeline import _manifest
    from contextful.engine.export import readers
    from contextful.engine.export.preflight import preflight
    from contextful.storage.errors import ReaderCredentialUnadmitted

    manifest = _manifest(ctx)
    admitted = preflight(manifest)
    if credential not in admitted:
        raise ReaderCredentialUnadmitted(
            f"credential {credential!r} is admitted by no [[export]] ({declared(admitted)})")
    issued = readers.issue(manifest.root, credential)
    emit_issued(ctx, issued, f"reader key {issued.key.key_id} for credential {credential!r}")


@key.command("list")
@click.pass_context
def key_list(ctx: click.Context) -> None:
    """Every reader key (revoked ones too); never the secrets."""
    from contextful.engine.cli.pipeline import _manifest
    from contextful.engine.export import readers

    keys = readers.list_keys(_manifest(ctx).root)
    if ctx.obj["json"]:
        emit_json([k.public() for k in keys])
        return
    emit_rows(["key_id", "credential", "created_at", "revoked_at"],
              [(k.key_id, k.credential, k.created_at, k.revoked_at or "-") for k in keys])


@key.command("revoke")
@click.argument("key_id")
@click.pass_context
def key_revoke(ctx: click.Context, key_id: str) -> None:
    """Revoke a reader key; the gateway refuses it from the next request on."""
    from contextful.engine.cli.pipeline import _manifest
    from contextful.engine.export import readers

    try:
        revoked = readers.revoke(_manifest(ctx).root, key_id)
    except KeyError:
        raise click.BadParameter(f"no reader key {key_id!r} (see `contextful export key list`)",
                                 param_hint="KEY_ID") from None
    click.echo(f"reader key {revoked.key_id} ({revoked.credential!r}) revoked at {revoked.revoked_at}")
