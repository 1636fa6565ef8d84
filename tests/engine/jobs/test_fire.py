"""``contextful job fire`` and ``job history`` as a user runs them: a child process over a real
project and store, on each store configuration a kind concerns (the local SQLite catalog, the
PostgreSQL catalog, an ``s3://`` store root, and the container profile's corpus bucket for
``sync-push``). What a fire did is checked against an independent oracle: the input rows counted in
Python, the store's answers read in DuckDB before and after, the bucket listed directly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import contextful_in
from tests.support.s3_server import CREDENTIALS, S3Server

ORDERS = """[project]
name = "jobs"
{store}
[[pipeline]]
id = "orders"
primary_key = ["id"]
normalize = "relational"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["orders/*.ndjson"]

[[model]]
name = "order_count"
sql = "SELECT count(*) AS n FROM orders"

[[job]]
name = "build_counts"
kind = "build"
target = ["order_count"]

[[job]]
name = "fold_orders"
kind = "fold"
target = ["orders"]

[[job]]
name = "push"
kind = "sync-push"
"""


class Project:
    """A project directory and the environment its store configuration needs."""

    def __init__(self, root: Path, env: dict[str, str], store_line: str = "", extra: str = "") -> None:
        self.root = root
        self.env = env
        root.mkdir(parents=True, exist_ok=True)
        (root / "orders").mkdir(exist_ok=True)
        (root / "contextful.toml").write_text(ORDERS.format(store=store_line) + extra)

    def cli(self, *args: str, check: bool = True) -> Any:
        return contextful_in(self.root, *args, env=self.env, check=check)

    def fire(self, name: str, *args: str, check: bool = True) -> tuple[Any, dict[str, Any]]:
        proc = self.cli("--json", "job", "fire", name, *args, check=check)
        return proc, json.loads(proc.stdout) if proc.stdout.strip() else {}

    def imported(self) -> None:
        """``pipeline import``, and under the container profile the one-time ``store provision``."""
        self.cli("pipeline", "import")
        if "CONTEXTFUL_CORPUS_BUCKET" in self.env:
            self.cli("store", "provision")

    def history(self, name: str, *args: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(self.cli("--json", "job", "history", name, *args).stdout)
        return found

    def land(self, file: str, ids: list[int]) -> None:
        """One input of ``orders``: each order with two items, landed as one run."""
        (self.root / "orders" / f"{file}.ndjson").write_text("".join(
            json.dumps({"id": i, "items": [{"sku": f"{file}-{i}-a"}, {"sku": f"{file}-{i}-b"}]}) + "\n" for i in ids))
        self.cli("pipeline", "run", "orders")

    def query(self, sql: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(self.cli("--json", "sql", sql).stdout)
        return rows


def _env_for(kind: str, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    if kind == "postgres":  # the container profile: the PostgreSQL execution database and a corpus bucket
        from tests.storage.container_site import ContainerSite

        site = ContainerSite.fresh(request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema"),
                                   request.getfixturevalue("s3_server"))
        request.addfinalizer(site.drop)
        return "", site.env
    if kind == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return (f'store = "s3://{server.new_bucket()}/store"\ncatalog = "catalog.sqlite"',
                {"CONTEXTFUL_S3_ENDPOINT_URL": server.endpoint, **CREDENTIALS})
    return "", {}


KINDS = ["local", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.s3]),
         pytest.param("s3", marks=pytest.mark.s3)]


@pytest.fixture(params=KINDS)
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Project:
    store_line, env = _env_for(request.param, request)
    return Project(tmp_path / "p", env, store_line)


def test_a_fire_before_import_or_of_a_job_the_version_lacks_is_refused_by_name(tmp_path: Path) -> None:
    project = Project(tmp_path / "p", {})
    refused = project.cli("job", "fire", "build_counts", check=False)
    assert refused.returncode == 5 and "StoreNotInitialized" in refused.stderr
    assert "run contextful pipeline import" in refused.stderr
    project.cli("pipeline", "import")
    unknown = project.cli("job", "fire", "nightly", check=False)
    assert unknown.returncode == 6
    assert "error: JobNotFound: no job 'nightly' in applied version v1 (its jobs: build_counts, fold_orders, push)" \
        in unknown.stderr
    assert project.cli("job", "history", "nightly", check=False).returncode == 6
    assert project.history("build_counts") == []  # a declared job that never fired has an empty history


@pytest.mark.clause("surface.fire.scheduled-build")
def test_a_build_publishes_its_stale_models_says_when_none_is_and_force_builds_anyway(project: Project) -> None:
    project.imported()
    project.land("a", [1, 2])
    _, first = project.fire("build_counts")
    assert first["status"] == "ok" and first["rows"] == 1
    assert [m["status"] for m in first["detail"]["models"]] == ["published"]
    assert project.query("SELECT n FROM order_count") == [{"n": 2}]
    _, current = project.fire("build_counts")  # nothing landed since: not stale, nothing published
    assert current["status"] == "ok" and current["rows"] == 0
    assert current["summary"].startswith("nothing to build: order_count current")
    assert [m["status"] for m in current["detail"]["models"]] == ["current"]
    _, forced = project.fire("build_counts", "--force")
    assert forced["forced"] and [m["status"] for m in forced["detail"]["models"]] == ["published"]
    assert forced["detail"]["models"][0]["build_id"] > first["detail"]["models"][0]["build_id"]
    project.land("b", [2, 3, 4])
    _, stale = project.fire("build_counts")
    ids = {1, 2} | {2, 3, 4}  # the oracle: orders keyed by id
    assert project.query("SELECT n FROM order_count") == [{"n": len(ids)}]
    assert [m["status"] for m in stale["detail"]["models"]] == ["published"]
    # every fire is recorded in its execution, in order, with its version, rows and duration
    fires = project.history("build_counts")
    assert [(f["status"], f["rows"], f["forced"]) for f in fires] == [
        ("ok", 1, False), ("ok", 0, False), ("ok", 1, True), ("ok", 1, False)]
    assert all(f["version"] == 1 and f["duration_s"] >= 0 and f["started"] <= f["ended"] for f in fires)
    assert [f["execution"] for f in fires] == [first["execution"], current["execution"], forced["execution"],
                                               stale["execution"]]
    assert project.history("build_counts", "--limit", "2") == fires[2:]


@pytest.mark.clause("surface.fire.scheduled-maintenance")
def test_a_fold_folds_its_targets_and_a_relational_roots_child_tables_answering_the_same(project: Project) -> None:
    project.imported()
    for n, ids in enumerate([[1, 2], [3], [2, 4]]):
        project.land(f"in{n}", ids)
    before = {t: project.query(f"SELECT * FROM {t} ORDER BY ALL") for t in ("orders", "orders__items")}
    _, fold = project.fire("fold_orders")
    assert fold["status"] == "ok"
    folded = {f["table"]: f for f in fold["detail"]["folded"]}
    assert set(folded) == {"orders", "orders__items"}  # the root and its child table
    assert all(f["parts_removed"] == 3 and f["parts_added"] == 1 for f in folded.values())
    # rows are the rows rewritten: each table's rows after its keys resolved, counted independently
    assert fold["detail"]["rows_are"] == "rows rewritten"
    assert fold["rows"] == len(before["orders"]) + len(before["orders__items"]) == 4 + 8
    after = {t: project.query(f"SELECT * FROM {t} ORDER BY ALL") for t in ("orders", "orders__items")}
    assert after == before
    _, again = project.fire("fold_orders")
    assert again["rows"] == 0 and again["detail"]["folded"] == [] and again["summary"].startswith("nothing to fold")


def test_a_failed_fire_is_recorded_with_its_error_and_exit_code_and_a_version_pins_the_declaration(
        tmp_path: Path) -> None:
    project = Project(tmp_path / "p", {})
    project.cli("pipeline", "import")
    proc, pushed = project.fire("push", check=False)
    # a store with no corpus bucket: a clear refusal every fire, never a success at pushing nothing
    assert proc.returncode == 3 and pushed["status"] == "failed" and pushed["exit_code"] == 3
    assert pushed["failures"][0].startswith("JobStoreUnbound: [[job]] 'push': store ") and "no corpus bucket" in pushed["failures"][0]
    assert "error: JobStoreUnbound: [[job]] 'push'" in proc.stderr
    text = (tmp_path / "p" / "contextful.toml").read_text()
    (tmp_path / "p" / "contextful.toml").write_text(text.replace('kind = "sync-push"', 'kind = "sync-push"\n'
                                                                                          'description = "v2"'))
    project.cli("pipeline", "apply")
    project.fire("push", check=False)
    project.fire("push", "--version", "1", check=False)
    fires = project.history("push")
    assert [(f["status"], f["version"], f["exit_code"]) for f in fires] == [("failed", 1, 3), ("failed", 2, 3),
                                                                           ("failed", 1, 3)]
    assert all(f["summary"] == "failed: JobStoreUnbound" for f in fires)
    table = project.cli("job", "history", "push").stdout
    assert table.count("failed: JobStoreUnbound") == 3 and "v2" in table


@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.clause("surface.fire.scheduled-maintenance")
def test_sync_push_pushes_every_object_of_the_working_copy_its_bucket_lacks(
        tmp_path: Path, pg_dsn: str, pg_schema: str, s3_server: S3Server) -> None:
    from contextful.storage.objects import ObjectStore

    from tests.storage.container_site import ContainerSite

    site = ContainerSite.fresh(pg_dsn, pg_schema, s3_server)
    project = Project(tmp_path / "p", site.env)
    try:
        project.imported()
        project.land("a", [1, 2])
        bucket = ObjectStore(site.bucket, s3_server.storage_options)
        working = tmp_path / "p" / ".contextful" / "store"

        def local_keys() -> set[str]:
            return {os.path.relpath(os.path.join(d, f), working) for d, _, files in os.walk(working) for f in files}

        _, nothing = project.fire("push")  # push-after-run left nothing behind
        assert nothing["status"] == "ok" and nothing["detail"]["pushed"] == []
        parts = sorted(k for k in local_keys() if k.endswith(".parquet"))
        assert parts and all(bucket.exists(k) for k in parts)
        bucket.delete(parts)  # the bucket lost them (a restore from an older backup, a hand removal)
        lacking = sorted(local_keys() - {o.key for o in bucket.list("")})
        assert lacking == parts
        _, pushed = project.fire("push")
        assert pushed["status"] == "ok" and pushed["detail"]["pushed"] == lacking
        assert pushed["detail"]["bytes"] == sum((working / k).stat().st_size for k in lacking)
        assert all(bucket.get_bytes(k) == (working / k).read_bytes() for k in lacking)
        assert pushed["summary"].startswith(f"pushed {len(lacking)} object(s)")
        assert project.query("SELECT count(*) AS n FROM orders") == [{"n": 2}]
        assert [f["status"] for f in project.history("push")] == ["ok", "ok"]
    finally:
        site.drop()


def test_a_build_re_exports_every_export_whose_source_it_published(tmp_path: Path) -> None:
    export = ('\n[[export]]\nname = "counts_out"\nsource = "order_count"\nnamespace = "bi"\ncredential = "analysts"\n')
    project = Project(tmp_path / "p", {}, extra=export)
    project.cli("pipeline", "import")
    project.land("a", [1, 2, 3])
    _, built = project.fire("build_counts")
    [exported] = built["detail"]["exports"]
    build_id = built["detail"]["models"][0]["build_id"]
    assert exported["export"] == "counts_out" and exported["source"]["build_id"] == build_id
    assert "re-exported counts_out" in built["summary"]
    from contextful.engine.config.parse import load_manifest
    from pyiceberg.catalog import load_catalog

    spec = load_manifest(tmp_path / "p").export("counts_out").catalog
    table = load_catalog(spec.name, **spec.pyiceberg_properties()).load_table("bi.counts_out")
    assert table.scan().to_arrow().to_pylist() == project.query("SELECT n FROM order_count") == [{"n": 3}]
    _, current = project.fire("build_counts")  # no new build: no export either
    assert current["detail"]["exports"] == []
