"""Two ``pipeline serve`` daemons on one store, killed and restarted: no unit fires twice for one due instant.

``surface.dispatch.lease-gated``: only the cadence lease's holder dispatches, and each dispatch is
recorded under that lease before the unit starts, so whichever daemon holds the lease next arms
from the record. Each daemon's log names the due instant of every fire it starts; across both
daemons' lives, every due instant appears once. SQLite: both daemons serve one project directory.
PostgreSQL: two project directories (each with its own applied versions, queue and node id) share
one store root and the PostgreSQL catalog, the shared deployment's lease in it.
"""

from __future__ import annotations

import random
import re
import signal
from collections import Counter
from pathlib import Path

import pytest

from tests.engine.control.scenario import ControlProject, Serve, files_pipeline
from tests.engine.land.test_reconnect import postgres_env, provisioned
from tests.support.cli import contextful_in
from tests.support.s3_server import S3Server
from tests.support.soak import trials

DUE = re.compile(r"fired (\S+) \(due (\S+);")


def _fires(daemons: list[Serve]) -> Counter[tuple[str, str]]:
    return Counter(m.groups() for d in daemons for line in d.lines if (m := DUE.search(line)))


def _kill_and_restart(projects: list[ControlProject], rounds: int, env: dict[str, str] | None) -> list[Serve]:
    """Run a daemon per project entry; ``rounds`` times kill one (mostly SIGKILL) and start it again,
    each time waiting for two more fires by whichever holds the lease; every daemon that ran."""
    rng = random.Random(27)
    live = [Serve(p, env=env) for p in projects]
    every = list(live)
    try:
        _wait_total(every, 1)
        for _ in range(rounds):
            pick = rng.randrange(len(live))
            live[pick].stop(signal.SIGKILL if rng.random() < 0.7 else signal.SIGTERM)
            live[pick] = Serve(projects[pick], env=env)
            every.append(live[pick])
            _wait_total(every, sum(_fires(every).values()) + 2)
    finally:
        for daemon in live:
            if daemon.proc.poll() is None:
                daemon.stop(signal.SIGTERM)
    return every


def _wait_total(daemons: list[Serve], total: int) -> None:
    import threading

    beat = threading.Event()
    for _ in range(2400):  # bounded: up to 120 s of 50 ms looks
        if sum(_fires(daemons).values()) >= total:
            return
        beat.wait(0.05)
    raise AssertionError(f"fewer than {total} fires: {[d.lines for d in daemons]}")


def _check(daemons: list[Serve]) -> None:
    fires = _fires(daemons)
    assert fires, "nothing fired"
    twice = {k: n for k, n in fires.items() if n > 1}
    assert not twice, f"due instants fired more than once: {twice}"


@pytest.mark.slow
@pytest.mark.clause("surface.dispatch.lease-gated")
def test_two_serves_on_one_sqlite_store_never_fire_one_due_instant_twice(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders", schedule="every 1s"))
    project.rows("orders", 1)
    project.imported()
    _check(_kill_and_restart([project, project], trials(3, 20), None))


@pytest.mark.slow
@pytest.mark.clause("surface.dispatch.lease-gated")
def test_two_serves_sharing_a_postgres_catalog_never_fire_one_due_instant_twice(
        tmp_path: Path, pg_dsn: str, pg_schema: str, s3_server: S3Server) -> None:
    shared = tmp_path / "shared-store"
    nodes = [ControlProject(tmp_path / name) for name in ("east", "west")]
    for node in nodes:
        node.write(files_pipeline("orders", schedule="every 1s"))
        text = (node.root / "contextful.toml").read_text()
        (node.root / "contextful.toml").write_text(text.replace('name = "ctl"\n', f'name = "ctl"\nstore = "{shared}"\n'))
        node.rows("orders", 1)
    bucket = provisioned(nodes[0].root, pg_dsn, pg_schema, s3_server)
    env = postgres_env(pg_dsn, pg_schema, "cf-two-serves", s3_server, bucket)
    for node in nodes:
        contextful_in(None, "--project", str(node.root), "pipeline", "import", env=env)
    _check(_kill_and_restart(nodes, trials(3, 20), env))
