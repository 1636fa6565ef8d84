"""Standalone table contracts in an applied version and the checks an applied job meets before its
execution opens (``engine.control.contracts``; docs/jobs.md, "What a job reads: the applied version").

Versions are claimed by ``contextful pipeline import`` / ``apply`` (real child processes) and read
back with ``load_version``; stores are every adapter's (``store``: local/SQLite, PostgreSQL catalog,
S3 root): :func:`_version` hands a version the contracts captured from the adapter's store; the
``contextful`` tests capture them through import and apply from the project's store.
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.config.manifest import Manifest
from contextful.engine.config.toml_writer import dumps
from contextful.engine.control.apply import load_applied, load_version
from contextful.engine.control.contracts import (
    AppliedContracts,
    TableContract,
    applied_contract,
    capture_contracts,
    check_applied,
    job_tables,
)
from contextful.engine.jobs.context import JobContext
from contextful.engine.model.build import build_models
from contextful.engine.project import open_project_store
from contextful.storage import Store
from contextful.storage.errors import (
    AppliedAuthorityChanged,
    AppliedContractMissing,
    AppliedModelDisclosureChanged,
    TableDeclarationChanged,
)

from tests.support.cli import contextful

HEAD = """\
[project]
name = "shop"
modules = ["contracts_bodies"]

[[pipeline]]
id = "events"
primary_key = ["id"]
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]

[[external]]
id = "crm"
table = "crm_accounts"
"""

MODEL = """
[[model]]
name = "daily"
sql = "SELECT count(*) AS n FROM events"
[model.contract]
version = "1.0"
grain = []
[model.contract.columns]
n = { type = "bigint", nullable = false }
"""

JOB = """
[[job]]
name = "score"
kind = "store-driven"
schedule = "every 1h"
body = "contracts_score"
statement = "SELECT d.id, d.body, e.v, daily.n FROM documents AS d JOIN events AS e ON e.id = d.id CROSS JOIN daily"
max_in_flight = 2
tables = ["scores"]
"""

BODIES = '''\
from contextful.engine.run.bodies import register_body


def score(item):
    return item


register_body("contracts_score", score)
'''


def _project(root: Path, text: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "raw").mkdir(exist_ok=True)
    (root / "contracts_bodies.py").write_text(BODIES)
    (root / "contextful.toml").write_text(text)
    return root


def _fill(store: Store) -> None:
    """The tables the job reads and writes: ``documents`` only ``table load`` writes, keyed and ordered;
    ``scores``, the job's output; ``events``, the pipeline's."""
    store.create_table("documents", ("id",), order_by="rev").append(
        pa.table({"id": pa.array([1, 2], pa.int64()), "rev": pa.array([1, 1], pa.int32()), "body": ["a", "b"]}))
    store.create_table("scores", ("id",)).append(pa.table({"id": pa.array([1], pa.int64()), "score": [0.5]}))
    store.create_table("events", ("id",)).append(pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["x", "y"]}))


def _version(root: Path, version: int, tables: dict[str, Any] | None) -> Manifest:
    """Version ``version`` as ``load_version`` reads it, holding ``tables``: the contracts
    ``capture_contracts`` takes from this adapter's store (import and apply take them from the
    project's own store, a local one: the ``contextful`` tests below go that way end to end)."""
    manifest = load_version(root, version)
    assert manifest.applied is not None
    return replace(manifest, applied=replace(manifest.applied, tables=tables))


def _columns(store: Store, table: str) -> tuple[tuple[str, str], ...]:
    """The oracle: a table's columns as pyarrow reads its rows back."""
    return tuple((f.name, str(f.type)) for f in store.table(table).to_arrow().schema)


@pytest.mark.clause("surface.fire.standalone-snapshot")
def test_capture_holds_each_standalone_tables_contract_from_the_store_head(tmp_path: Path, store: Store) -> None:
    manifest = load_manifest(_project(tmp_path / "p", HEAD + MODEL + JOB))
    _fill(store)
    captured = capture_contracts(manifest, store)
    # events is the pipeline's (its [[pipeline]] block pins it); the rest the job reads or writes, or an external declares
    assert sorted(captured) == ["crm_accounts", "daily", "documents", "scores"]
    assert captured["documents"] == {"authority": "store", "columns": [list(c) for c in _columns(store, "documents")],
                                     "primary_key": ["id"], "order_by": "rev"}
    assert captured["scores"] == {"authority": "job:score", "columns": [["id", "int64"], ["score", "double"]],
                                  "primary_key": ["id"]}
    assert captured["crm_accounts"] == {"authority": "external:crm", "primary_key": []}  # not in the store: no columns
    assert captured["daily"] == {"authority": "model:daily", "primary_key": []}
    # TOML-ready: what a version file holds reads back the same
    data = tomllib.loads(dumps({"snapshot": {"tables": captured}}))["snapshot"]["tables"]
    contracts = AppliedContracts.from_data(3, data)
    assert contracts.table("Documents") == TableContract("documents", "store", _columns(store, "documents"), ("id",), "rev")
    assert contracts.table("crm_accounts") == TableContract("crm_accounts", "external:crm")


def _imported(tmp_path: Path, store: Store, text: str = HEAD + MODEL + JOB) -> tuple[Path, dict[int, dict[str, Any]]]:
    """A project declaring ``text`` over ``store`` :func:`_fill` filled, and its ``pipeline import``:
    the project and v1's contracts captured from ``store``."""
    root = _project(tmp_path / "p", text)
    _fill(store)
    contextful(root, "pipeline", "import")
    return root, {1: capture_contracts(load_version(root, 1), store)}


def _applied(root: Path, store: Store, captured: dict[int, dict[str, Any]], text: str) -> int:
    (root / "contextful.toml").write_text(text)
    contextful(root, "pipeline", "apply")
    version = max(captured) + 1
    captured[version] = capture_contracts(load_version(root, version), store)
    return version


@pytest.mark.clause("surface.fire.applied-data-contract")
def test_an_applied_job_reads_its_tables_and_statement_from_its_version_never_the_working_file(
        tmp_path: Path, store: Store) -> None:
    root, captured = _imported(tmp_path, store)
    # unapplied edits: another statement and output, the pipeline's key, the external gone
    edited = (HEAD + MODEL + JOB).replace("FROM documents AS d", "FROM drafts AS d").replace(
        'tables = ["scores"]', 'tables = ["scores_v2"]').replace('primary_key = ["id"]', 'primary_key = ["v"]')
    (root / "contextful.toml").write_text(edited.replace('[[external]]\nid = "crm"\ntable = "crm_accounts"\n', ""))
    working = load_manifest(root)
    assert working.jobs[0].tables == ("scores_v2",) and working.pipeline("events").primary_key == ("v",)
    version = _version(root, 1, captured[1])
    ctx = JobContext(version.jobs[0], version, 1, store)
    reads, writes = job_tables(ctx.job, ctx.manifest)
    assert reads == ("documents", "events", "daily") and writes == ("scores",)
    assert set(reads) == set(duckdb.get_table_names(JOB.split('statement = "')[1].split('"')[0]))  # the oracle
    assert applied_contract(ctx, "scores") == TableContract("scores", "job:score", (("id", "int64"), ("score", "double")),
                                                            ("id",))
    assert applied_contract(ctx, "documents") == TableContract("documents", "store", _columns(store, "documents"),
                                                               ("id",), "rev")
    assert applied_contract(ctx, "events") == TableContract("events", "pipeline:events", None, ("id",))
    check_applied(ctx.manifest, store, ctx.job)  # the working file's edits are not the version in force
    # the store moving on changes no contract the version pinned either
    store.create_table("scores").append(pa.table({"id": pa.array([2], pa.int64()), "score": [0.1], "note": ["n"]}))
    assert applied_contract(ctx, "scores").columns == (("id", "int64"), ("score", "double"))


@pytest.mark.clause("surface.fire.applied-current-authority")
def test_a_table_whose_writer_changed_since_the_jobs_version_refuses_before_the_execution_opens(
        tmp_path: Path, store: Store) -> None:
    root, captured = _imported(tmp_path, store)
    # v2 declares documents written from outside: v1's job no longer answers for who writes it
    _applied(root, store, captured, HEAD + MODEL + JOB + '\n[[external]]\nid = "docs_feed"\ntable = "documents"\n')
    v1 = _version(root, 1, captured[1])
    with pytest.raises(AppliedAuthorityChanged) as info:
        check_applied(v1, store, v1.jobs[0])
    assert (info.value.job, info.value.version, info.value.table, info.value.snapshot, info.value.current) == (
        "score", 1, "documents", "store", "external:docs_feed")
    assert info.value.category == "spec-invalid"  # refused under validation
    check_applied(_version(root, 2, captured[2]), store, v1.jobs[0])  # v2 pinned the new writer: it runs


@pytest.mark.clause("surface.fire.applied-current-authority")
def test_the_snapshot_never_admits_a_writer_the_version_in_force_does_not(tmp_path: Path, store: Store) -> None:
    root, captured = _imported(tmp_path, store)
    # v2 moves scores to an outside writer and drops the job: v1's job:score may not write it any more
    v2 = _applied(root, store, captured, HEAD + MODEL + '\n[[external]]\nid = "scores_feed"\ntable = "scores"\n')
    v1 = _version(root, 1, captured[1])
    assert captured[1]["scores"]["authority"] == "job:score" and captured[v2]["scores"]["authority"] == "external:scores_feed"
    with pytest.raises(AppliedAuthorityChanged) as info:
        check_applied(v1, store, v1.jobs[0])
    assert (info.value.table, info.value.snapshot, info.value.current) == ("scores", "job:score", "external:scores_feed")
    assert "'scores' is written by job:score in applied version 1 but by external:scores_feed now" in str(info.value)


@pytest.mark.clause("surface.fire.applied-current-authority")
def test_the_store_keeping_an_output_table_otherwise_than_the_version_captured_refuses_the_job(
        tmp_path: Path, store: Store) -> None:
    root, captured = _imported(tmp_path, store)
    v1 = _version(root, 1, captured[1])
    # scores is loaded again under another key: the store, not the version, decides how it merges
    store.drop_table("scores")
    store.create_table("scores", ("id", "day")).append(
        pa.table({"id": pa.array([1], pa.int64()), "day": ["mon"], "score": [0.5]}))
    with pytest.raises(TableDeclarationChanged) as info:
        check_applied(v1, store, v1.jobs[0])
    assert (info.value.table, info.value.setting, info.value.stored, info.value.declared) == (
        "scores", "primary_key", "['id', 'day']", "['id']")
    assert "in job 'score''s applied version 1" in str(info.value)
    assert applied_contract(JobContext(v1.jobs[0], v1, 1, store), "scores").primary_key == ("id",)  # pinned as captured
    v2 = _applied(root, store, captured, HEAD + MODEL + JOB.replace("max_in_flight = 2", "max_in_flight = 3"))
    check_applied(_version(root, v2, captured[v2]), store, v1.jobs[0])  # a full apply captured the store's key


@pytest.mark.clause("surface.fire.applied-current-authority")
def test_a_model_publishing_another_contract_than_the_jobs_version_refuses(tmp_path: Path, store: Store) -> None:
    root, captured = _imported(tmp_path, store)
    v1 = _version(root, 1, captured[1])
    build_models(store, v1)
    check_applied(v1, store, v1.jobs[0])  # the published build discloses v1's contract
    bumped = MODEL.replace('version = "1.0"', 'version = "2.0"').replace(
        "SELECT count(*) AS n FROM events", "SELECT count(*) AS n, max(v) AS top FROM events").replace(
        'n = { type = "bigint", nullable = false }', 'n = { type = "bigint", nullable = false }\ntop = { type = "string" }')
    _applied(root, store, captured, HEAD + bumped + JOB)
    build_models(store, _version(root, 2, captured[2]))
    with pytest.raises(AppliedModelDisclosureChanged) as info:
        check_applied(v1, store, v1.jobs[0])
    assert (info.value.job, info.value.model) == ("score", "daily")
    assert info.value.snapshot == "contract 1.0 (grain none; columns n bigint not null)"
    assert info.value.current == "contract 2.0 (grain none; columns n bigint not null, top string)"
    assert info.value.category == "spec-invalid"


@pytest.mark.clause("surface.fire.applied-contract-missing")
def test_a_version_holding_no_contracts_refuses_every_job_and_no_live_declaration_stands_in(
        tmp_path: Path, store: Store) -> None:
    root, _captured = _imported(tmp_path, store, HEAD + MODEL + JOB + JOB.replace('"score"\nkind', '"rescore"\nkind')
                                .replace('tables = ["scores"]', 'tables = ["rescores"]'))
    bare = _version(root, 1, None)  # claimed before contracts were captured
    for job in bare.jobs:
        with pytest.raises(AppliedContractMissing) as info:
            check_applied(bare, store, job, live=load_manifest(root))
        assert (info.value.job, info.value.version) == (job.name, 1)
        assert "full `contextful pipeline apply` captures them" in str(info.value)
        ctx = JobContext(job, bare, 1, store)
        with pytest.raises(AppliedContractMissing):
            applied_contract(ctx, job.tables[0])
    assert applied_contract(JobContext(bare.jobs[0], bare, 1, store), "events").authority == "pipeline:events"


@pytest.mark.clause("surface.fire.applied-contract-missing")
def test_a_table_a_pipelines_only_apply_stopped_producing_has_no_contract_until_a_full_apply(
        tmp_path: Path, store: Store) -> None:
    job = JOB.replace(", daily.n", "").replace(" CROSS JOIN daily", "")
    root, captured = _imported(tmp_path, store, HEAD + job)
    # pipelines-only: events is landed by no pipeline now; v2 keeps v1's contracts, which never held it
    (root / "contextful.toml").write_text(HEAD.replace('id = "events"', 'id = "orders"') + job)
    contextful(root, "pipeline", "apply", "--pipelines-only")
    v2 = _version(root, 2, captured[1])
    with pytest.raises(AppliedContractMissing) as info:
        check_applied(v2, store, v2.jobs[0])
    assert (info.value.version, info.value.tables) == (2, ("events",))
    assert "no contract of 'events'" in str(info.value)


CSV = "id,rev,body\n1,1,a\n2,1,b\n"


def _version_file(root: Path, version: int) -> dict[str, Any]:
    return tomllib.loads((root / ".contextful" / "control" / "shop" / f"manifest@v{version}.toml").read_text())


def _store_columns(root: Path, table: str) -> list[list[str]]:
    """The oracle: the table's columns as DuckDB's read path describes its rows."""
    from contextful.engine.read import connect

    with open_project_store(root) as store:
        con = connect(store)
        try:
            arrow = con.sql(f'SELECT * FROM "{table}"').to_arrow_table()
        finally:
            con.close()
    return [[f.name, str(f.type)] for f in arrow.schema]


@pytest.mark.clause("surface.fire.standalone-snapshot")
def test_import_and_full_apply_capture_contracts_and_a_pipelines_only_apply_keeps_them(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", HEAD + MODEL + JOB)
    (root / "docs.csv").write_text(CSV)
    contextful(root, "table", "load", "documents", str(root / "docs.csv"), "--primary-key", "id")
    contextful(root, "pipeline", "import")
    v1 = _version_file(root, 1)["snapshot"]["tables"]
    assert v1 == {"crm_accounts": {"authority": "external:crm", "primary_key": []},
                  "daily": {"authority": "model:daily", "primary_key": []},
                  "documents": {"authority": "store", "columns": _store_columns(root, "documents"),
                                "primary_key": ["id"]},
                  "scores": {"authority": "job:score", "primary_key": []}}
    applied = load_applied(root)
    assert applied is not None and applied.manifest.applied is not None
    assert AppliedContracts.of(applied.manifest, applied.manifest.jobs[0]).tables["documents"].columns == tuple(
        tuple(c) for c in _store_columns(root, "documents"))
    # the output table lands; a full apply of an edited document captures it
    (root / "scores.csv").write_text("id,score\n1,0.5\n")
    contextful(root, "table", "load", "scores", str(root / "scores.csv"), "--primary-key", "id")
    (root / "contextful.toml").write_text(HEAD + MODEL + JOB.replace("max_in_flight = 2", "max_in_flight = 3"))
    contextful(root, "pipeline", "apply")
    v2 = _version_file(root, 2)["snapshot"]["tables"]
    assert v2["scores"] == {"authority": "job:score", "columns": _store_columns(root, "scores"), "primary_key": ["id"]}
    # the external's table lands; a pipelines-only apply keeps v2's contracts as they were
    (root / "crm.csv").write_text("account,owner\nx,y\n")
    contextful(root, "table", "load", "crm_accounts", str(root / "crm.csv"))
    (root / "contextful.toml").write_text((HEAD + MODEL + JOB).replace("[[pipeline]]\n", '[[pipeline]]\nschedule = "every 5m"\n'))
    contextful(root, "pipeline", "apply", "--pipelines-only")
    v3 = _version_file(root, 3)
    assert v3["pipeline"][0]["schedule"] == "every 5m" and v3["snapshot"]["tables"] == v2
    contextful(root, "pipeline", "apply")  # a full apply captures what the store holds now
    assert _version_file(root, 4)["snapshot"]["tables"]["crm_accounts"]["columns"] == _store_columns(root, "crm_accounts")


@pytest.mark.clause("surface.fire.standalone-snapshot", "surface.fire.applied-contract-missing")
def test_a_version_claimed_without_contracts_stays_without_through_pipelines_only_applies_and_refuses_its_jobs(
        tmp_path: Path) -> None:
    root = _project(tmp_path / "p", HEAD + MODEL + JOB)
    # v1 as a version claimed before contracts were captured: the document alone
    snapshots = root / ".contextful" / "control" / "shop"
    snapshots.mkdir(parents=True)
    (snapshots / "manifest@v1.toml").write_text(HEAD + MODEL + JOB)
    (snapshots / "manifest@current").write_text("1\n")
    (root / "contextful.toml").write_text((HEAD + MODEL + JOB).replace("[[pipeline]]\n", '[[pipeline]]\nschedule = "every 5m"\n'))
    contextful(root, "pipeline", "apply", "--pipelines-only")
    assert "tables" not in _version_file(root, 2).get("snapshot", {})  # the absence is kept
    applied = load_applied(root)
    assert applied is not None and applied.version == 2 and applied.manifest.applied is not None
    assert applied.manifest.applied.tables is None
    (root / "docs.csv").write_text(CSV)
    contextful(root, "table", "load", "documents", str(root / "docs.csv"), "--primary-key", "id")
    with open_project_store(root) as store:
        with pytest.raises(AppliedContractMissing) as info:  # the working file declares them all: no matter
            check_applied(applied.manifest, store, applied.manifest.jobs[0], live=load_manifest(root))
        assert (info.value.job, info.value.version, info.value.tables) == ("score", 2, ())
        assert "`contextful pipeline apply` captures them" in str(info.value)
        contextful(root, "pipeline", "apply")  # a full apply captures them: the job runs
        applied = load_applied(root)
        assert applied is not None and applied.version == 3
        check_applied(applied.manifest, store, applied.manifest.jobs[0])


FOLD = """\
[project]
name = "shop"

[[external]]
id = "crm"
table = "crm_accounts"

[[job]]
name = "nightly_fold"
kind = "fold"
schedule = "0 3 * * *"
target = ["crm_accounts"]
"""

CRM_PIPELINE = """
[[pipeline]]
id = "crm_accounts"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


@pytest.mark.clause("surface.fire.applied-current-authority", "surface.fire.applied-contract-missing")
def test_job_fire_refuses_a_version_whose_writer_changed_or_that_holds_no_contracts(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", FOLD)
    (root / "crm.csv").write_text("account,owner\nx,y\n")
    contextful(root, "table", "load", "crm_accounts", str(root / "crm.csv"))
    contextful(root, "pipeline", "import")
    assert contextful(root, "job", "fire", "nightly_fold").returncode == 0  # v1 answers for its writer: it folds
    # v2: a pipeline lands crm_accounts now, no external; v1's fold no longer answers for who writes it
    (root / "contextful.toml").write_text(FOLD.replace('[[external]]\nid = "crm"\ntable = "crm_accounts"\n', "")
                                          + CRM_PIPELINE)
    contextful(root, "pipeline", "apply")
    proc = contextful(root, "job", "fire", "nightly_fold", "--version", "1", check=False)
    assert proc.returncode == 3, proc.stderr
    assert ("error: AppliedAuthorityChanged: job 'nightly_fold': table 'crm_accounts' is written by external:crm in "
            "applied version 1 but by pipeline:crm_accounts now") in proc.stderr
    assert contextful(root, "job", "fire", "nightly_fold").returncode == 0  # v2 pinned the pipeline
    # a version holding no contracts (claimed before they were captured) fires nothing
    snapshots = root / ".contextful" / "control" / "shop"
    (snapshots / "manifest@v3.toml").write_text(FOLD)
    (snapshots / "manifest@current").write_text("3\n")
    proc = contextful(root, "job", "fire", "nightly_fold", check=False)
    assert proc.returncode == 3 and "error: AppliedContractMissing: job 'nightly_fold': applied version 3" in proc.stderr
