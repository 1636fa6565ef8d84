"""The disposable machine, end to end (issue 15's proof of ``run.journal.postgres-stores`` and
``run.journal.container-profile``): a multi-step run under the container profile — the real
PostgreSQL server as the execution database, the S3-compatible server as the corpus bucket — is
SIGKILLed between steps, its whole working directory (store cache, spool, temp) is deleted, and
it resumes in a fresh directory, possibly to be killed again.

Each trial's child (``tests.storage.container_run``) prints ``stop K`` before step ``K``; the test
kills it on that line, never after a guessed sleep. Every step records in a side table of the
execution database that it ran, a channel that outlives every machine. After the last resumption
the trial checks: each step ran exactly once; every recorded step replayed its recorded value (the
tokens the finishing process reports are the journal's, and each step's blob is the token); the
step's rows landed exactly once (no row lost or doubled).

Short form: 5 trials. ``CONTEXTFUL_SOAK=1``: 50 trials over every kill point and pairs of them.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from contextful.storage import Store
from contextful.storage.container import provision
from contextful.storage.journal import CLOSED_OK
from contextful.storage.journal.postgres import PostgresJournalStore

from tests.storage import container_run as child
from tests.storage.container_site import ContainerSite
from tests.support.s3_server import S3Server
from tests.support.soak import soak_long, trials

pytestmark = [pytest.mark.postgres, pytest.mark.s3, pytest.mark.slow]

STEPS = 4
SOAK = soak_long()
TRIALS = trials(short=5, long=50)
CHILD_TIMEOUT_S = 300.0
PARALLEL = 2


def schedule(trial: int) -> list[int]:
    """The kill points of one trial: one kill for even trials, two (the second in the resumed
    process, at the same point or later) for odd ones; every point 0..STEPS-1 comes round."""
    first = trial % STEPS
    return [first] if trial % 2 == 0 else [first, first + (trial // 2) % (STEPS - first)]


def run_child(site: ContainerSite, workdir: Path, scope: str, stop_before: int | None) -> dict[str, object] | None:
    """Run one machine on ``workdir``; kill it at ``stop_before`` (None: let it finish)."""
    (workdir / "tmp").mkdir(parents=True)
    cmd = [sys.executable, "-m", "tests.storage.container_run", str(workdir), scope, str(STEPS)]
    if stop_before is not None:
        cmd += ["--stop-before", str(stop_before)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2], env=site.child_env(str(workdir / "tmp")))
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()  # blocks until the child reaches its kill point or finishes
        if stop_before is not None:
            assert line.strip() == f"stop {stop_before}", (line, proc.communicate(timeout=CHILD_TIMEOUT_S))
            proc.send_signal(signal.SIGKILL)
            proc.wait(CHILD_TIMEOUT_S)
            return None
        _, stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        assert proc.returncode == 0 and line.startswith("done "), (line, stderr)
        return dict(json.loads(line[len("done "):]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_trial(site: ContainerSite, journal: PostgresJournalStore, reader: Store, tmp_path: Path, trial: int) -> None:
    scope = f"trial-{trial}"
    kills = schedule(trial)
    for machine, kill_at in enumerate([*kills, None]):
        workdir = tmp_path / f"trial-{trial}-machine-{machine}"
        done = run_child(site, workdir, scope, kill_at)
        shutil.rmtree(workdir)  # the machine and its whole disk are gone
    assert done is not None

    ran = Counter(step for (step,) in site.sql(f"SELECT step FROM {child.SIDE_TABLE} WHERE scope = %s", (scope,)))
    assert ran == Counter(range(STEPS)), f"trial {trial} killed at {kills}: executions per step {ran}"
    owner = journal.owner(scope)
    assert owner is not None and owner.status == CLOSED_OK and owner.execution_id == done["execution"]
    assert owner.attempts == len(kills) + 1
    recorded = [json.loads(s.value[1:]) for s in journal.steps(owner.execution_id)]
    assert [r["step"] for r in recorded] == list(range(STEPS))
    assert done["tokens"] == [r["token"] for r in recorded]  # replayed, never recomputed
    assert all(reader.blobs.get(r["blob"]) == r["token"].encode() for r in recorded)
    rows = reader.table(child.table_name(scope)).to_arrow().sort_by([("step", "ascending"), ("n", "ascending")])
    assert rows.to_pylist() == [{"step": r["step"], "n": n, "token": r["token"]}
                                for r in recorded for n in range(child.ROWS_PER_STEP)]


@pytest.mark.timeout(3600 if SOAK else 900)
@pytest.mark.clause("run.journal.postgres-stores", "run.journal.container-profile")
def test_a_killed_machine_whose_disk_is_lost_resumes_every_recorded_step(
        pg_dsn: str, pg_schema: str, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = ContainerSite.fresh(pg_dsn, pg_schema, s3_server)
    for key, value in site.env.items():
        monkeypatch.setenv(key, value)
    with Store.open(tmp_path / "operator" / "store") as store:
        provision(store)
    site.sql(f"CREATE TABLE {child.SIDE_TABLE} (scope TEXT NOT NULL, step BIGINT NOT NULL, pid BIGINT NOT NULL)")
    journal = PostgresJournalStore(pg_dsn, pg_schema)
    reader = Store.open(tmp_path / "reader" / "store")
    try:
        # Trials are independent (a scope and a table each): two machines run at a time.
        with ThreadPoolExecutor(PARALLEL) as pool:
            for outcome in [pool.submit(run_trial, site, journal, reader, tmp_path, t) for t in range(TRIALS)]:
                outcome.result()
    finally:
        reader.close()
        journal.close_store()
        site.drop()
