"""A job child admits its fire credential once at start and works within its reach (``engine.jobs.admission``).

The child is a real process started with the environment serve builds for it
(``engine.control.fire_credentials.child_environment``); it opens its store through
``open_fire_store`` (what ``contextful job fire`` does) and then fires the synthesize job (``fire_in``), or reads
or writes one table, printing what happened as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.control.apply import load_version
from contextful.engine.control.credentials import generate_key, load_signing_key
from contextful.engine.control.fire_credentials import FireIssuer, child_environment, serve_fire_issuer
from contextful.engine.jobs.admission import open_fire_store
from contextful.engine.project import open_project_store
from contextful.storage.clock import ManualClock
from contextful.storage.errors import CredentialExpired, ReachRefused

from tests.engine.control.scenario import ControlProject, files_pipeline
from tests.engine.control.test_fire_credentials import SYNTHESIZE

JOBS = SYNTHESIZE + SYNTHESIZE.replace('"resolve"', '"other"').replace('"mentions"', '"users"').replace(
    '"claims"', '"profiles"')
"""Two synthesize jobs: ``resolve`` (mentions, people -> claims) and ``other`` (users, people -> profiles)."""

CHILD = r"""
import json, sys
from pathlib import Path
import pyarrow as pa
from contextful.engine.control.apply import load_version
from contextful.engine.jobs.admission import open_fire_store
from contextful.engine.jobs.fire import fire_in
from contextful.engine.read import connect

root, name, action = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
manifest = load_version(root, 1)
job = next(j for j in manifest.jobs if j.name == name)
try:
    store = open_fire_store(job, manifest)
except Exception as exc:
    print(json.dumps({"stage": "admit", "error": type(exc).__name__, "detail": str(exc)}))
    sys.exit(0)
try:
    verb, _, table = action.partition(":")
    if verb == "synthesize":
        outcome = fire_in(store, manifest, 1, job).outcome
        out = {"ok": outcome.ok, "rows": outcome.rows}
    elif verb == "read":
        out = {"rows": store.table(table).count()}
    elif verb == "sql":
        out = {"rows": connect(store).execute(f"SELECT count(*) FROM {table}").fetchone()[0]}
    else:
        store.append(table, pa.table({"id": [99]}))
        out = {"wrote": table}
except Exception as exc:
    out = {"stage": "run", "error": type(exc).__name__, "detail": str(exc)}
print(json.dumps(out))
"""


@pytest.fixture
def project(tmp_path: Path) -> ControlProject:
    project = ControlProject(tmp_path / "project")
    project.write(files_pipeline("orders"), JOBS)
    text = (project.root / "contextful.toml").read_text()
    (project.root / "contextful.toml").write_text(text.replace('name = "ctl"\n', 'name = "ctl"\n\n[project.zone]\n'
                                                                                   'default = "eu"\n', 1))
    project.imported()
    with open_project_store(project.root, create=True) as store:
        store.append("mentions", pa.table({"mention_id": ["m1", "m2"], "entity_key": ["ada", "zed"],
                                           "attribute": ["city", "city"], "value": ["Paris", "Rome"],
                                           "observed_at": [datetime(2026, 1, 1, tzinfo=UTC)] * 2}))
        store.append("people", pa.table({"entity_id": [1], "entity_key": ["Ada"]}))
        store.append("users", pa.table({"id": [1, 2, 3]}))
    return project


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return generate_key(tmp_path / "keys" / "issuer.pem")[1]


def _child(project: ControlProject, job: str, action: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(project.root), job, action], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _env(project: ControlProject, key: Path, job: str = "resolve", issuer: FireIssuer | None = None) -> dict[str, str]:
    """The environment serve starts a fire of ``job`` with under ``--issuer-key key``."""
    manifest = load_version(project.root, 1)
    issuer = issuer or serve_fire_issuer(manifest, key, version=1, environ={})
    base = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    return child_environment(next(j for j in manifest.jobs if j.name == job), manifest, issuer, base)


@pytest.mark.clause("surface.dispatch.fire-reach", "surface.dispatch.fire-credential")
def test_a_fire_child_reads_and_writes_only_within_its_credentials_reach(project: ControlProject, key: Path) -> None:
    env = _env(project, key)
    done = _child(project, "resolve", "synthesize", env)
    assert done == {"ok": True, "rows": 2}  # one claim, one dead letter: within its reach
    assert _child(project, "resolve", "read:mentions", env) == {"rows": 2}
    for action, access in (("read:users", "read"), ("write:users", "write"), ("write:people", "write"),
                           ("write:profiles", "write")):
        refused = _child(project, "resolve", action, env)
        assert refused["stage"] == "run" and refused["error"] == "ReachRefused", refused
        assert f"svc://job/resolve does not reach {access} on table '{action.split(':')[1]}'" in refused["detail"]
    sql = _child(project, "resolve", "sql:users", env)  # the read path holds no view of it
    assert sql["stage"] == "run" and "users" in sql["detail"].lower()
    with open_project_store(project.root) as store:
        assert store.table("users").count() == 3 and store.table("people").count() == 1
        assert store.table("claims").to_arrow().column("value").to_pylist() == ["Paris"]
        assert store.table("claims_dead_letters").to_arrow().column("reason").to_pylist() == ["entity-unknown"]


@pytest.mark.clause("surface.dispatch.fire-credential-lifetime", "surface.dispatch.fire-credential-pins")
def test_a_fire_child_refuses_at_start_a_credential_it_cannot_admit(project: ControlProject, key: Path,
                                                                    tmp_path: Path) -> None:
    # past its lifetime: minted 601 s ago
    past = ManualClock(datetime.now(UTC).replace(microsecond=0))
    past.advance(-601)
    expired = _env(project, key, issuer=FireIssuer(load_signing_key(key), past))
    got = _child(project, "resolve", "read:mentions", expired)
    assert got["stage"] == "admit" and got["error"] == "CredentialExpired"
    env = _env(project, key)
    other_pin = generate_key(tmp_path / "keys" / "other.pem")[0].text
    for changed, error in (({"CONTEXTFUL_ISSUER_PUBKEY": other_pin}, "signed by no issuer key pinned here"),
                           ({"CONTEXTFUL_AUDIENCE": "awake"}, "the credential is for audience 'store'"),
                           ({"CONTEXTFUL_TOKEN": _env(project, key, "other")["CONTEXTFUL_TOKEN"]},
                            "the fire credential is 'svc://job/other''s, not 'svc://job/resolve''s")):
        got = _child(project, "resolve", "read:mentions", env | changed)
        assert got["stage"] == "admit" and got["error"] == "CredentialUnadmitted" and error in got["detail"], got
    with open_project_store(project.root) as store:
        assert "claims" not in store.table_names()


@pytest.mark.clause("surface.dispatch.fire-credential-lifetime")
def test_the_credential_is_admitted_once_so_a_fire_outliving_it_finishes(project: ControlProject, key: Path) -> None:
    clock = ManualClock(datetime.now(UTC))
    env = _env(project, key, issuer=FireIssuer(load_signing_key(key), clock))
    manifest = load_version(project.root, 1)
    job = next(j for j in manifest.jobs if j.name == "resolve")
    with open_fire_store(job, manifest, environ=env, clock=clock) as store:
        clock.advance(601)  # the credential has expired: the open store keeps its admitted reach
        assert store.table("mentions").count() == 2
        with pytest.raises(ReachRefused):
            store.table("users").count()
    with pytest.raises(CredentialExpired):  # a fire starting now is refused
        open_fire_store(job, manifest, environ=env, clock=clock)


@pytest.mark.clause("surface.dispatch.fire-reach")
def test_a_store_driven_fire_runs_within_the_reach_its_statement_grants(tmp_path: Path, key: Path) -> None:
    from contextful.engine.jobs.fire import fire_in

    from tests.engine.jobs.project import applied, reset_bodies, write_project

    statement = ("WITH wanted AS (SELECT doc_id FROM documents EXCEPT SELECT doc_id FROM skipped) "
                 "SELECT d.doc_id, d.body FROM documents AS d JOIN wanted USING (doc_id) ORDER BY d.doc_id")
    root = write_project(tmp_path / "sd", statement=statement,
                         extra='\n[[external]]\nid = "skipped"\ntable = "skipped"\n\n[project.zone]\ndefault = "eu"\n')
    version = applied(root)
    with open_project_store(root, create=True) as store:
        store.append("documents", pa.table({"doc_id": ["d1", "d2", "d3"], "body": ["a", "bb", "ccc"]}))
        store.append("skipped", pa.table({"doc_id": ["d2"]}))
        store.append("secrets", pa.table({"doc_id": ["d1"], "token": ["s3cr3t"]}))
    manifest = load_version(root, version)
    job = next(j for j in manifest.jobs if j.name == "score-documents")
    env = child_environment(job, manifest, FireIssuer(load_signing_key(key)),
                            {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")})
    reset_bodies()
    try:
        with open_fire_store(job, manifest, environ=env) as store:
            assert store.reach is not None and store.reach.read == {"documents", "skipped"}
            outcome = fire_in(store, manifest, version, job).outcome
            assert outcome.ok, outcome
            for table in ("secrets", "scores"):  # it writes its tables; it reads only its statement's relations
                with pytest.raises(ReachRefused):
                    store.table(table).count()
    finally:
        reset_bodies()
    with open_project_store(root) as store:
        assert sorted(store.table("scores").to_arrow().column("doc_id").to_pylist()) == ["d1", "d3"]
