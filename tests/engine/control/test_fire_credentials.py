"""Fire credentials as serve mints and hands them to its children (``engine.control.fire_credentials``).

The start checks run ``contextful pipeline serve`` as a user does (a child process over a project
whose version was imported). What a child receives is read from the child itself: serve's
launcher (``ChildLauncher``) starts a real unit child whose ``sitecustomize`` hook
(``tests/support/child_env``) writes the environment and argument vector the kernel holds for it.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.control.apply import load_version
from contextful.engine.control.credentials import generate_key, verify
from contextful.engine.control.dispatch import ChildLauncher
from contextful.engine.control.fire_credentials import FIRE_AUDIENCE, serve_fire_issuer, unit_environment
from cryptography.hazmat.primitives import serialization

from tests.engine.control.scenario import ControlProject, files_pipeline
from tests.support.cli import contextful_in

DUMP = Path(__file__).resolve().parents[2] / "support" / "child_env"

SYNTHESIZE = """
[[job]]
name = "resolve"
kind = "synthesize"
schedule = "every 1h"
source = "mentions"
entities = "people"
target = "claims"
"""

STORE_DRIVEN_STATEMENT = ('WITH recent AS (SELECT * FROM orders WHERE ts > now() - INTERVAL 1 DAY) '
                          'SELECT r.*, c.tier FROM recent AS r JOIN "Customers" AS c USING (customer_id) '
                          "WHERE r.id NOT IN (SELECT order_id FROM refunds)")


def _key(tmp_path: Path) -> Path:
    _pin, path = generate_key(tmp_path / "keys" / "issuer.pem")
    return path


def _project(tmp_path: Path, *jobs: str, zone: str | None = 'default = "eu"',
             modules: str | None = None) -> ControlProject:
    """A project whose v1 is imported: pipeline ``orders`` (3 rows to land) and ``jobs``."""
    project = ControlProject(tmp_path / "project")
    project.write(files_pipeline("orders"), *jobs)
    head = 'name = "ctl"\n' + (f"modules = {modules}\n" if modules else "")
    head += f"\n[project.zone]\n{zone}\n" if zone is not None else ""
    text = (project.root / "contextful.toml").read_text()
    (project.root / "contextful.toml").write_text(text.replace('name = "ctl"\n', head, 1))
    project.rows("orders", 3)
    project.imported()
    return project


def _operator(tmp_path: Path) -> dict[str, str]:
    """The variables a serve holding its own credential runs with: an operator's token (no grants)
    signed under a key the environment pins, for audience ``store``."""
    from contextful.engine.control import credentials

    private = credentials.load_signing_key(_key(tmp_path / "operator"))
    return {"CONTEXTFUL_TOKEN": credentials.issue(private, "svc://operator", "store", 3600),
            "CONTEXTFUL_ISSUER_PUBKEY": credentials.issuer_key(private.public_key()).text}


def _serve_cycle(project: ControlProject, *args: str, env: dict[str, str] | None = None) -> Any:
    return contextful_in(None, "--project", str(project.root), "pipeline", "serve", "--cycle", *args, env=env,
                         check=False)


def _dumps(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("child-*.json"))]


def _launch(tmp_path: Path, project: ControlProject, head: str, key: Path | None,
            inherited: dict[str, str] | None = None, *, version: int = 1) -> dict[str, Any]:
    """Start, as serve does, the unit child for ``head`` of applied ``version`` under serve's start
    check (``inherited``: the variables serve holds besides its own); what the child received."""
    dump = tmp_path / "dump"
    dump.mkdir(exist_ok=True)
    for old in dump.glob("*"):
        old.unlink()
    manifest = load_version(project.root, version)
    inherited = inherited or {}
    issuer = serve_fire_issuer(manifest, key, version=version, environ=inherited)
    saved = dict(os.environ)
    os.environ.update(inherited | {"PYTHONPATH": f"{DUMP}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                                   "CONTEXTFUL_TEST_ENV_DUMP": str(dump)})
    try:
        launcher = ChildLauncher(project.root, None, version, tmp_path,
                                 environment=lambda h: unit_environment(manifest, h, issuer))
        assert launcher.launch(head).wait(120) is not None
    finally:
        os.environ.clear()
        os.environ.update(saved)
    (found,) = _dumps(dump)
    return {"argv": found["argv"], "env": dict(e.split("=", 1) for e in found["environ"])}


def _seed_spellings(key: Path) -> list[str]:
    """Every spelling of the private key a leak would show: the PEM, its base64 body, the raw seed
    (base64, base64url, hex) and the file's path."""
    pem = key.read_text()
    private = serialization.load_pem_private_key(pem.encode(), password=None)
    raw = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,  # type: ignore[union-attr]
                                serialization.NoEncryption())
    body = "".join(line for line in pem.splitlines() if "-----" not in line)
    return [body, base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
            raw.hex(), str(key), key.name]


def _claims(token: str, env: dict[str, str]) -> dict[str, Any]:
    from contextful.engine.control.credentials import parse_public_key

    pin = parse_public_key(env["CONTEXTFUL_ISSUER_PUBKEY"], "test")
    return dict(verify(token, [pin], env["CONTEXTFUL_AUDIENCE"]).claims)


@pytest.mark.clause("surface.dispatch.fire-credential", "surface.dispatch.fire-credential-pins",
                    "surface.dispatch.fire-credential-lifetime", "surface.dispatch.fire-reach")
def test_serve_mints_each_synthesize_fire_its_own_credential_and_never_hands_over_the_key(tmp_path: Path) -> None:
    project = _project(tmp_path, SYNTHESIZE)
    key = _key(tmp_path)
    inherited = {"CONTEXTFUL_TOKEN": "serve-own-token", "CONTEXTFUL_ISSUER_PUBKEY": "ed25519:" + "A" * 43,
                 "CONTEXTFUL_AUDIENCE": "somewhere-else"}
    first = _launch(tmp_path, project, "job:resolve", key, inherited)
    second = _launch(tmp_path, project, "job:resolve", key, inherited)
    env = first["env"]
    # the pins and audience the minting used replace what serve inherited
    from contextful.engine.control.credentials import issuer_key, load_signing_key

    assert env["CONTEXTFUL_ISSUER_PUBKEY"] == issuer_key(load_signing_key(key).public_key()).text
    assert env["CONTEXTFUL_AUDIENCE"] == FIRE_AUDIENCE == "store"
    token = env["CONTEXTFUL_TOKEN"]
    assert token != "serve-own-token" and token != second["env"]["CONTEXTFUL_TOKEN"]  # one credential per fire
    claims = _claims(token, env)
    assert claims["sub"] == claims["on_behalf_of"] == "svc://job/resolve"
    assert claims["zone"] == "eu"
    assert claims["exp"] - claims["iat"] == 600
    assert claims["grants"] == {"read": ["claims", "mentions", "people"], "write": ["claims"], "read-individual": []}
    # the private key reaches no argument or variable of the child, in any spelling
    for spelling in _seed_spellings(key):
        assert not any(spelling in arg for arg in first["argv"]), spelling
        assert not any(spelling in value for value in env.values()), spelling
        assert not any(spelling in name for name in env), spelling
    assert "--issuer-key" not in first["argv"]


@pytest.mark.clause("surface.dispatch.fire-credential-lifetime")
def test_a_ceiling_below_600_s_bounds_the_fire_credential(tmp_path: Path) -> None:
    project = _project(tmp_path, SYNTHESIZE, zone='default = "eu"\nceiling = "2m"')
    got = _launch(tmp_path, project, "job:resolve", _key(tmp_path), {})
    claims = _claims(got["env"]["CONTEXTFUL_TOKEN"], got["env"])
    assert claims["exp"] - claims["iat"] == 120
    project = _project(tmp_path / "long", SYNTHESIZE, zone='default = "eu"\nceiling = "1h"')
    got = _launch(tmp_path, project, "job:resolve", _key(tmp_path / "long"), {})
    claims = _claims(got["env"]["CONTEXTFUL_TOKEN"], got["env"])
    assert claims["exp"] - claims["iat"] == 600  # a ceiling above 600 s leaves the fire's own lifetime


@pytest.mark.clause("surface.dispatch.fire-reach", "surface.dispatch.fire-individual")
def test_the_reach_a_fire_credential_grants_follows_its_job(tmp_path: Path) -> None:
    individual = SYNTHESIZE.replace('target = "claims"', 'target = "claims"\nread_individual = true')
    store_driven = f"""
[[job]]
name = "score"
kind = "store-driven"
schedule = "every 1h"
body = "score_body"
max_in_flight = 2
statement = '''{STORE_DRIVEN_STATEMENT}'''
tables = ["scores"]
"""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "scoring.py").write_text(
        "from contextful.engine.run.bodies import register_body\n\nregister_body('score_body', lambda item: item)\n")
    project = _project(tmp_path, individual, store_driven, modules='["scoring"]')
    key = _key(tmp_path)
    # read_individual = true: read-individual on the source and the target, nothing else
    got = _launch(tmp_path, project, "job:resolve", key)
    assert _claims(got["env"]["CONTEXTFUL_TOKEN"], got["env"])["grants"] == {
        "read": ["claims", "mentions", "people"], "write": ["claims"], "read-individual": ["claims", "mentions"]}
    # a store-driven fire reads its statement's relations as DuckDB parses them (a CTE is no
    # relation; a quoted name compares as DuckDB compares it), writes its tables, reads no individual
    got = _launch(tmp_path, project, "job:score", key)
    assert _claims(got["env"]["CONTEXTFUL_TOKEN"], got["env"])["grants"] == {
        "read": ["customers", "orders", "refunds"], "write": ["scores"], "read-individual": []}
    # a pipeline unit's child is no fire of a credentialed kind: it keeps serve's environment
    got = _launch(tmp_path, project, "orders", key, {"CONTEXTFUL_TOKEN": "serve-own-token"})
    assert got["env"]["CONTEXTFUL_TOKEN"] == "serve-own-token"


@pytest.mark.clause("surface.dispatch.fire-individual")
def test_only_a_synthesize_job_may_declare_read_individual(tmp_path: Path) -> None:
    project = ControlProject(tmp_path)
    project.write(files_pipeline("orders"), """
[[job]]
name = "folded"
kind = "fold"
schedule = "every 1h"
target = "orders"
read_individual = true
""")
    done = contextful_in(tmp_path, "pipeline", "validate", check=False)
    assert done.returncode != 0
    assert "[[job]] 'folded'.read_individual: only a synthesize job reads individual rows" in done.stderr


@pytest.mark.clause("surface.dispatch.fire-credential-inherited")
def test_without_an_issuer_key_each_child_receives_serves_own_token(tmp_path: Path) -> None:
    project = _project(tmp_path, SYNTHESIZE)
    operator = _operator(tmp_path)  # serve's own credential
    token, pin = operator["CONTEXTFUL_TOKEN"], operator["CONTEXTFUL_ISSUER_PUBKEY"]
    got = _launch(tmp_path, project, "job:resolve", None, operator | {"CONTEXTFUL_AUDIENCE": "store"})
    assert got["env"]["CONTEXTFUL_TOKEN"] == token and got["env"]["CONTEXTFUL_AUDIENCE"] == "store"
    # and through serve itself: a cycle's job child holds the token serve was started with, and admits it
    dump = tmp_path / "dump"
    for old in dump.glob("*"):
        old.unlink()
    done = _serve_cycle(project, env={"CONTEXTFUL_TOKEN": token, "CONTEXTFUL_ISSUER_PUBKEY": pin,
                                      "PYTHONPATH": f"{DUMP}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                                      "CONTEXTFUL_TEST_ENV_DUMP": str(dump)})
    assert done.returncode == 0, done.stderr
    (child,) = _dumps(dump)
    assert f"CONTEXTFUL_TOKEN={token}" in child["environ"]


@pytest.mark.clause("surface.dispatch.fire-credential-missing")
def test_serve_holding_no_credential_for_a_scheduled_synthesize_job_refuses_at_start(tmp_path: Path) -> None:
    project = _project(tmp_path, SYNTHESIZE)
    done = _serve_cycle(project)
    assert done.returncode == 3, done.stderr
    assert "error: FireCredentialMissing: v1 schedules the store-driven or synthesize job(s) resolve" in done.stderr
    assert not (project.root / ".contextful" / "store" / "tables" / "orders").exists()  # nothing fired
    daemon = contextful_in(None, "--project", str(project.root), "pipeline", "serve", "--http", "127.0.0.1:0",
                           check=False, timeout=120)
    assert daemon.returncode == 3 and "FireCredentialMissing" in daemon.stderr and "listening" not in daemon.stdout
    assert not (project.root / ".contextful" / "store" / "tables" / "orders").exists()
    # either credential source starts it: the pipeline then fires
    done = _serve_cycle(project, env=_operator(tmp_path))
    assert done.returncode == 0, done.stderr
    assert project.count("orders") == 3


def test_a_snapshot_scheduling_no_credentialed_job_needs_no_credential(tmp_path: Path) -> None:
    project = _project(tmp_path, SYNTHESIZE.replace('schedule = "every 1h"\n', ""), zone=None)
    assert _serve_cycle(project).returncode == 0
    assert _serve_cycle(project, "--issuer-key", str(_key(tmp_path))).returncode == 0


@pytest.mark.clause("surface.dispatch.fire-credential-zone")
def test_serve_under_an_issuer_key_without_a_default_zone_refuses_at_start(tmp_path: Path) -> None:
    project = _project(tmp_path, SYNTHESIZE, zone=None)
    key = _key(tmp_path)
    done = _serve_cycle(project, "--issuer-key", str(key), env={"CONTEXTFUL_TOKEN": "serve-own-token"})
    assert done.returncode == 3, done.stderr
    assert "error: FireCredentialZoneUnset: serve under --issuer-key mints a credential per fire of resolve" in done.stderr
    assert "[project.zone]" in done.stderr
    assert not (project.root / ".contextful" / "store" / "tables" / "orders").exists()  # nothing fired
    project = _project(tmp_path / "zoned", SYNTHESIZE)
    done = _serve_cycle(project, "--issuer-key", str(_key(tmp_path / "zoned")))
    assert done.returncode == 0, done.stderr
    assert project.count("orders") == 3


@pytest.mark.clause("surface.dispatch.fire-credential-missing", "surface.dispatch.fire-credential-zone")
def test_a_running_serve_arms_no_version_whose_fires_it_cannot_credential(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from contextful.engine.control.fire import ControlPlane
    from contextful.engine.project import open_project_store

    monkeypatch.delenv("CONTEXTFUL_TOKEN", raising=False)
    project = _project(tmp_path, zone=None)  # v1: a pipeline, no credentialed job
    said: list[str] = []

    def open_store() -> Any:
        return open_project_store(project.root, create=True)

    for issuer_key, error in ((None, "FireCredentialMissing"), (_key(tmp_path), "FireCredentialZoneUnset")):
        said.clear()
        plane = ControlPlane(project.root, open_store, say=said.append,
                             fire_issuer=serve_fire_issuer(load_version(project.root, 1), issuer_key, version=1))
        try:
            assert plane.refresh()
            armed = plane.version
            project.write(files_pipeline("orders"), SYNTHESIZE)  # the next version schedules a synthesize job
            project.applied()
            assert plane.refresh() and plane.version == armed  # the armed one stays; the new one arms nothing
            assert [line for line in said if line.startswith(f"error: {error}: ")], said
        finally:
            plane.close(grace_s=0)
        project.write(files_pipeline("orders"))
        project.applied()
