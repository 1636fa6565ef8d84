"""``contextful pipeline serve``: the project's control loop and its served face(s).

Serve runs the APPLIED version of the manifest (``contextful pipeline import`` / ``apply``;
``engine.control.apply``), never the working file: it arms the version's schedules and dispatches
due units from its pool under the deployment's cadence lease (``engine.control``; docs/control.md),
re-arming when the applied pointer moves. A node whose ``[control] url`` names a control URL polls
it when serve starts, on its ``[control] poll`` cadence and on each wake, adopting what it serves
into its snapshot directory (``engine.control.reconcile``). ``--cycle`` polls once, then does the
rest once and exits (cron's and CI's way to drive Contextful); its answer is printed in a few
lines, or as JSON under ``--json``.

It also hosts the receive source for ``receive`` pipelines (``engine.land.receive``, docs/receive.md),
the Iceberg query gateway for the manifest's exports (``engine.export.gateway``, docs/exports.md),
when an issuer key is pinned the resume route of awakeables (``engine.served.awake``,
docs/served.md), under ``[control] trigger = "external"`` the wake route (``engine.served.wake``),
and on the shared ``--http`` face the control routes (``engine.served.control``, docs/served.md) and
the operator console (``engine.served.console_routes``, docs/console.md):
all on ``--http``, or each on its own address with ``--receive-http``, ``--gateway-http`` and
``--awake-http`` (a service with no address is not served). With no applied version yet the faces
serve the working manifest and nothing is armed. Once the sockets are bound it prints on stdout
``listening on http://HOST:PORT`` for the shared address and ``listening on http://HOST:PORT
(receive)`` (or ``(gateway)``, ``(awake)``) for a service's own (the bound port when port 0 was
asked for); the control plane logs a line per fire and per outcome on stderr. It serves until
SIGTERM or SIGINT, then stops accepting, lets batches in flight answer, stops each unit's child
process group (SIGTERM, SIGKILL after 10 s), gives the cadence lease back, and exits 0.

``register_serve(pipeline)`` adds the command to the ``pipeline`` group. Until then (or to run it
alone) ``python -m engine.cli.serve --project DIR --http 127.0.0.1:0`` runs the same command.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from contextful.engine.config import Manifest
    from contextful.engine.control.fire import Answer, ControlPlane
    from contextful.storage import Store
    from contextful.storage.clock import Clock


def serve_manifest(manifest: Manifest, store_url: str | None, address: str | None, *,
                   receive_address: str | None = None, gateway_address: str | None = None,
                   awake_address: str | None = None, clock: Clock | None = None,
                   issuer_key: Path | None = None) -> None:
    """Serve the applied version (the working manifest while none is applied): its schedules
    (``engine.control``), receive pipelines, query gateway and resume route until SIGTERM or SIGINT.
    ``issuer_key`` mints each store-driven or synthesize fire its credential
    (``engine.control.fire_credentials``)."""
    from contextful.engine.control.arming import applied_armable
    from contextful.engine.control.credentials import load_signing_key
    from contextful.engine.control.daemon import Daemon, select_trigger
    from contextful.engine.control.fire import ControlPlane
    from contextful.engine.control.fire_credentials import FireIssuer, serve_fire_issuer
    from contextful.engine.control.reconcile import node_reconciler
    from contextful.engine.control.relay import check_workers, relay_launcher, serve_relay
    from contextful.engine.control.residency import enforce_residency
    from contextful.engine.land.decode import Decoder
    from contextful.engine.land.receive.spool import queue_root
    from contextful.engine.project import MANIFEST, open_project_store
    from contextful.engine.run.script_runtime import refuse_script_runtime
    from contextful.engine.served.project import serve_project
    from contextful.storage.clock import SystemClock

    refuse_script_runtime()  # topology.compose.script-runtime: checked before anything is served
    clock = clock or SystemClock()
    # a manifest built in code (no contextful.toml at its root) has no applied versions: its faces serve it
    in_file = (manifest.root / MANIFEST).is_file()
    # surface.reconcile.loopback-only: a control URL off loopback is refused here, before anything is armed
    reconciler = node_reconciler(manifest.root, store=store_url, clock=clock, say=_say) if in_file else None
    if reconciler is not None:
        reconciler.poll()  # surface.reconcile.learns-by-reading: what the source holds, before arming
    applied = applied_armable(manifest.root) if in_file else None
    served = applied if applied is not None else manifest
    enforce_residency(served, store_url)  # surface.reside.region-mismatch: before anything is bound or armed
    worker_key = check_workers(served.control.workers, served.control.relay)  # surface.dispatch.worker-key
    # surface.dispatch.fire-credential-missing and -zone: refused before anything is bound or fired
    issuer = (serve_fire_issuer(applied, issuer_key, version=applied_version(applied)) if applied
              else FireIssuer(load_signing_key(issuer_key)) if issuer_key is not None and reconciler else None)
    serves_http = address is not None
    arms = applied is not None or reconciler is not None
    trigger = select_trigger(served.control.trigger, serves_http=serves_http, say=_say) if arms else None
    if not arms and not (address or receive_address or gateway_address or awake_address):
        raise click.UsageError("nothing to serve: no applied version to schedule and no address; run "
                               "contextful pipeline import, or give --http")

    def open_store() -> Store:  # receive pipelines land batches: a writer, so it creates the store
        return open_project_store(served.root, store_url, project=served.project, create=True)

    def read_store() -> Store:  # the resume route resolves awakeables a run minted: it never creates a store
        return open_project_store(served.root, store_url, project=served.project)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    # surface.dispatch.worker-target: landing steps go to [control] workers through serve's relay
    relay_store = open_store() if worker_key is not None and arms else None  # the relay's attempts journal
    relay, relay_face = (serve_relay(served.control, worker_key, relay_store) if worker_key is not None
                         and relay_store is not None else (None, None))
    plane = (ControlPlane(served.root, open_store, store_url, clock=clock, say=_say, fire_issuer=issuer,
                          reconciler=reconciler, launcher=relay_launcher(relay, lambda: _present(plane)))
             if arms else None)
    try:
        with Decoder() as decoder:
            server = None
            if address or receive_address or gateway_address or awake_address:
                server = serve_project(served, open_store, address, queue_root=queue_root(served.root),
                                       decoder=decoder, receive_address=receive_address,
                                       gateway_address=gateway_address, awake_address=awake_address,
                                       awake_store=read_store, wake=plane if trigger == "external" else None,
                                       store_url=store_url)
            try:
                if server is not None:
                    for label, face in server.faces.items():
                        click.echo(f"listening on {face.url}" + (f" ({label})" if label else ""))
                sys.stdout.flush()
                if applied is None and reconciler is None:
                    _say("no applied version: nothing armed (contextful pipeline import claims v1 from contextful.toml)")
                elif applied is None:
                    _say("no applied version yet: nothing armed until a poll adopts one")
                if plane is not None:
                    Daemon(plane, trigger, stop, say=_say).run()
                else:
                    while not stop.wait(0.5):  # a timed wait: the signal handler runs between waits
                        pass
            finally:
                if server is not None:
                    server.shutdown()
    finally:
        if plane is not None:
            plane.close()
        if relay_face is not None:
            relay_face.shutdown(5)
        if relay_store is not None:
            relay_store.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_cycle(manifest: Manifest, store_url: str | None, *, as_json: bool, clock: Clock | None = None,
                issuer_key: Path | None = None) -> int:
    """``pipeline serve --cycle``: one cycle of the applied version; print its answer; the exit status."""
    from contextful.engine.cli.output import emit_json
    from contextful.engine.control.apply import snapshot_dir
    from contextful.engine.control.arming import applied_armable
    from contextful.engine.control.fire import ControlPlane
    from contextful.engine.control.fire_credentials import serve_fire_issuer
    from contextful.engine.control.reconcile import node_reconciler
    from contextful.engine.control.relay import check_workers, relay_launcher, serve_relay
    from contextful.engine.control.residency import enforce_residency
    from contextful.engine.control.source import resolve_source
    from contextful.engine.project import open_project_store
    from contextful.engine.run.script_runtime import refuse_script_runtime
    from contextful.storage.clock import SystemClock
    from contextful.storage.errors import StoreNotInitialized

    refuse_script_runtime()
    resolve_source(manifest.control)  # surface.fire.cycle-control-source: before anything is armed
    reconciler = node_reconciler(manifest.root, store=store_url, clock=clock or SystemClock(), say=_say)
    if reconciler is not None:
        reconciler.poll()  # surface.reconcile.learns-by-reading: once, before the cycle arms
    applied = applied_armable(manifest.root)
    if applied is None:
        raise StoreNotInitialized(manifest.project.name, str(snapshot_dir(manifest.root).path))
    served = applied
    enforce_residency(served, store_url)  # surface.reside.region-mismatch: before anything is armed
    worker_key = check_workers(served.control.workers, served.control.relay)  # surface.dispatch.worker-key
    issuer = serve_fire_issuer(served, issuer_key, version=applied_version(served))

    def open_store() -> Store:
        return open_project_store(served.root, store_url, project=served.project, create=True)

    relay_store = open_store() if worker_key is not None else None  # the relay's attempts journal
    relay, relay_face = (serve_relay(served.control, worker_key, relay_store) if relay_store is not None
                         and worker_key is not None else (None, None))
    stop_previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM,)}
    try:
        plane: ControlPlane | None = None
        plane = ControlPlane(served.root, open_store, store_url, clock=clock, say=_say, fire_issuer=issuer,
                             launcher=relay_launcher(relay, lambda: _present(plane)))
        answer = plane.cycle()
    finally:
        if relay_face is not None:
            relay_face.shutdown(5)
        if relay_store is not None:
            relay_store.close()
        for sig, handler in stop_previous.items():
            signal.signal(sig, handler)
    if as_json:
        emit_json(answer.to_json())
    else:
        for line in describe_answer(answer):
            click.echo(line)
    return 0 if answer.ok else 1


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # unwinds the cycle: its close() stops the children and gives the lease back


def describe_answer(answer: Answer) -> list[str]:
    """A cycle's or a wake's answer in the few lines a person reads at a glance."""
    from contextful.engine.control.fire import rfc3339

    if answer.lease_held_by is not None:
        return [f"cadence lease held by {answer.lease_held_by}: nothing dispatched"]

    def names(items: list[str]) -> str:
        return ", ".join(items) if items else "-"

    lines = [(f"v{answer.version}: fired {names(answer.fired)}; failed {names(answer.failed)}; "
             f"pending {names(answer.pending)}"),
             f"armed {answer.armed}, next due {rfc3339(answer.next_due_us) or '-'}"]
    lines += [f"unarmed {u['pipeline']}: {u['reason']}" for u in answer.unarmed]
    lines += [f"error: {line}" for line in answer.failures]
    if answer.drained is not None:
        lines.append(f"drained {answer.drained.settled} queued batch(es)"
                     + (f", {len(answer.drained.failures)} failed" if answer.drained.failures else ""))
        lines += [f"error: drain: {line}" for line in answer.drained.failures]
    return lines


def _present(plane: ControlPlane | None) -> ControlPlane:
    """The control plane a launcher factory asks for (built by then: it arms before it launches)."""
    assert plane is not None
    return plane


def _say(line: str) -> None:
    """One log line of the control plane on stderr, stamped with the wall-clock instant."""
    from datetime import UTC, datetime

    click.echo(f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} {line}", err=True)


F = TypeVar("F", bound=Callable[..., Any])


def _addresses(command: F) -> F:
    """The address options ``serve`` and ``main`` share."""
    for option in reversed((
            click.option("--http", "address", metavar="HOST:PORT",
                         help="Address of every service without its own; port 0 picks a free port (printed)."),
            click.option("--receive-http", "receive_address", metavar="HOST:PORT",
                         help="Address of the receive routes alone (writer keys)."),
            click.option("--gateway-http", "gateway_address", metavar="HOST:PORT",
                         help="Address of the query gateway alone (reader keys)."),
            click.option("--awake-http", "awake_address", metavar="HOST:PORT",
                         help="Address of the resume route alone (signed credentials)."),
            click.option("--issuer-key", "issuer_key", metavar="PATH", default=None,
                         type=click.Path(dir_okay=False, path_type=Path),
                         help="Issuer private key (contextful key generate): mint each store-driven or synthesize "
                              "fire a credential of its own (600 s, or [project.zone] ceiling when lower)."))):
        command = option(command)
    return command


@click.command()
@_addresses
@click.option("--cycle", is_flag=True,
              help="Arm the applied version, fire what is due once, wait for it, drain the queue, print the "
                   "answer and exit (non-zero when a unit or the drain failed): how cron or CI drives Contextful.")
@click.pass_context
def serve(ctx: click.Context, address: str | None, receive_address: str | None, gateway_address: str | None,
          awake_address: str | None, issuer_key: Path | None, cycle: bool) -> None:
    """Run the applied version's schedules, and serve 'receive' pipelines, the query gateway, the resume
    route and (trigger = "external") POST /wake over HTTP."""
    from contextful.engine.config import load_manifest

    manifest = load_manifest(ctx.obj["project"])
    if cycle:
        if address or receive_address or gateway_address or awake_address:
            raise click.UsageError("--cycle serves nothing over HTTP: give no address")
        ctx.exit(serve_cycle(manifest, ctx.obj["store"], as_json=bool(ctx.obj.get("json")), issuer_key=issuer_key))
    serve_manifest(manifest, ctx.obj["store"], address, receive_address=receive_address,
                   gateway_address=gateway_address, awake_address=awake_address, issuer_key=issuer_key)


def register_serve(pipeline_group: click.Group) -> None:
    """Add ``serve`` to the ``pipeline`` command group."""
    pipeline_group.add_command(serve)


@click.command()
@click.option("--store", "store_url", envvar="CONTEXTFUL_STORE", default=None,
              help="Store root (path or fsspec URL). Default: the project's store.")
@click.option("--project", "project_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Project directory (holding contextful.toml).")
@_addresses
@click.pass_context
def main(ctx: click.Context, store_url: str | None, project_dir: str, address: str | None,
         receive_address: str | None, gateway_address: str | None, awake_address: str | None,
         issuer_key: Path | None) -> None:
    """``contextful pipeline serve``, runnable alone as ``python -m engine.cli.serve``."""
    from contextful.engine.cli.errors import one_line_errors

    ctx.obj = {"store": store_url, "project": project_dir, "json": False}
    with one_line_errors(ctx.obj):
        ctx.invoke(serve, address=address, receive_address=receive_address, gateway_address=gateway_address,
                   awake_address=awake_address, issuer_key=issuer_key, cycle=False)


if __name__ == "__main__":
    main(prog_name="contextful pipeline serve")


def applied_version(manifest: Manifest) -> int:
    """The number of the applied version ``manifest`` was read from."""
    assert manifest.applied is not None, "read from an applied version (engine.control.apply.load_version)"
    return manifest.applied.version
