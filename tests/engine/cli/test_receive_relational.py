"""A ``receive`` pipeline with ``normalize = "relational"``: nested batches pushed over real HTTP to
``contextful pipeline serve`` land as a root table and one child table per list, keyed as the files
path keys them, in one commit per batch; a retried key replays and lands nothing twice."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from contextful.engine.land.receive import writers

from tests.engine.land.test_receive import _env, post
from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "orders"

[[pipeline]]
id = "orders"
primary_key = ["id"]
normalize = "relational"

[pipeline.source]
kind = "receive"

[pipeline.source.config]
key_retention_secs = 600
"""

BATCH = b"".join(json.dumps(o).encode() + b"\n" for o in [
    {"id": 1, "customer": {"name": "ada"}, "lines": [{"sku": "a", "qty": 2, "tags": ["x", "y"]}, {"sku": "b", "qty": 1}]},
    {"id": 2, "customer": {"name": "bob"}, "lines": [{"sku": "c", "qty": 5, "tags": []}]},
])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    token = writers.issue(tmp_path, ["orders"]).token
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline",
                             "serve", "--receive-http", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+) \(receive\)\n", line)
        assert match is not None, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield tmp_path, match.group(1), token
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def rows(project: Path, sql: str) -> list[dict[str, object]]:
    return json.loads(contextful(project, "--json", "sql", sql).stdout)


def test_validate_accepts_a_relational_receive_pipeline(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    assert contextful(tmp_path, "pipeline", "validate").returncode == 0


def test_pushed_nested_batches_land_relationally(served: tuple[Path, str, str]) -> None:
    project, url, token = served
    status, answer = post(url, "b1", BATCH, pipeline="orders", token=token)
    assert status == 200, answer
    landed = {t["table"]: t["rows"] for t in answer["tables"]}
    assert landed == {"orders": 2, "orders__lines": 3, "orders__lines__tags": 2}
    assert len({t["commit_seq"] for t in answer["tables"]}) == 1  # one commit for every table
    again = post(url, "b1", BATCH, pipeline="orders", token=token)[1]
    assert again["replayed"] is True

    assert rows(project, "SELECT id, customer__name FROM orders ORDER BY id") == [
        {"id": 1, "customer__name": "ada"}, {"id": 2, "customer__name": "bob"}]
    lines = rows(project, "SELECT o.id, l.sku, l.qty FROM orders o JOIN orders__lines l ON l._cf_parent_id = o._cf_id"
                          " ORDER BY o.id, l._cf_list_idx")
    assert lines == [{"id": 1, "sku": "a", "qty": 2}, {"id": 1, "sku": "b", "qty": 1}, {"id": 2, "sku": "c", "qty": 5}]
    tags = rows(project, "SELECT l.sku, t.value FROM orders__lines l JOIN orders__lines__tags t"
                         " ON t._cf_parent_id = l._cf_id ORDER BY t._cf_list_idx")
    assert tags == [{"sku": "a", "value": "x"}, {"sku": "a", "value": "y"}]
    listed = {r["table"]: r for r in json.loads(contextful(project, "--json", "table", "list").stdout)}
    assert listed["orders"]["primary_key"] == ["id"]
    assert listed["orders__lines"]["primary_key"] == ["_cf_id"] and listed["orders__lines"]["rows_stored"] == 3
