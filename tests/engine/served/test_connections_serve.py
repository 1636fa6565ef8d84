"""The connection scenarios end to end: ``contextful pipeline serve --http`` in a child process,
credentials from ``contextful key issue``, records read back with ``contextful connection list|show``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.control.credentials import generate_key
from contextful.storage import Store

from tests.engine.served.connection_app import (
    DECLARATION,
    TEMPLATE,
    claims_of,
    declaration,
    write_template_project,
)
from tests.engine.served.control_face import manifest_text, request
from tests.engine.served.test_control_routes_serve import RECEIVE, serving
from tests.support.cli import contextful


def project_with_store(tmp_path: Path) -> tuple[Path, Path]:
    """A project pinning an issuer key, v1 imported and its store made; the issuer's key file."""
    pin, key_file = generate_key(tmp_path / "keys" / "issuer.pem")
    project = tmp_path / "project"
    write_template_project(project, manifest_text(pin.text, TEMPLATE))
    contextful(project, "pipeline", "import")
    Store.open(load_manifest(project).project.store).close()  # the store the records live in
    return project, key_file


def write_credential(project: Path, key_file: Path, tenant: str = "acme", principal: str = "ana") -> str:
    return contextful(project, "key", "issue", "--subject", "app", "--audience", "connections", "--tenant", tenant,
                      "--principal", principal, "--key", str(key_file)).stdout.strip()


def listed(project: Path) -> list[dict]:
    return json.loads(contextful(project, "--json", "connection", "list").stdout)


def post(url: str, token: str, body: object) -> tuple[int, dict]:
    return request(url, "POST", "/connections", json.dumps(body).encode(),
                   {"Content-Type": "application/json", "Authorization": f"Bearer {token}"})


@pytest.mark.clause("surface.connection.idempotent-create")
def test_scenario_a_consent_callback_retrying_the_same_declaration_leaves_one_connection(tmp_path: Path) -> None:
    project, key_file = project_with_store(tmp_path)
    token = write_credential(project, key_file)
    with serving(project) as url:
        status, created = post(url, token, DECLARATION)
        assert (status, created["version"], created["state"]) == (201, 1, "active"), created
        assert post(url, token, DECLARATION) == (200, created)  # the retried callback
    with serving(project) as url:  # and after serve restarts: the record is the catalog's
        assert post(url, token, DECLARATION) == (200, created)
        status, conflict = post(url, token, declaration(secret="ANOTHER_TOKEN"))
        assert (status, conflict["error"]) == (409, "ConnectionIdConflict")
    assert listed(project) == [created]
    shown = contextful(project, "connection", "show", "acme-drive").stdout
    assert "version: 1" in shown and "state: active" in shown and "secret: ACME_DRIVE_TOKEN" in shown
    assert "schedule: every 15m" in shown and "pipeline: events" in shown


@pytest.mark.clause("surface.connection.malformed", "surface.connection.consent-boundary")
def test_scenario_a_create_carrying_an_oauth_code_beside_its_secret_name_claims_no_version(tmp_path: Path) -> None:
    project, key_file = project_with_store(tmp_path)
    token = write_credential(project, key_file)
    with serving(project) as url:
        status, answer = post(url, token, declaration(code="4/0AfJohXkOAuthCode"))
        assert (status, answer["error"]) == (400, "ConnectionRequestMalformed"), answer
        assert "'code'" in answer["detail"] and "4/0AfJohXk" not in answer["detail"]
    assert listed(project) == []
    refused = contextful(project, "connection", "show", "acme-drive", check=False)
    assert refused.returncode != 0 and "ConnectionUnknown" in refused.stderr


@pytest.mark.clause("surface.connection.routes")
def test_with_no_issuer_key_or_no_store_the_routes_answer_owner_unconfigured(tmp_path: Path) -> None:
    pin, key_file = generate_key(tmp_path / "keys" / "issuer.pem")
    alone = tmp_path / "alone"  # an issuer key pinned, but no store yet to hold the records
    alone.mkdir()
    (alone / "contextful.toml").write_text(manifest_text(pin.text, ""))
    token = write_credential(alone, key_file)
    with serving(alone) as url:
        status, answer = request(url, "POST", "/connections/acme-drive/pause", b"{}",
                                 {"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        assert (status, answer["error"]) == (503, "ConfigOwnerUnconfigured") and "no store" in answer["detail"]
    assert not (alone / ".contextful").exists()  # the routes never create one
    unpinned = tmp_path / "unpinned"  # no issuer key: no credential can be admitted
    unpinned.mkdir()
    (unpinned / "contextful.toml").write_text(manifest_text(None, RECEIVE))
    contextful(unpinned, "pipeline", "import")
    with serving(unpinned) as url:
        status, answer = post(url, token, DECLARATION)
        assert (status, answer["error"]) == (503, "ConfigOwnerUnconfigured") and "issuer key" in answer["detail"]


def test_a_connection_write_credential_names_both_tenant_and_principal_for_audience_connections(
        tmp_path: Path) -> None:
    _pin, key_file = generate_key(tmp_path / "keys" / "issuer.pem")
    for args in (["--audience", "connections", "--tenant", "acme"], ["--audience", "connections", "--principal", "ana"],
                 ["--audience", "awake", "--tenant", "acme", "--principal", "ana"]):
        refused = contextful(tmp_path, "key", "issue", "--subject", "app", "--key", str(key_file), *args, check=False)
        assert refused.returncode != 0 and "ArgumentInvalid" in refused.stderr, refused.stderr
    issued = json.loads(contextful(tmp_path, "--json", "key", "issue", "--subject", "app", "--key", str(key_file),
                                   "--audience", "connections", "--tenant", "acme", "--principal", "ana").stdout)
    claims = claims_of(issued["token"])
    assert (claims["aud"], claims["tenant"], claims["principal"]) == ("connections", "acme", "ana")
