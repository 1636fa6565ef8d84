"""Secret references in an http source's headers: ``${secret:NAME}`` resolved from the environment
or the project's ``.contextful/secrets.toml`` at request time, the value masked everywhere else.

The server is a real API on loopback recording the headers it received; every command is
``contextful`` in a child process, as a user runs it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.cli import contextful_in
from tests.support.http_api import JsonApi, Reply, Request

TOKEN = "tok-7Qz9-not-a-real-credential-41c2"
"""The secret's value: it must reach the server and appear in no output, record or file."""
REFERENCE = "${secret:SHOP_API_TOKEN}"


@pytest.fixture
def api() -> JsonApi:
    with JsonApi() as server:
        server.route("/items", lambda _r: Reply(200, [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]))

        def refuse(request: Request) -> Reply:  # an API echoing the credential it refuses
            return Reply(401, {"error": f"token rejected: {request.headers.get('authorization')}"})

        server.route("/refuse", refuse)
        yield server


def _pipeline(pipeline_id: str, url: str, header: str = f"Bearer {REFERENCE}") -> str:
    return (f'\n[[pipeline]]\nid = "{pipeline_id}"\nprimary_key = ["id"]\n[pipeline.source]\nkind = "http"\n'
            f'[pipeline.source.config]\nurl = "{url}"\nretry = {{ attempts = 1 }}\n'
            f'headers = {{ Authorization = "{header}", Accept = "application/json" }}\n')


def project(root: Path, api: JsonApi) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text('[project]\nname = "shop"\n' + _pipeline("items", f"{api.url}/items")
                                          + _pipeline("refused", f"{api.url}/refuse"))
    return root


def cli(root: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return contextful_in(root, *args, env={"SHOP_API_TOKEN": "", **(env or {})}, check=check)


def leaked_in(root: Path, *, allowed: set[Path] = frozenset()) -> list[str]:
    """Every file under the project (store, catalog, journal, applied versions) holding the value."""
    return [str(p) for p in root.rglob("*") if p.is_file() and p not in allowed and TOKEN.encode() in p.read_bytes()]


def test_an_environment_secret_reaches_the_server_and_nothing_else(tmp_path: Path, api: JsonApi) -> None:
    root = project(tmp_path / "p", api)
    env = {"SHOP_API_TOKEN": TOKEN}
    outputs = [cli(root, "pipeline", "validate", env=env), cli(root, "--json", "pipeline", "plan", env=env),
               cli(root, "pipeline", "plan", env=env), cli(root, "pipeline", "run", "items", env=env)]
    assert [r.headers.get("authorization") for r in api.requests] == [f"Bearer {TOKEN}"]
    assert api.requests[0].headers["accept"] == "application/json"
    refused = cli(root, "pipeline", "run", "refused", env=env, check=False)
    assert refused.returncode != 0 and len(api.requests) == 2
    assert "401" in refused.stdout + refused.stderr and f"token rejected: Bearer {REFERENCE}" in refused.stderr, \
        refused.stderr
    outputs += [refused, cli(root, "--json", "run", "history", env=env), cli(root, "run", "history", env=env)]
    history = json.loads(outputs[-2].stdout)
    failed = [run for run in history if run.get("status") == "failed"]
    assert failed, history
    outputs += [cli(root, "--json", "run", "show", run["run_id"], env=env) for run in history if run.get("run_id")]
    outputs += [cli(root, "pipeline", "import", env=env)]  # the applied snapshot keeps the reference
    for proc in outputs:
        assert TOKEN not in proc.stdout + proc.stderr, proc.args
    assert REFERENCE in json.dumps(history) or any(REFERENCE in p.stderr for p in outputs)
    assert leaked_in(root) == []
    applied = [p for p in (root / ".contextful").rglob("*.toml") if "control" in str(p)]
    assert applied and all(REFERENCE in p.read_text() for p in applied)
    from contextful.engine.project import open_project_store
    from contextful.engine.read import connect

    with open_project_store(root) as store:
        con = connect(store)
        try:
            assert con.execute("SELECT id, name FROM items ORDER BY id").fetchall() == [(1, "a"), (2, "b")]
        finally:
            con.close()


def test_a_secret_from_the_project_secrets_file(tmp_path: Path, api: JsonApi) -> None:
    root = project(tmp_path / "p", api)
    secrets = root / ".contextful" / "secrets.toml"
    secrets.parent.mkdir(parents=True)
    secrets.write_text(f'SHOP_API_TOKEN = "{TOKEN}"\n')
    cli(root, "pipeline", "validate")
    ran = cli(root, "pipeline", "run", "items")
    assert [r.headers.get("authorization") for r in api.requests] == [f"Bearer {TOKEN}"]
    assert TOKEN not in ran.stdout + ran.stderr
    assert leaked_in(root, allowed={secrets}) == []
    # the environment is read first: a variable set wins over the file
    cli(root, "pipeline", "run", "items", env={"SHOP_API_TOKEN": "from-the-environment"})
    assert api.requests[-1].headers["authorization"] == "Bearer from-the-environment"


def test_a_missing_secret_refuses_before_any_request(tmp_path: Path, api: JsonApi) -> None:
    root = project(tmp_path / "p", api)
    for args in (("pipeline", "validate"), ("pipeline", "plan"), ("pipeline", "run", "items")):
        proc = cli(root, *args, check=False)
        assert proc.returncode != 0, args
        text = proc.stdout + proc.stderr
        assert "SecretUnresolved" in text, (args, text)
        assert f"{REFERENCE} is not set" in text and "environment variable SHOP_API_TOKEN" in text, text
        assert str(root / ".contextful" / "secrets.toml") in text, text
        assert "source.config.headers.Authorization" in text, text
    assert api.requests == []
    # a reference outside headers, or one naming no variable, is refused by name at validate
    (root / "contextful.toml").write_text('[project]\nname = "shop"\n'
                                          + _pipeline("items", f"{api.url}/items?key={REFERENCE}")
                                          + _pipeline("other", f"{api.url}/items", header="Bearer ${secret:no-such}"))
    proc = cli(root, "pipeline", "validate", check=False)
    assert "ManifestValueInvalid" in proc.stderr and "secret references are read in headers only" in proc.stderr
    assert "${secret:no-such} does not name a secret" in proc.stderr, proc.stderr
    assert api.requests == []
