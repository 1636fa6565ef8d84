"""The landing path end to end: relational normalization and the secret guard inside
``contextful pipeline run``, read back through the DuckDB read path."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from contextful.datasets.gharchive import expected_counts, generate_events, write_shards
from contextful.engine.normalize import reassemble
from contextful.storage import Store

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


NAMES_PROJECT = """
[project]
name = "landing"

[[pipeline]]
id = "gh"
table = "gh"
normalize = "{mode}"
types = {{ blob = "binary", data = "large_binary" }}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*"]
"""


@pytest.mark.clause("run.guard-secrets.mask-only")
@pytest.mark.parametrize("mode", ["nested", "relational"])
def test_credentials_in_names_map_keys_binary_and_escapes_never_reach_the_store_or_catalog(
        tmp_path: Path, mode: str) -> None:
    """Issue 11: names, map keys, binary declared by `types`, and escaped text, through `pipeline run`."""
    (tmp_path / "contextful.toml").write_text(NAMES_PROJECT.format(mode=mode))
    (tmp_path / "raw").mkdir()
    rng = random.Random(11)
    families = ("aws-access-key-id", "github-token", "npm-token", "llm-api-key", "stripe-secret-key",
                "slack-webhook", "huggingface-token", "gitlab-token", "sendgrid-api-key", "shopify-token",
                "databricks-api-token", "postman-api-token")
    key = [CREDENTIALS[name](rng) for name in families]
    slack = CREDENTIALS["slack-webhook"](rng)
    rows = [
        {"id": 1, key[0]: 1, "note": "a top-level column name"},
        {"id": 2, "outer": {key[1]: "x", "fine": "y", "deeper": {f"k_{key[2]}": 2}}},
        {"id": 3, "items": [{key[3]: 1, "sku": "a"}], f"list_{key[4]}": [1, 2]},
        {"id": 4, "blob": f"bytes {key[5]}", "data": f"more {key[6]}"},  # typed binary by `types`
        # escaped text inside string values: JSON kept as a string, and URL-encoding
        {"id": 5, "doc": json.dumps({"hook": "https://" + slack}).replace("/", "\\/"),
         "url": "https://x.example/cb?t=" + key[7].replace("-", "%2D")},
        {"id": 6, "doc": "{\"k\":\"" + key[8][:3] + "\\u00" + format(ord(key[8][3]), "02x") + key[8][4:] + "\"}",
         "url": "q=" + key[9].replace("_", "%5F")},
    ]
    (tmp_path / "raw" / "a.ndjson").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    maps = pa.array([[(key[10], 1), ("plain", 2), (key[11], 3)], [(key[10], 4)]], pa.map_(pa.string(), pa.int64()))
    pq.write_table(pa.table({"id": [7, 8], "attrs": maps}), tmp_path / "raw" / "b.parquet")
    planted = [*key, slack.replace("/", "\\/"), key[7].replace("-", "%2D"), key[9].replace("_", "%5F")]

    run = contextful(tmp_path, "--json", "pipeline", "run")
    out = json.loads(run.stdout)[0]
    assert out["ok"], out
    root = tmp_path / ".contextful"
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "catalog.sqlite" for p in files) and any(p.suffix == ".parquet" for p in files)
    for path in files:
        texts = [path.read_bytes()]
        if path.suffix == ".parquet":
            table = pq.read_table(path)
            texts.append(json.dumps([table.schema.names, table.to_pylist()], default=str).encode())
        if path.suffix == ".sqlite":  # every value of every table of the catalog, decompressed or not
            with sqlite3.connect(path) as con:
                for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                    texts.append(repr(con.execute(f'SELECT * FROM "{name}"').fetchall()).encode())
        for secret in planted:
            assert all(secret.encode() not in t for t in texts), f"{secret[:6]}… reached {path}"
    for secret in planted:
        assert secret not in run.stdout and secret not in run.stderr
    with Store.open(root / "store") as store:
        landed = {name: store.table(name).to_arrow() for name in store.table_names()}
    everything = json.dumps({n: [t.schema.names, t.to_pylist()] for n, t in landed.items()}, default=str)
    assert "[masked:aws-access-key-id]#" in everything and "[masked:slack-webhook]" in everything
    # binary stays binary, masked
    blob_table = landed["gh"]
    blob = blob_table.column("blob")
    assert pa.types.is_binary(blob.type) or pa.types.is_large_binary(blob.type)
    assert b"bytes [masked:slack-webhook]" in blob.to_pylist()
    # the read path reads every masked name and map (DuckDB refuses a map holding a key twice)
    read = contextful(tmp_path, "--json", "sql", "SELECT * FROM gh").stdout
    assert "[masked:" in read and not any(secret in read for secret in planted)
    if mode == "nested":
        attrs = [r["attrs"] for r in sql(tmp_path, "SELECT attrs FROM gh WHERE attrs IS NOT NULL ORDER BY id")]
        assert len(attrs) == 2 and all("[masked:databricks-api-token]#" in json.dumps(a) for a in attrs)


def test_distinct_credentials_in_a_key_column_never_merge_into_one_row(tmp_path: Path) -> None:
    """The guard masks a credential as ``[masked:<family>]``; in a key column that made every such
    key the same text, and their rows merged into one. A masked key cell keeps a digest suffix."""
    manifest = PROJECT.format(mode="nested").replace('normalize = "nested"', 'normalize = "nested"\nprimary_key = "token"')
    (tmp_path / "contextful.toml").write_text(manifest)
    (tmp_path / "raw").mkdir()
    keys = ["AKIA" + letter * 16 for letter in "QRS"]
    rows = [{"token": k, "n": i} for i, k in enumerate(keys)] + [{"token": keys[0], "n": 9}, {"token": "plain", "n": 7}]
    (tmp_path / "raw" / "a.ndjson").write_text("".join(json.dumps(r) + "\n" for r in rows))
    contextful(tmp_path, "pipeline", "run")
    landed = sql(tmp_path, "SELECT token, n FROM gh ORDER BY n")
    assert len(landed) == 4  # three distinct credentials and one plain key; the repeated key merged
    assert [r["n"] for r in landed] == [1, 2, 7, 9]
    masked = [r["token"] for r in landed if r["token"] != "plain"]
    assert all(t.startswith("[masked:aws-access-key-id]#") for t in masked) and len(set(masked)) == 3
    assert not any(k in json.dumps(landed) for k in keys)
