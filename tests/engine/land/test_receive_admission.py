"""Who the receive routes admit: writer keys naming the pipeline, and nobody else.

Real servers on loopback (``serve_receivers``, ``serve_project``, the ``contextful`` command in a
child process); keys issued through the library and the CLI.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from contextful.engine.export import readers
from contextful.engine.land.receive import writers
from contextful.engine.served.project import serve_project
from contextful.storage import Store
from contextful.storage.errors import ReaderCredentialUnadmitted, WriterCredentialUnadmitted

from tests.engine.land.test_receive import (
    PIPELINE,
    TOKENS,
    Serve,
    _env,
    ndjson,
    post,
    queue_dir,
    rows_by_batch,
    serve,
    sidecars,
)
from tests.support.cli import contextful

__all__ = ["serve"]  # the fixture, imported for this module's tests

RECEIVE_TOML = """
[[pipeline]]
id = "clicks"
[pipeline.source]
kind = "receive"
[pipeline.source.config]
key_retention_secs = 60

[[pipeline]]
id = "views"
[pipeline.source]
kind = "receive"
[pipeline.source.config]
key_retention_secs = 60
"""


def get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_receive_routes_admit_only_live_writer_keys_naming_the_pipeline(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    own = TOKENS[server.url]
    other = writers.issue(tmp_path, ["views"])
    reader = readers.issue(tmp_path, "analysts")
    forged = own[:-4] + ("AAAA" if not own.endswith("AAAA") else "BBBB")
    for token in (None, "not-a-key", forged, reader.token):
        status, doc = post(server.url, "k1", ndjson("k1", 2), token=token)
        assert (status, doc["error"]) == (401, "WriterCredentialUnadmitted"), token
    status, doc = post(server.url, "k1", ndjson("k1", 2), headers={"Authorization": f"Basic {own}"}, token=None)
    assert (status, doc["error"]) == (401, "WriterCredentialUnadmitted")
    status, doc = post(server.url, "k1", ndjson("k1", 2), token=other.token)
    assert (status, doc["error"]) == (403, "WriterPipelineRefused")
    assert other.key.key_id in doc["detail"] and "'clicks'" in doc["detail"]
    # an unknown pipeline answers no differently from one the caller may not write: nothing is listed
    status, doc = post(server.url, "k1", ndjson("k1", 2), pipeline="secret", token=None)
    assert (status, doc["error"]) == (401, "WriterCredentialUnadmitted")
    status, doc = post(server.url, "k1", ndjson("k1", 2), pipeline="secret")
    assert (status, doc["error"]) == (403, "WriterPipelineRefused") and PIPELINE not in doc["detail"]
    assert rows_by_batch(tmp_path) == {} and sidecars(tmp_path) == []
    assert list((queue_dir(tmp_path) / "incoming").iterdir()) == []

    assert post(server.url, "k1", ndjson("k1", 2))[0] == 200
    both = writers.issue(tmp_path, ["views", PIPELINE])
    assert post(server.url, "k2", ndjson("k2", 1), token=both.token)[0] == 200
    writers.revoke(tmp_path, both.key.key_id)
    status, doc = post(server.url, "k3", ndjson("k3", 1), token=both.token)
    assert (status, doc["error"]) == (401, "WriterCredentialUnadmitted") and "revoked" in doc["detail"]
    assert rows_by_batch(tmp_path) == {"k1": 2, "k2": 1}


def test_writer_keys_never_admit_queries_and_reader_keys_never_admit_writes(tmp_path: Path) -> None:
    writer = writers.issue(tmp_path, [PIPELINE])
    reader = readers.issue(tmp_path, "analysts")
    with pytest.raises(ReaderCredentialUnadmitted):
        readers.admit(tmp_path, f"Bearer {writer.token}")  # what the gateway's /query and /exports admit
    assert readers.admit(tmp_path, f"Bearer {reader.token}") == "analysts"
    with pytest.raises(WriterCredentialUnadmitted):
        writers.admit(tmp_path, f"Bearer {reader.token}", PIPELINE)
    assert writers.admit(tmp_path, f"Bearer {writer.token}", PIPELINE).key_id == writer.key.key_id


def test_writer_keys_are_stored_hashed_and_owner_only(tmp_path: Path) -> None:
    issued = writers.issue(tmp_path, ["views", PIPELINE, PIPELINE])
    assert issued.key.pipelines == (PIPELINE, "views")
    stored = tmp_path / writers.WRITERS_DIR / f"{issued.key.key_id}.json"
    assert re.fullmatch(r"cfw_[0-9a-f]{16}_[A-Za-z0-9_-]{43}", issued.token)
    secret = issued.token[len("cfw_") + 16 + 1:]
    assert len(secret) == 43 and secret not in stored.read_text()
    assert stored.stat().st_mode & 0o777 == 0o600
    assert stored.parent.stat().st_mode & 0o777 == 0o700
    assert [k.key_id for k in writers.list_keys(tmp_path)] == [issued.key.key_id]


def test_the_cli_issues_lists_and_revokes_writer_keys(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(RECEIVE_TOML)
    issued = contextful(tmp_path, "pipeline", "key", "issue", "clicks", "views")
    token = issued.stdout.strip()
    assert re.fullmatch(r"cfw_[0-9a-f]{16}_[A-Za-z0-9_-]{43}", token), issued.stdout
    key_id = token[4:20]
    listed = json.loads(contextful(tmp_path, "--json", "pipeline", "key", "list").stdout)
    assert listed == [{"key_id": key_id, "pipelines": ["clicks", "views"], "created_at": listed[0]["created_at"],
                       "revoked_at": None}]
    assert token[21:] not in contextful(tmp_path, "pipeline", "key", "list").stdout
    unknown = contextful(tmp_path, "pipeline", "key", "issue", "nope", check=False)
    assert unknown.returncode != 0 and "'nope'" in unknown.stderr
    contextful(tmp_path, "pipeline", "key", "revoke", key_id)
    assert json.loads(contextful(tmp_path, "--json", "pipeline", "key", "list").stdout)[0]["revoked_at"]
    missing = contextful(tmp_path, "pipeline", "key", "revoke", "0123456789abcdef", check=False)
    assert missing.returncode != 0 and "0123456789abcdef" in missing.stderr


def test_healthz_and_not_found_name_nothing(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    assert get(server.url, "/healthz") == (200, {"ok": True})
    status, doc = get(server.url, "/nowhere")
    assert (status, doc["error"]) == (404, "NotFound")
    assert PIPELINE not in str(doc["detail"]) and "batches" not in str(doc["detail"])


def test_serve_puts_receive_and_the_gateway_on_separate_addresses(tmp_path: Path, decoder: object) -> None:
    from tests.engine.export.test_gateway import call, make_project, project_toml

    manifest = make_project(tmp_path, project_toml() + RECEIVE_TOML)
    reader = readers.issue(tmp_path, "analysts").token
    writer = writers.issue(tmp_path, [PIPELINE]).token
    served = serve_project(manifest, lambda: Store.open(manifest.project.store), None,
                           receive_address="127.0.0.1:0", gateway_address="127.0.0.1:0",
                           decoder=decoder, queue_root=tmp_path / ".contextful" / "queue")  # type: ignore[arg-type]
    try:
        receive_url, gateway_url = served.urls["receive"], served.urls["gateway"]
        assert receive_url != gateway_url
        query = {"table": "orders", "template": "all"}
        assert call(gateway_url, "POST", "/query", query, reader)[0] == 200
        assert call(receive_url, "POST", "/query", query, reader)[0] == 404
        assert post(gateway_url, "g1", ndjson("g1", 1), token=writer)[0] == 404
        assert post(receive_url, "r1", ndjson("r1", 2), token=writer)[0] == 200
        # a writer key never reads; a reader key never writes
        status, doc, _ = call(gateway_url, "POST", "/query", query, writer)
        assert (status, doc["error"]) == (401, "ReaderCredentialUnadmitted")
        status, doc, _ = call(gateway_url, "GET", "/exports", None, writer)
        assert (status, doc["error"]) == (401, "ReaderCredentialUnadmitted")
        status, body = post(receive_url, "r2", ndjson("r2", 1), token=reader)
        assert (status, body["error"]) == (401, "WriterCredentialUnadmitted")
        # the gateway reads a chunked query body too, and refuses one past its bound before reading it
        host, port = gateway_url.removeprefix("http://").rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", "/query", body=iter([json.dumps(query).encode()[:9], json.dumps(query).encode()[9:]]),
                         headers={"Authorization": f"Bearer {reader}", "Transfer-Encoding": "chunked"},
                         encode_chunked=True)
            response = conn.getresponse()
            assert (response.status, json.loads(response.read())["row_count"]) == (200, 4)
            conn.request("GET", "/exports", headers={"Authorization": f"Bearer {reader}"})  # the same connection
            response = conn.getresponse()
            assert (response.status, json.loads(response.read())["credential"]) == (200, "analysts")
            conn.putrequest("POST", "/query")
            conn.putheader("Authorization", f"Bearer {reader}")
            conn.putheader("Content-Length", str(2 << 20))
            conn.endheaders()
            response = conn.getresponse()
            assert (response.status, json.loads(response.read())["error"]) == (413, "RequestBodyTooLarge")
        finally:
            conn.close()
    finally:
        served.shutdown(grace_s=10)
    assert rows_by_batch(tmp_path) == {"r1": 2}


def test_the_serve_command_takes_separate_addresses(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(RECEIVE_TOML)
    writer = writers.issue(tmp_path, [PIPELINE]).token
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline", "serve",
                             "--receive-http", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+) \(receive\)\n", line)
        assert match is not None, (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
        assert post(match.group(1), "cli-1", ndjson("cli-1", 3), token=writer)[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert rows_by_batch(tmp_path) == {"cli-1": 3}
