"""What the delegate and isolated-item tests share: the reference delegate (datasets/enrich_delegate.py)
as a real child process on loopback (``delegate_of`` lives in this package's conftest), a project
applied and fired, a store on the engine's injected clock, and a fire as a child process to kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from contextful.engine.control.worker_key import KEY_VARIABLE
from contextful.engine.jobs.context import JobOutcome
from contextful.storage import Store
from contextful.storage.clock import ManualClock

KEY = "k" * 40
"""The worker key the tests' engine and delegate share."""

MANIFEST = """\
[project]
name = "delegated"

[[external]]
id = "documents"
table = "documents"

[control.delegates.enricher]
url = "{url}"
mode = "{mode}"
{binding}

[[job]]
name = "enrich-documents"
kind = "store-driven"
schedule = "every 1m"
body = {{ delegate = "enricher" }}
statement = "SELECT doc_id, body FROM documents ORDER BY doc_id"
max_in_flight = {max_in_flight}
tables = ["enriched"]
retry = {{ attempts = {attempts}, base_s = 0, max_s = 0 }}
"""
"""A project whose store-driven job hands each document to the delegate ``enricher`` (format it
with the delegate's ``url``, its ``mode``, more ``binding`` lines, ``max_in_flight`` and ``attempts``)."""


class Delegate:
    """The reference delegate as a child process: its url and the requests it logged."""

    def __init__(self, root: Path, script: dict[str, list[str]]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.log = root / "requests.ndjson"
        (root / "script.json").write_text(json.dumps(script))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "contextful.datasets.enrich_delegate", "--log", str(self.log),
             "--script", str(root / "script.json")],
            stdout=subprocess.PIPE, text=True, env={**os.environ, KEY_VARIABLE: KEY})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # printed once it accepts requests
        assert line.startswith("listening "), line
        self.url = line.removeprefix("listening ")

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def sent_keys(self) -> list[str]:
        return [r["envelope"]["entity"]["key"] for r in self.requests()]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


Start = Callable[..., Delegate]
"""Start a reference delegate with a script of behaviours."""


def applied(root: Path, manifest: str) -> int:
    """Write ``manifest`` as the project's ``contextful.toml`` and import it (apply it, once imported):
    the version applied."""
    from tests.engine.jobs import project

    root.mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text(manifest)
    return project.applied(root)


def fire(root: Path, version: int, store: Store, cancel: threading.Event | None = None) -> JobOutcome:
    """Fire the project's one job of applied ``version`` in ``store``, as ``job fire`` and serve's job
    children do (``engine.jobs.fire``): its outcome."""
    from contextful.engine.control.apply import load_version

    from tests.engine.jobs import project

    job = load_version(root, version).jobs[0].name
    return project.fire(project.fire_context(root, version, store, job, cancel))


def clocked_store(path: Path, table: str, rows: pa.Table) -> Store:
    """A store on a :class:`ManualClock` (the engine's instant) holding ``rows`` as ``table``, a
    second before now."""
    store = Store.open(str(path), clock=ManualClock())
    store.append(table, rows)
    store.clock.advance(1)
    return store


CHILD = """
import sys
from pathlib import Path
from contextful.engine.control.apply import load_version
from contextful.engine.jobs.fire import fire_in
from contextful.storage import Store
root, version, store_root = sys.argv[1:4]
manifest = load_version(Path(root), int(version))
fire_in(Store.open(store_root), manifest, int(version), manifest.jobs[0])
"""
"""A daemon's fire of a project's one job, as a child process a test SIGKILLs (on the system clock)."""
