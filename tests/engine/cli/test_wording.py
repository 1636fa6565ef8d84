"""The smaller wording items of the command line: a downgrade line that says what happened, no
``(declared: )`` with nothing after it, a seed that changed says how to recover, and no ``None``
in a receive error."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.cli import contextful


def test_a_widened_column_says_the_column_widened_to_hold_what_arrived(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "w"\n')
    (tmp_path / "a.ndjson").write_text('{"id": 1}\n')
    (tmp_path / "b.ndjson").write_text('{"id": 2.5}\n')
    contextful(tmp_path, "table", "load", "events", str(tmp_path / "a.ndjson"))
    line = "  downgrade events.id: column widened from int64 to double to hold the double that arrived"
    assert contextful(tmp_path, "table", "load", "events", str(tmp_path / "b.ndjson")).stdout.splitlines()[1] == line
    assert contextful(tmp_path, "run", "history").stdout.splitlines()[-1].endswith(line.strip())


def test_a_value_converted_on_landing_says_what_arrived_and_what_landed(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "w"\n')
    (tmp_path / "a.ndjson").write_text('{"id": 1.5}\n')
    (tmp_path / "b.ndjson").write_text('{"id": 2}\n')
    contextful(tmp_path, "table", "load", "events", str(tmp_path / "a.ndjson"))
    out = contextful(tmp_path, "table", "load", "events", str(tmp_path / "b.ndjson")).stdout.splitlines()
    assert out[1] == "  downgrade events.id: arrived int64, landed double (int64 lands as double (table column is double))"


@pytest.mark.parametrize("words", [("pipeline", "run", "nope"), ("pipeline", "plan", "nope"), ("build", "run", "nope"),
                                   ("export", "run", "nope")])
def test_an_unknown_name_in_a_manifest_declaring_none_says_none_declared(tmp_path: Path, words: tuple[str, ...]) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "empty"\n')
    proc = contextful(tmp_path, *words, check=False)
    assert proc.returncode == 2 and "'nope' (none declared)" in proc.stderr and "declared: )" not in proc.stderr
    assert not (tmp_path / ".contextful").exists()


def test_an_unknown_name_lists_what_is_declared(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "one"\n\n[[model]]\nname = "m"\nsql = "SELECT 1 AS x"\n')
    proc = contextful(tmp_path, "build", "run", "nope", check=False)
    assert proc.returncode == 2 and "no model 'nope' (declared: m)" in proc.stderr


SEEDED = """\
[project]
name = "seeded"

[[pipeline]]
id = "events"
primary_key = ["id"]
order_by = "at"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["live/*.ndjson"]
{seed}"""

SEED = """[pipeline.seed]
paths = ["seed/*.ndjson"]
ceiling = "2026-01-01T00:00:00Z"
"""


def test_a_changed_seed_says_how_to_recover_and_the_recovery_works(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(SEEDED.format(seed=SEED))
    (tmp_path / "seed").mkdir()
    (tmp_path / "live").mkdir()
    (tmp_path / "seed" / "old.ndjson").write_text('{"id": 1, "at": "2025-06-01T00:00:00Z"}\n')
    contextful(tmp_path, "pipeline", "run")
    (tmp_path / "seed" / "old.ndjson").write_text('{"id": 1, "at": "2025-06-02T00:00:00Z"}\n')
    proc = contextful(tmp_path, "pipeline", "run", check=False)
    assert proc.returncode == 5
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: PipelineSeedSourceChanged: pipeline 'events': the seed landed from fingerprint ")
    assert line.endswith("a seed lands once: restore the seed files it landed from, or remove the pipeline's "
                         "[pipeline.seed] block (the rows the seed landed stay)")
    (tmp_path / "contextful.toml").write_text(SEEDED.format(seed=""))  # the recovery the message names
    (tmp_path / "live" / "new.ndjson").write_text('{"id": 2, "at": "2026-02-01T00:00:00Z"}\n')
    assert json.loads(contextful(tmp_path, "--json", "pipeline", "run").stdout)[0]["ok"]
    assert json.loads(contextful(tmp_path, "--json", "sql", "SELECT count(*) AS n FROM events").stdout) == [{"n": 2}]


RECEIVING = """\
[project]
name = "rcv"

[[pipeline]]
id = "clicks"
[pipeline.source]
kind = "receive"
[pipeline.source.config]
key_retention_secs = 3600
max_body_bytes = 1024
"""


def test_a_receive_error_for_a_batch_without_a_key_names_no_none(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(RECEIVING)
    token = contextful(tmp_path, "pipeline", "key", "issue", "clicks").stdout.strip()
    child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline",
                              "serve", "--http", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None
        url = urlsplit(child.stdout.readline().split()[-1])  # "listening on URL": waits until it serves
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        conn.request("POST", "/pipelines/clicks/batches", body=b"x" * 2048,
                     headers={"Authorization": f"Bearer {token}"})
        reply = conn.getresponse()
        body = json.loads(reply.read())
    finally:
        child.terminate()
        child.wait(timeout=60)
    assert reply.status == 413 and body["error"] == "RequestBodyTooLarge"
    assert "None" not in body["detail"]
    assert body["detail"].startswith("a batch without a Contextful-Batch-Key header to pipeline 'clicks': ")
