"""The control routes as ``contextful pipeline serve --http`` hosts them: a real child process.

What only the command shows: the owner it was started with (no issuer key pinned, no store), and
operator nonces kept in the store's control state across a restart of the serve process.
Attestations ride this machine's clock, as a browser's do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.control.credentials import generate_key, load_signing_key
from contextful.storage import Store

from tests.engine.served.control_face import (
    PIPELINE,
    Console,
    attestation,
    manifest_text,
    pointer,
    request,
    version_text,
)
from tests.support.cli import contextful

RECEIVE = """
[[pipeline]]
id = "clicks"
source = { kind = "receive", config = { key_retention_secs = 3600 } }
"""


@contextmanager
def serving(project: Path) -> Iterator[str]:
    """``contextful pipeline serve --http 127.0.0.1:0`` in a child process; its URL. SIGTERM at the end."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "pipeline",
                             "serve", "--http", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the address is bound
        found = re.fullmatch(r"listening on (\S+)\n", line)
        assert found is not None, line + (proc.stderr.read() if proc.stderr else "")
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""


@pytest.mark.clause("surface.apply.owner-unconfigured")
def test_a_serve_with_no_issuer_key_or_no_store_answers_owner_unconfigured(tmp_path: Path) -> None:
    pin, key_file = generate_key(tmp_path / "keys" / "issuer.pem")
    project = tmp_path / "project"
    project.mkdir()
    (project / "contextful.toml").write_text(manifest_text(None, RECEIVE))
    contextful(project, "pipeline", "import")
    console = Console(load_signing_key(key_file), "")
    console.token = console.credential()
    with serving(project) as url:
        console.url = url
        assert_unconfigured(console, "no issuer key is pinned")
    assert pointer(project) == "1\n"

    # an issuer key pinned, but no store to hold the control state: no local writer stands in
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "contextful.toml").write_text(manifest_text(pin.text, ""))
    with serving(alone) as url:
        console.url = url
        assert_unconfigured(console, "no store")
        assert error_of(request(url, "GET", "/control/document")) == (401, "CredentialUnadmitted")  # admission first
    assert not (alone / ".contextful").exists()


def error_of(answer: tuple[int, dict]) -> tuple[int, str]:
    return answer[0], answer[1]["error"]


def assert_unconfigured(console: Console, missing: str) -> None:
    """Every control route answers 503 ConfigOwnerUnconfigured naming what is ``missing``."""
    for status, answer in (console.get(), console.post("/control/draft", {"document": "[project]\n", "version": 1}),
                           console.post("/control/apply", {"draft": "d1"})):
        assert (status, answer["error"]) == (503, "ConfigOwnerUnconfigured")
        assert missing in answer["detail"]


@pytest.mark.clause("surface.apply.operator-attestation", "surface.edit.store-draft", "surface.apply.draft-claim")
def test_a_nonce_stays_spent_across_a_restart_of_serve(tmp_path: Path) -> None:
    pin, key_file = generate_key(tmp_path / "keys" / "issuer.pem")
    project = tmp_path / "project"
    project.mkdir()
    (project / "contextful.toml").write_text(manifest_text(pin.text, PIPELINE.replace('schedule = "every 10m"\n', "")))
    contextful(project, "pipeline", "import")
    Store.open(load_manifest(project).project.store).close()  # the store the control state lives in
    console = Console(load_signing_key(key_file), "")
    console.token = console.credential()
    document = version_text(project, 1).split("\n# Written by")[0] + RECEIVE
    body = json.dumps({"document": document, "version": 1}).encode()
    header = attestation(console.console, console.operator, "POST", "/control/draft", body)
    sent = {"Content-Type": "application/json", "Authorization": f"Bearer {console.token}",
            "Contextful-Attestation": header}
    with serving(project) as url:
        status, saved = request(url, "POST", "/control/draft", body, sent)
        assert status == 200, saved
    with serving(project) as url:  # a new serve process over the same store
        status, answer = request(url, "POST", "/control/draft", body, sent)
        assert (status, answer["error"]) == (401, "ControlOperatorAttestationInvalid")
        assert "accepted before" in answer["detail"]
        console.url = url
        shown = console.get()[1]
        assert shown["draft"]["id"] == saved["draft"] and pointer(project) == "1\n"
        assert console.post("/control/apply", {"draft": saved["draft"]})[1] == \
            {"version": 2, "previous": 1, "claimed": True}
    assert pointer(project) == "2\n" and 'id = "clicks"' in version_text(project, 2)
