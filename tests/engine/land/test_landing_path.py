"""The landing path end to end: relational normalization and the secret guard inside
``contextful pipeline run``, read back through the DuckDB read path."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from datasets.gharchive import expected_counts, generate_events, write_shards
from engine.normalize import reassemble
from storage import Store
from tests.engine.guard.synthetic import CREDENTIALS
from tests.support.cli import contextful

PROJECT = """
[project]
name = "landing"

[[pipeline]]
id = "gh"
table = "gh"
normalize = "{mode}"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def project(tmp_path: Path, mode: str) -> Path:
    (tmp_path / "contextful.toml").write_text(PROJECT.format(mode=mode))
    (tmp_path / "raw").mkdir(exist_ok=True)
    return tmp_path


def sql(root: Path, query: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(contextful(root, "--json", "sql", query).stdout)
    return rows


def test_relational_landing_lands_child_tables_that_join_back_to_their_parents(tmp_path: Path) -> None:
    root = project(tmp_path, "relational")
    n = 2000
    write_shards(n, root / "raw", shards=2, seed=5)
    out = json.loads(contextful(root, "--json", "pipeline", "run").stdout)[0]
    tables = {t["table"]: t["rows"] for t in out["tables"]}
    counts = expected_counts(n, seed=5)
    assert tables["gh"] == n and tables["gh__payload__commits"] == counts["push_commits"]
    joined = sql(root, "SELECT count(*) AS n FROM gh__payload__commits c JOIN gh p ON c._cf_parent_id = p._cf_id "
                       "WHERE p.type = 'PushEvent'")
    assert joined == [{"n": counts["push_commits"]}]
    by_type = sql(root, "SELECT type, count(*) AS n FROM gh GROUP BY type")
    assert {r["type"]: r["n"] for r in by_type} == counts["by_type"]
    # the relational tables reassemble into the nested events, list order and all
    with Store.open(root / ".contextful" / "store") as store:
        landed = {name: store.table(name).to_arrow() for name in store.table_names()}
    nested = reassemble(landed, "gh").to_pylist()
    source = list(generate_events(n, seed=5, shards=2))
    by_id = {e["id"]: e for e in nested}
    sample = random.Random(3).sample(source, 50)
    for event in sample:
        got = by_id[event["id"]]
        assert [c["sha"] for c in (got["payload"].get("commits") or [])] == \
            [c["sha"] for c in (event["payload"].get("commits") or [])]
        assert got["actor"]["login"] == event["actor"]["login"]


def test_relational_schema_evolution_adds_columns_and_child_tables_across_runs(tmp_path: Path) -> None:
    root = project(tmp_path, "relational")
    first = [{"id": 1, "items": [{"sku": "a", "qty": 1}]}]
    (root / "raw" / "1.ndjson").write_text("\n".join(json.dumps(r) for r in first) + "\n")
    contextful(root, "pipeline", "run")
    later = [{"id": 2, "items": [{"sku": "b", "qty": 2.5, "note": "gift"}], "tags": ["x", "y"]}]
    (root / "raw" / "2.ndjson").write_text("\n".join(json.dumps(r) for r in later) + "\n")
    out = json.loads(contextful(root, "--json", "pipeline", "run").stdout)[0]
    tables = {t["table"]: t for t in out["tables"]}
    assert "gh__tags" in tables and tables["gh__tags"]["rows"] == 2  # a new list: a new child table
    events = tables["gh__items"]["downgrade_events"]
    assert [(e["table"], e["path"], e["landed_type"]) for e in events] == [("gh__items", "qty", "double")]
    rows = sql(root, "SELECT sku, qty, note FROM gh__items ORDER BY sku")
    assert rows == [{"sku": "a", "qty": 1.0, "note": None}, {"sku": "b", "qty": 2.5, "note": "gift"}]
    assert sql(root, "SELECT value FROM gh__tags ORDER BY _cf_list_idx") == [{"value": "x"}, {"value": "y"}]


@pytest.mark.clause("run.guard-secrets.mask-only")
@pytest.mark.parametrize("mode", ["nested", "relational"])
def test_planted_credentials_never_reach_the_store(tmp_path: Path, mode: str) -> None:
    root = project(tmp_path, mode)
    rng = random.Random(9)
    planted: list[str] = []
    events = list(generate_events(300, seed=4))
    for i, event in enumerate(events[::10]):
        key = CREDENTIALS["github-token" if i % 2 else "aws-access-key-id"](rng)
        planted.append(key)
        event["actor"]["login"] = f"user {key} here"  # nested in a struct
        commits = event["payload"].get("commits")
        if commits:
            llm = CREDENTIALS["llm-api-key"](rng)
            planted.append(llm)
            commits[0]["message"] = f"fix: rotate {llm}"  # nested in a list of structs
    (root / "raw" / "planted.ndjson").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    run = contextful(root, "--json", "pipeline", "run")
    out = json.loads(run.stdout)[0]
    assert out["ok"]  # the guard masks; it blocks nothing
    masked = {t["table"]: t["masked_cells"] for t in out["tables"]}
    assert masked["gh"]["actor.login"] == 30
    in_commits = sum(masked[t].get("payload.commits.message", 0) + masked[t].get("message", 0) for t in masked)
    assert masked["gh"]["actor.login"] + in_commits == len(planted)  # one cell per planted value
    for path in (root / ".contextful").rglob("*"):
        if not path.is_file():
            continue
        data = path.read_bytes()
        texts = [data]
        if path.suffix == ".parquet":
            texts.append(json.dumps(pq.read_table(path).to_pylist(), default=str).encode())
        for key in planted:
            assert all(key.encode() not in t for t in texts), f"{key[:6]}… reached {path}"
    for key in planted:
        assert key not in run.stdout and key not in run.stderr
    logins = sql(root, "SELECT actor.login AS login FROM gh" if mode == "nested" else
                 "SELECT actor__login AS login FROM gh")
    assert sum("[masked:" in r["login"] for r in logins) == 30
