"""Iceberg exports: the [[export]] block, the audience preflight, and ``contextful export run/status``
end to end with pyiceberg's own scan as the reader."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config.manifest import Manifest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.export import namespace_for, preflight
from contextful.engine.export.run import run_exports
from contextful.storage import Store
from contextful.storage.errors import (
    ExportNamespaceShared,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)
from pyiceberg.catalog.sql import SqlCatalog

from tests.support.cli import contextful


def manifest(root: Path, text: str) -> Manifest:
    return parse_manifest(tomllib.loads('[project]\nname = "x"\n' + text), root)


def export_toml(name: str, namespace: str, credential: str, table: str | None = None, extra: str = "") -> str:
    line = f'table = "{table}"\n' if table else ""
    return (f'[[export]]\nname = "{name}"\nsource = "sales"\nnamespace = "{namespace}"\n'
            f'credential = "{credential}"\n{line}{extra}')


def problems(root: Path, text: str) -> list:
    with pytest.raises(ManifestInvalid) as info:
        manifest(root, text)
    return info.value.problems


def test_export_block_parses_with_defaults_and_refuses_unknown_keys(tmp_path: Path) -> None:
    m = manifest(tmp_path, export_toml("orders", "bi", "analysts", extra="format_version = 1\n")
                 + export_toml("remote", "ops", "ops_team", table="orders_v2",
                               extra='catalog = { type = "rest", uri = "http://127.0.0.1:8181", token = "t" }\n'))
    spec = m.export("orders")
    assert (spec.kind, spec.source, spec.namespace, spec.table, spec.credential, spec.format_version) == \
        ("iceberg", "sales", "bi", "orders", "analysts", 1)
    assert spec.catalog.type == "sql"
    assert spec.catalog.uri == f"sqlite:///{(tmp_path / '.contextful/iceberg/catalog.sqlite').resolve()}"
    assert spec.catalog.warehouse == (tmp_path / ".contextful/iceberg/warehouse").resolve().as_uri()
    remote = m.export("remote")
    assert remote.identifier == "ops.orders_v2"
    assert remote.catalog.pyiceberg_properties() == {"type": "rest", "uri": "http://127.0.0.1:8181", "token": "t"}

    found = problems(tmp_path, export_toml("orders", "bi", "analysts", extra='query = "x"\nformat_version = 3\n')
                     + '[[export]]\nname = "bad"\nsource = "sales"\nnamespace = "bi"\n')
    unknown = [p for p in found if isinstance(p, ManifestKeyUnknown)]
    assert [(p.block, p.key) for p in unknown] == [("[[export]] 'orders'", "query")]
    invalid = {(p.block, p.key) for p in found if isinstance(p, ManifestValueInvalid)}
    assert invalid == {("[[export]] 'orders'", "format_version"), ("[[export]] 'bad'", "credential")}


@pytest.mark.clause("run.export-iceberg.namespace-shared")
def test_preflight_refuses_shared_namespaces_credentials_and_tables(tmp_path: Path) -> None:
    cases = {
        "namespace": export_toml("a", "bi", "analysts") + export_toml("b", "bi", "finance"),
        "credential": export_toml("a", "bi", "analysts") + export_toml("b", "ops", "analysts"),
        "table": export_toml("a", "bi", "analysts") + export_toml("b", "bi", "analysts", table="a"),
    }
    for what, text in cases.items():
        shared = [p for p in problems(tmp_path, text) if isinstance(p, ExportNamespaceShared)]
        assert len(shared) == 1, what
        assert (shared[0].first, shared[0].second) == ("a", "b")
        assert "'a'" in str(shared[0]) and "'b'" in str(shared[0]) and what in shared[0].shared
    # One credential may publish several tables into its one namespace.
    ok = manifest(tmp_path, export_toml("a", "bi", "analysts") + export_toml("b", "bi", "analysts", table="b2"))
    assert preflight(ok)["analysts"].exports == ("a", "b")
    # The same names in another catalog are another namespace: still one credential each.
    other = 'catalog = { uri = "sqlite:////tmp/other.sqlite" }\n'
    assert len(manifest(tmp_path, export_toml("a", "bi", "analysts")
                        + export_toml("b", "bi", "finance", extra=other)).exports) == 2
    # The preflight refuses before any export runs, for a manifest built without the parser.
    bad = Manifest(tmp_path, ok.project, exports=(ok.export("a"), replace(ok.export("b"), table="a")))
    with pytest.raises(ExportNamespaceShared) as info:
        run_exports(None, bad)  # type: ignore[arg-type]  # refused before the store is touched
    assert (info.value.first, info.value.second) == ("a", "b")


@pytest.mark.clause("run.export-iceberg.audience")
def test_each_credential_maps_to_exactly_one_namespace(tmp_path: Path) -> None:
    m = manifest(tmp_path, export_toml("a", "bi", "analysts") + export_toml("b", "bi", "analysts", table="b2")
                 + export_toml("c", "fin", "finance"))
    mapping = preflight(m)
    assert {c: a.namespace for c, a in mapping.items()} == {"analysts": "bi", "finance": "fin"}
    namespaces = [(a.catalog.key, a.namespace) for a in mapping.values()]
    assert len(set(namespaces)) == len(namespaces)  # one-to-one
    # A reader's namespace comes from its credential alone.
    assert namespace_for(m, "analysts") == "bi" and namespace_for(m, "finance") == "fin"
    assert namespace_for(m, "stranger") is None


SALES = pa.table({"region": ["n", "n", "s"], "amount": pa.array([1, 2, 3], pa.int64())})
PROJECT = """
[project]
name = "exp"

[[model]]
name = "by_region"
sql = "SELECT region, sum(amount) AS total FROM sales GROUP BY region"

[[export]]
name = "sales_out"
source = "sales"
namespace = "bi"
credential = "analysts"

[[export]]
name = "regions"
source = "by_region"
namespace = "bi"
credential = "analysts"
format_version = 1
"""


def scan(project: Path, identifier: str) -> list[dict]:
    cat = SqlCatalog("contextful", uri=f"sqlite:///{project / '.contextful/iceberg/catalog.sqlite'}",
                     warehouse=(project / ".contextful/iceberg/warehouse").as_uri())
    rows = cat.load_table(identifier).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: tuple(str(v) for v in r.values()))


def test_export_run_and_status_end_to_end(tmp_path: Path) -> None:
    from contextful.engine.config import load_manifest
    from contextful.engine.model.build import build_models

    (tmp_path / "contextful.toml").write_text(PROJECT)
    m = load_manifest(tmp_path)
    with Store.open(m.project.store) as store:
        first = store.append("sales", SALES)
        build = build_models(store, m)[0]

    ran = contextful(tmp_path, "export", "run")
    assert "sales_out: 3 rows written" in ran.stderr and "regions: 2 rows written" in ran.stderr  # progress
    assert scan(tmp_path, "bi.sales_out") == [{"region": "n", "amount": 1}, {"region": "n", "amount": 2},
                                              {"region": "s", "amount": 3}]
    assert scan(tmp_path, "bi.regions") == [{"region": "n", "total": 3}, {"region": "s", "total": 3}]
    status = {s["export"]: s for s in json.loads(contextful(tmp_path, "--json", "export", "status").stdout)}
    assert status["sales_out"]["identifier"] == "bi.sales_out" and status["sales_out"]["rows"] == 3
    assert status["sales_out"]["source"] == {"kind": "table", "name": "sales", "commit_seq": first.commit_seq,
                                             "build_id": None}
    assert status["regions"]["source"]["build_id"] == build.build_id and status["regions"]["rows"] == 2
    assert status["regions"]["files"] == 1 and status["regions"]["credential"] == "analysts"
    first_snapshot = status["sales_out"]["snapshot_id"]

    # New data replaces the source's rows; a second export overwrites: the scan returns only the new rows.
    with Store.open(m.project.store) as store:
        second = store.table("sales").replace(pa.table({"region": ["e"], "amount": pa.array([9], pa.int64())}))
    out = json.loads(contextful(tmp_path, "--json", "export", "run", "sales_out").stdout)
    assert [r["export"] for r in out] == ["sales_out"] and out[0]["operation"] == "overwrite"
    assert scan(tmp_path, "bi.sales_out") == [{"region": "e", "amount": 9}]
    status = {s["export"]: s for s in json.loads(contextful(tmp_path, "--json", "export", "status").stdout)}
    assert status["sales_out"]["snapshot_id"] != first_snapshot
    assert status["sales_out"]["source"]["commit_seq"] == second.commit_seq and status["sales_out"]["rows"] == 1
    assert status["regions"]["source"]["build_id"] == build.build_id  # not re-run

    bad = contextful(tmp_path, "export", "run", "nope", check=False)
    assert bad.returncode != 0 and "nope" in bad.stderr


@pytest.mark.clause("run.export-iceberg.namespace-shared")
def test_validate_reports_a_shared_namespace_naming_both_exports(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "x"\n' + export_toml("a", "bi", "analysts")
                                              + export_toml("b", "bi", "finance"))
    proc = contextful(tmp_path, "pipeline", "validate", check=False)
    assert proc.returncode == 3
    assert "ExportNamespaceShared" in proc.stderr and "'a'" in proc.stderr and "'b'" in proc.stderr
    run = contextful(tmp_path, "export", "run", check=False)
    assert run.returncode == 3 and "ExportNamespaceShared" in run.stderr
    assert not (tmp_path / ".contextful" / "iceberg").exists()  # nothing reached a catalog


def test_export_progress_reports_rows_as_they_reach_the_writer(tmp_path: Path) -> None:
    from contextful.engine.config import load_manifest
    from contextful.engine.export.run import ExportProgress

    (tmp_path / "contextful.toml").write_text('[project]\nname = "p"\n' + export_toml("big", "bi", "analysts"))
    m = load_manifest(tmp_path)
    seen: list[ExportProgress] = []
    with Store.open(m.project.store) as store:
        for n in range(3):
            store.append("sales", pa.table({"region": ["n"] * 1000, "amount": pa.array([n] * 1000, pa.int64())}))
        (result,) = run_exports(store, m, progress=seen.append)
    assert result.rows == 3000
    assert seen and seen[-1].export == "big" and seen[-1].rows == 3000
    assert [p.rows for p in seen] == sorted(p.rows for p in seen)


def test_export_block_retention_keys_parse_and_refuse_bad_values(tmp_path: Path) -> None:
    from datetime import timedelta

    m = manifest(tmp_path, export_toml("a", "bi", "analysts")
                 + export_toml("b", "bi", "analysts", table="b2", extra='keep_snapshots = 3\nmax_snapshot_age = "7d"\n'))
    assert (m.export("a").keep_snapshots, m.export("a").max_snapshot_age) == (10, None)
    assert (m.export("b").keep_snapshots, m.export("b").max_snapshot_age) == (3, timedelta(days=7))
    assert manifest(tmp_path, export_toml("c", "bi", "analysts", extra='max_snapshot_age = "12h"\n')
                    ).export("c").max_snapshot_age == timedelta(hours=12)
    bad = {"keep_snapshots = 0\n": "keep_snapshots", "keep_snapshots = true\n": "keep_snapshots",
           'keep_snapshots = "3"\n': "keep_snapshots", 'max_snapshot_age = "7 days"\n': "max_snapshot_age",
           "max_snapshot_age = 7\n": "max_snapshot_age", 'max_snapshot_age = "0d"\n': "max_snapshot_age"}
    for line, key in bad.items():
        (found,) = problems(tmp_path, export_toml("a", "bi", "analysts", extra=line))
        assert isinstance(found, ManifestValueInvalid) and (found.block, found.key) == ("[[export]] 'a'", key), line
        assert key in str(found)


def test_an_export_whose_source_did_not_change_publishes_nothing_and_says_so(tmp_path: Path) -> None:
    from contextful.engine.config import load_manifest

    (tmp_path / "contextful.toml").write_text('[project]\nname = "p"\n' + export_toml("out", "bi", "analysts"))
    m = load_manifest(tmp_path)
    with Store.open(m.project.store) as store:
        store.append("sales", SALES)
    first = json.loads(contextful(tmp_path, "--json", "export", "run").stdout)[0]
    assert first["operation"] == "append"

    again = json.loads(contextful(tmp_path, "--json", "export", "run").stdout)[0]
    assert (again["operation"], again["snapshot_id"], again["rows"], again["files"]) == \
        ("unchanged", first["snapshot_id"], 0, 0)
    assert again["source"] == first["source"]
    text = contextful(tmp_path, "export", "run").stdout
    assert "out: unchanged" in text and "nothing published" in text and f"sales@{first['source']['commit_seq']}" in text
    cat = SqlCatalog("contextful", uri=f"sqlite:///{tmp_path / '.contextful/iceberg/catalog.sqlite'}",
                     warehouse=(tmp_path / ".contextful/iceberg/warehouse").as_uri())
    assert [s.snapshot_id for s in cat.load_table("bi.out").snapshots()] == [first["snapshot_id"]]

    # Another writer committed since: the table no longer holds what the state file says; export again.
    cat.load_table("bi.out").append(pa.table({"region": ["x"], "amount": pa.array([0], pa.int64())}))
    redo = json.loads(contextful(tmp_path, "--json", "export", "run").stdout)[0]
    assert redo["operation"] == "overwrite" and redo["rows"] == 3
    assert len(scan(tmp_path, "bi.out")) == 3
    # The source changed: export again.
    with Store.open(m.project.store) as store:
        store.append("sales", SALES)
    changed = json.loads(contextful(tmp_path, "--json", "export", "run").stdout)[0]
    assert changed["operation"] == "overwrite" and changed["rows"] == 6
    assert changed["source"]["commit_seq"] > first["source"]["commit_seq"]


def test_export_run_expires_snapshots_past_keep_snapshots(tmp_path: Path) -> None:
    from contextful.engine.config import load_manifest

    (tmp_path / "contextful.toml").write_text('[project]\nname = "p"\n'
                                              + export_toml("out", "bi", "analysts", extra="keep_snapshots = 2\n"))
    m = load_manifest(tmp_path)
    ran = []
    for n in range(4):
        with Store.open(m.project.store) as store:
            store.append("sales", pa.table({"region": [f"r{n}"], "amount": pa.array([n], pa.int64())}))
        ran.append(json.loads(contextful(tmp_path, "--json", "export", "run").stdout)[0])
    assert [r["expired"] for r in ran] == [[], [], [ran[0]["snapshot_id"]], [ran[1]["snapshot_id"]]]
    cat = SqlCatalog("contextful", uri=f"sqlite:///{tmp_path / '.contextful/iceberg/catalog.sqlite'}",
                     warehouse=(tmp_path / ".contextful/iceberg/warehouse").as_uri())
    table = cat.load_table("bi.out")
    assert [s.snapshot_id for s in table.snapshots()] == [ran[2]["snapshot_id"], ran[3]["snapshot_id"]]
    assert len(table.scan(snapshot_id=ran[2]["snapshot_id"]).to_arrow()) == 3
    assert len(table.scan().to_arrow()) == 4
    text = contextful(tmp_path, "export", "run").stdout
    assert "unchanged" in text and "expired" not in text
