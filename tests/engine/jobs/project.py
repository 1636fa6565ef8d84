"""A project the job runner tests share: a registration module (``[project] modules``) whose body
records what it was handed, an applied version read back through ``load_version``, and the
``JobContext`` a fire of one of its jobs receives."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from contextful.engine.control.apply import apply_manifest, import_manifest, load_version
from contextful.engine.jobs.context import JobContext, JobOutcome
from contextful.storage import Store

MODULE = "storedriven_bodies"

BODIES = '''\
"""Bodies of the store-driven job tests: each records the items it was handed."""
import os
import sys
import threading

from contextful.engine.run.bodies import register_body
from contextful.storage.errors import SourceUnavailable

CALLS = []
"""Every key handed to a body, in order."""
PERMANENT = set()
"""Keys whose body fails for good."""
TRANSIENT = {}
"""Key -> how many more times its body fails transiently."""
ELSEWHERE = set()
"""Keys whose body answers rows for a table the job does not write."""
ANSWERED = {}
"""Key -> an event set once that key's body answered (a test stops the fire on it)."""
BARRIER = []
"""A barrier every body waits at while one is set: proof that items run together."""
IN_FLIGHT = [0, 0]
"""Bodies running now, and the most that ever ran at once."""
_lock = threading.Lock()


def score(row):
    key = row["doc_id"]
    with _lock:
        CALLS.append(key)
        IN_FLIGHT[0] += 1
        IN_FLIGHT[1] = max(IN_FLIGHT)
    try:
        if key == os.environ.get("STOREDRIVEN_BLOCK_AT"):  # a crash test: say so, then hang until killed
            print(f"blocked {key}", flush=True)
            threading.Event().wait()
        if BARRIER:
            BARRIER[0].wait(timeout=30)
        if key in PERMANENT:
            raise ValueError(f"cannot score {key}")
        if TRANSIENT.get(key, 0) > 0:
            TRANSIENT[key] -= 1
            raise SourceUnavailable("scorer", "busy, try again")
        if key in ELSEWHERE:
            return {"elsewhere": [{"doc_id": key}]}
        return {"scores": [{"doc_id": key, "score": len(row["body"])}]}
    finally:
        with _lock:
            IN_FLIGHT[0] -= 1
        if key in ANSWERED:
            ANSWERED[key].set()


register_body("score", score)
'''

MANIFEST = """\
[project]
name = "sd"
modules = ["storedriven_bodies"]

[[external]]
id = "documents"
table = "documents"

[[job]]
name = "score-documents"
kind = "store-driven"
schedule = "every 1m"
body = "score"
statement = "{statement}"
max_in_flight = {max_in_flight}
tables = [{tables}]
retry = {{ attempts = 2, base_s = 0, max_s = 0 }}
{extra}
"""


def write_project(root: Path, *, statement: str = "SELECT doc_id, body FROM documents ORDER BY doc_id",
                  max_in_flight: int = 2, tables: str = '"scores"', extra: str = "") -> Path:
    """Write (or rewrite) the project's working files."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{MODULE}.py").write_text(BODIES)
    (root / "contextful.toml").write_text(MANIFEST.format(statement=statement, max_in_flight=max_in_flight,
                                                          tables=tables, extra=extra))
    return root


def applied(root: Path) -> int:
    """Import (first time) or apply the working document; the version applied."""
    outcome = import_manifest(root) if not (root / ".contextful" / "control").exists() else apply_manifest(root)
    return outcome.version


def fire_context(root: Path, version: int, store: Store, job: str = "score-documents",
                 cancel: threading.Event | None = None) -> JobContext:
    """The context a fire of ``job`` receives: the job as applied in ``version``."""
    manifest = load_version(root, version)
    spec = next(j for j in manifest.jobs if j.name == job)
    return JobContext(spec, manifest, version, store, cancel=cancel or threading.Event())


def fire(ctx: JobContext) -> JobOutcome:
    """One fire of ``ctx.job`` as ``job fire`` and serve's job children run it (``engine.jobs.fire``):
    the execution opened under the kind's opening, the runner's outcome recorded on it."""
    from contextful.engine.jobs.fire import fire_in

    fired = fire_in(ctx.store, ctx.manifest, ctx.version, ctx.job, cancel=ctx.cancel)
    assert fired.outcome is not None
    return fired.outcome


def rows(store: Store, sql: str) -> list[tuple]:
    """``sql``'s rows over the store, read through the DuckDB read path."""
    from contextful.engine.read import connect

    con = connect(store)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def bodies():
    """The imported registration module (its recorders)."""
    return sys.modules[MODULE]


def reset_bodies() -> None:
    module = sys.modules.get(MODULE)
    if module is None:
        return
    module.CALLS.clear()
    module.PERMANENT.clear()
    module.TRANSIENT.clear()
    module.ELSEWHERE.clear()
    module.ANSWERED.clear()
    module.BARRIER.clear()
    module.IN_FLIGHT[:] = [0, 0]
