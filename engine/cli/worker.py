"""``contextful worker serve --http ADDR`` and ``contextful worker list``: remote workers (docs/control.md, "Workers").

``worker serve`` runs the worker process of ``engine.control.worker`` for the project at
``--project`` on its store (``--store``, else the project's): it admits signed submissions naming a
callback under the working manifest's ``[control] relay`` and runs their landing steps. It needs
``CONTEXTFUL_WORKER_KEY`` and a relay, and refuses to start (binding nothing) without either. Once
bound it prints ``listening on http://HOST:PORT`` and serves until SIGTERM or SIGINT.

``worker list`` asks each worker the working manifest's ``[control] workers`` lists (or each
``--worker URL``) for its in-flight steps and their last heartbeats (``GET /steps``).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

import click
from contextful.engine.cli.output import emit_json


@click.group("worker")
def worker() -> None:
    """Remote workers running landing steps for serve."""


@worker.command("serve")
@click.option("--http", "address", required=True, help="HOST:PORT to serve POST /submit on (port 0 picks one).")
@click.pass_context
def worker_serve(ctx: click.Context, address: str) -> None:
    """Run a worker: admit signed submissions and land their steps."""
    from contextful.engine.config.control import read_control
    from contextful.engine.control.relay import check_workers
    from contextful.engine.control.worker import WorkerService, worker_routes
    from contextful.engine.project import locate_project
    from contextful.engine.served.face import bind_face

    root = locate_project(ctx.obj["project"])
    _project, control = read_control(root)
    key = check_workers([address], control.relay)  # a worker needs what serve listing workers needs
    assert key is not None and control.relay is not None
    service = WorkerService(root, ctx.obj["store"], control.relay, key, say=lambda line: click.echo(line, err=True))
    face = bind_face(address, "--http")
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        face.serve(worker_routes(service))
        click.echo(f"listening on {face.url}")
        sys.stdout.flush()
        while not stop.wait(0.5):  # a timed wait: the signal handler runs between waits
            pass
    finally:
        face.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@worker.command("list")
@click.option("--worker", "urls", multiple=True, help="A worker URL (default: [control] workers).")
@click.pass_context
def worker_list(ctx: click.Context, urls: tuple[str, ...]) -> None:
    """Each worker's in-flight steps and their last heartbeats."""
    from contextful.engine.config.control import read_control
    from contextful.engine.project import locate_project

    if not urls:
        urls = read_control(locate_project(ctx.obj["project"]))[1].workers
    rows = [_ask(url.rstrip("/")) for url in urls]
    if ctx.obj["json"]:
        emit_json({"workers": rows})
        return
    for row in rows:
        if "error" in row:
            click.echo(f"{row['url']}: unreachable: {row['error']}")
            continue
        click.echo(f"{row['url']}: {len(row['in_flight'])} step(s) in flight")
        for step in row["in_flight"]:
            click.echo(f"  {step['run']}/{step['step']} attempt {step['attempt']}, last heartbeat "
                       f"{step['last_heartbeat'] if step['last_heartbeat'] is not None else 'none yet'}")


def _ask(url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url + "/steps", timeout=10) as answer:
            return {"url": url, "in_flight": json.loads(answer.read())["in_flight"]}
    except (OSError, ValueError, KeyError) as exc:
        return {"url": url, "error": str(exc)}
