"""``contextful pipeline serve --http HOST:PORT``: the project's served face(s).

It hosts the receive source for ``receive`` pipelines (``engine.land.receive``, docs/receive.md),
the Iceberg query gateway for the manifest's exports (``engine.export.gateway``, docs/exports.md)
and, when an issuer key is pinned, the resume route of awakeables (``engine.served.awake``,
docs/served.md): all on ``--http``, or each on its own address with ``--receive-http``,
``--gateway-http`` and ``--awake-http`` (a service with no address is not served). The command parses its arguments
and calls :func:`serve_manifest`. Once the sockets are bound it prints on stdout ``listening on
http://HOST:PORT`` for the shared address and ``listening on http://HOST:PORT (receive)`` (or
``(gateway)``, ``(awake)``) for a service's own (the bound port when port 0 was asked for), and serves until
SIGTERM or SIGINT, then stops accepting, lets batches in flight answer, and exits 0.

``register_serve(pipeline)`` adds the command to the ``pipeline`` group. Until then (or to run it
alone) ``python -m engine.cli.serve --project DIR --http 127.0.0.1:0`` runs the same command.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from contextful.engine.config import Manifest
    from contextful.storage import Store


def serve_manifest(manifest: Manifest, store_url: str | None, address: str | None, *,
                   receive_address: str | None = None, gateway_address: str | None = None,
                   awake_address: str | None = None) -> None:
    """Serve the manifest's receive pipelines, query gateway and resume route until SIGTERM or SIGINT."""
    from contextful.engine.land.decode import Decoder
    from contextful.engine.land.receive.spool import queue_root
    from contextful.engine.project import open_project_store
    from contextful.engine.run.script_runtime import refuse_script_runtime
    from contextful.engine.served.project import serve_project

    refuse_script_runtime()  # topology.compose.script-runtime: checked before anything is served

    def open_store() -> Store:  # receive pipelines land batches: a writer, so it creates the store
        return open_project_store(manifest.root, store_url, project=manifest.project, create=True)

    def read_store() -> Store:  # the resume route resolves awakeables a run minted: it never creates a store
        return open_project_store(manifest.root, store_url, project=manifest.project)

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with Decoder() as decoder:
            server = serve_project(manifest, open_store, address, queue_root=queue_root(manifest.root),
                                   decoder=decoder, receive_address=receive_address,
                                   gateway_address=gateway_address, awake_address=awake_address,
                                   awake_store=read_store)
            try:
                for label, face in server.faces.items():
                    click.echo(f"listening on {face.url}" + (f" ({label})" if label else ""))
                sys.stdout.flush()
                while not stop.wait(0.5):  # a timed wait: the signal handler runs between waits
                    pass
            finally:
                server.shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
                         help="Address of the resume route alone (signed credentials)."))):
        command = option(command)
    return command


@click.command()
@_addresses
@click.pass_context
def serve(ctx: click.Context, address: str | None, receive_address: str | None, gateway_address: str | None,
          awake_address: str | None) -> None:
    """Serve 'receive' pipelines' batches, the exports' query gateway and the resume route over HTTP."""
    from contextful.engine.config import load_manifest

    if not (address or receive_address or gateway_address or awake_address):
        raise click.UsageError("give --http, --receive-http, --gateway-http or --awake-http")
    serve_manifest(load_manifest(ctx.obj["project"]), ctx.obj["store"], address, receive_address=receive_address,
                   gateway_address=gateway_address, awake_address=awake_address)


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
         receive_address: str | None, gateway_address: str | None, awake_address: str | None) -> None:
    """``contextful pipeline serve``, runnable alone as ``python -m engine.cli.serve``."""
    from contextful.engine.cli.errors import one_line_errors

    ctx.obj = {"store": store_url, "project": project_dir, "json": False}
    with one_line_errors(ctx.obj):
        ctx.invoke(serve, address=address, receive_address=receive_address, gateway_address=gateway_address,
                   awake_address=awake_address)


if __name__ == "__main__":
    main(prog_name="contextful pipeline serve")
