"""``contextful pipeline plan`` and ``pipeline run`` text as a user reads it: the plan says in words
what ``--json`` says, and an http run's progress counts pages and rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import contextful
from tests.support.http_api import JsonApi, instant, watermark_pages

FILES = """\
[project]
name = "plan"

[[pipeline]]
id = "events"

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""

HTTP = """\
[project]
name = "plan"

[[pipeline]]
id = "events"
incremental = "updated_at"

[pipeline.source]
kind = "http"

[pipeline.source.config]
url = "{url}/items"
"""


@pytest.fixture
def api() -> Iterator[JsonApi]:
    with JsonApi() as server:
        yield server


def test_a_files_plan_names_the_first_inputs_and_counts_the_rest(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(FILES)
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.ndjson").write_text('{"id": 1}\n')
    (raw / "z.ndjson").write_text('{"id": 26}\n')
    contextful(tmp_path, "pipeline", "run")
    with (raw / "a.ndjson").open("a") as fh:  # appended: only its new bytes are pulled
        fh.write('{"id": 2}\n')
    (raw / "z.ndjson").write_text('{"id": 99}\n')  # rewritten: changed since it landed
    for name in "bcdefg":
        (raw / f"{name}.ndjson").write_text('{"id": 3}\n')

    planned = json.loads(contextful(tmp_path, "--json", "pipeline", "plan").stdout)["pipelines"][0]
    assert len(planned["pull"]) == 7 and planned["changed"] == [str(raw / "z.ndjson")]
    proc = contextful(tmp_path, "pipeline", "plan")
    lines = proc.stdout.splitlines()
    size = sum(p["bytes"] for p in planned["pull"])
    assert lines[:3] == ["events -> events (files)", f"  inputs to pull: 7 ({size} bytes)",
                         f"    {raw / 'a.ndjson'} (10 bytes, from byte 10)"]
    assert lines[3:7] == [f"    {raw / name}.ndjson (10 bytes)" for name in "bcde"]
    assert lines[7:] == ["    … and 2 more (--json lists every one)", "  already landed: 0",
                         f"  changed since it landed: {raw / 'z.ndjson'}"]
    assert "InputChanged" in proc.stderr  # the warning stays on stderr


def test_an_http_plan_shows_the_stored_position_and_first_request_and_progress_counts_pages(
        tmp_path: Path, api: JsonApi) -> None:
    api.records.extend({"id": i, "updated_at": f"2026-03-01T10:00:0{i}Z"} for i in range(5))
    api.route("/items", watermark_pages(api.records, "updated_at", 2, order=instant))
    (tmp_path / "contextful.toml").write_text(HTTP.format(url=api.url))

    first = contextful(tmp_path, "pipeline", "plan").stdout.splitlines()
    assert first == ["events -> events (http)", "  stored position: none (a first run starts from the beginning)",
                     f"  first request: {api.url}/items", "  rereads all: no"]

    ran = contextful(tmp_path, "pipeline", "run")
    progress = [line for line in ran.stderr.splitlines() if line.startswith("events: ")]
    # not on a terminal, pages (a walk of unknown length) print at most a line every 10 s, and the last
    assert [line.split(", ")[:2] for line in progress] == [["events: 1 page", "2 rows"], ["events: 3 pages", "5 rows"]]
    assert all("inputs" not in line and "MiB staged" in line for line in progress)

    planned = json.loads(contextful(tmp_path, "--json", "pipeline", "plan").stdout)["pipelines"][0]
    text = contextful(tmp_path, "pipeline", "plan").stdout.splitlines()
    assert text[1] == f"  stored position: {json.dumps(planned['position'])}"
    assert text[2] == f"  first request: {planned['first_request']}" and "since=" in planned["first_request"]
    assert planned["position"]["field"] == "updated_at" and text[3] == "  rereads all: no"


def test_a_keyed_http_source_without_incremental_says_it_rereads_all(tmp_path: Path, api: JsonApi) -> None:
    text = HTTP.format(url=api.url).replace('incremental = "updated_at"', 'primary_key = ["id"]')
    (tmp_path / "contextful.toml").write_text(text)
    out = contextful(tmp_path, "pipeline", "plan")
    assert out.stdout.splitlines()[-1] == "  rereads all: yes, every run reads the whole source (no incremental field)"
