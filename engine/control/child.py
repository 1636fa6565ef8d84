"""One dispatched unit's child process: ``python -m contextful.engine.control.child``.

Serve (``engine.control.dispatch.ChildLauncher``) starts it in a process group of its own with the
project, the applied version, the unit's head and a result file. It loads that version of the
manifest from the snapshot directory (never the working file), runs the unit through
``engine.run.units``, then, when every member succeeded, fires each build job whose ``after`` names
one of its members (``engine.jobs.after``), and writes ``{"ok": …, "members": […], "failures": […]}`` to the result file
(written whole, then renamed into place), exiting 0 when every member succeeded and 1 otherwise.
SIGTERM (serve stopping, or the connection it runs paused) cancels the unit at its next boundary, as
Ctrl-C cancels ``pipeline run``. A connection's entry (``connection:<id>``) runs the connection's
instance instead (``engine.control.connection_run.fire_connection``). Under ``--landed-on-workers``
(serve's relay ran the landing members on workers, naming each that failed with ``--failed`` or ran
nowhere with ``--unlaunched``) it runs the unit's derive tiers alone, after them, and its builds when
every member succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextful.engine.run.units import RanElsewhere
    from contextful.storage.clock import Clock


def _failure_lines(results: list) -> list[str]:  # type: ignore[type-arg]
    return [f"{r.pipeline}: {f.error}: {f.detail}" for r in results for f in r.failures]


def fire_unit(root: Path, version: int, head: str, store_url: str | None, *, cancel: threading.Event,
              clock: Clock | None = None, elsewhere: RanElsewhere | None = None) -> dict[str, Any]:
    """Run the unit headed by ``head`` of applied version ``version``, then the builds riding it when
    every member succeeded: the outcome document serve reads (``ok``, ``members``, ``failures``, and
    ``canceled``: the members whose run a SIGTERM canceled at its boundary).
    With ``elsewhere`` (its landing members ran on serve's workers, ``engine.control.relay``) only
    its derive tiers run here, after them."""
    try:
        from contextful.engine.control.connection_run import PREFIX, fire_connection

        if head.startswith(PREFIX):
            return fire_connection(root, version, head, store_url, cancel=cancel, clock=clock)
        from contextful.engine.control.arming import load_armable
        from contextful.engine.jobs.after import fire_dependents
        from contextful.engine.project import open_project_store
        from contextful.engine.run.units import run_unit, unit_of

        manifest, _refused = load_armable(root, version)
        unit = unit_of(manifest, head)
        store = open_project_store(manifest.root, store_url, project=manifest.project, create=True, clock=clock)
        try:
            outcome = run_unit(store, manifest, unit, cancel=cancel, elsewhere=elsewhere)
            failures = _failure_lines(outcome.results)
            fired = (fire_dependents(store, manifest, version, unit.members, cancel=cancel,
                                     say=lambda line: print(line, file=sys.stderr))
                     if outcome.ok else [])  # surface.fire.build-dependency: only after a successful unit
        finally:
            store.close()
        failures += [f"job:{f.job}: {line}" for f in fired for line in (f.outcome.failures if f.outcome else ())]
        return {"ok": outcome.ok and all(f.ok for f in fired),
                "members": list(unit.members) + [f"job:{f.job}" for f in fired], "failures": failures,
                "canceled": list(outcome.canceled)}
    except Exception as exc:  # noqa: BLE001 - the unit fails by name; serve reads the line
        from contextful.engine.guard import mask_message
        from contextful.storage.errors import ContextfulError

        line = str(exc) if isinstance(exc, ContextfulError) else f"{type(exc).__name__}: {exc}"
        return {"ok": False, "members": [head], "failures": [f"{head}: {mask_message(line)}"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextful-unit")
    parser.add_argument("--project", required=True)
    parser.add_argument("--store", default=None)
    parser.add_argument("--version", type=int, required=True)
    parser.add_argument("--unit", required=True)
    parser.add_argument("--result", required=True)
    parser.add_argument("--landed-on-workers", action="store_true",
                        help="Its landing members ran on workers: run its derive tiers (and builds) only.")
    parser.add_argument("--failed", action="append", default=[], help="A landing member that failed on a worker.")
    parser.add_argument("--unlaunched", action="append", default=[],
                        help="A landing member no worker ran (a dispatch error): its tiers are not run.")
    args = parser.parse_args(argv)
    cancel = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: cancel.set())
    signal.signal(signal.SIGINT, lambda *_: cancel.set())
    result = Path(args.result)
    elsewhere = None
    if args.landed_on_workers:
        from contextful.engine.run.units import RanElsewhere

        elsewhere = RanElsewhere(frozenset(args.failed) | frozenset(args.unlaunched), frozenset(args.unlaunched))
    doc = fire_unit(Path(args.project), args.version, args.unit, args.store, cancel=cancel, elsewhere=elsewhere)
    partial = result.with_suffix(".partial")
    partial.write_text(json.dumps(doc))
    os.replace(partial, result)
    for line in doc["failures"]:  # type: ignore[attr-defined]
        print(f"error: {line}", file=sys.stderr)
    if "skipped" in doc:
        print(doc["skipped"], file=sys.stderr)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
