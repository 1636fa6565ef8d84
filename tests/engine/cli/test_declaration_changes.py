"""A landed table's declaration that the manifest changes is refused by name, never landed under a mix.

``pipeline validate``, ``pipeline plan`` and ``pipeline run`` (a real child process, as a user runs
them) compare each landing pipeline's ``primary_key``, ``order_by`` and ``normalize`` with what its
landed table holds: a difference is ``TableDeclarationChanged`` naming the table, the setting, the
stored and the declared value and the commands that migrate; nothing lands, and the table answers
as before. An unchanged manifest still runs. The CLI runs on the embedded (local) profile; the run
path those commands share (``plan_pipeline``, ``run_pipelines``, what serve's units run) is run on
every adapter, since the stored key lives in the catalog's table head and the columns in its schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.engine.config.parse import load_manifest
from contextful.engine.land.pipeline import plan_pipeline
from contextful.engine.run.units import run_pipelines
from contextful.storage.errors import TableDeclarationChanged

from tests.conftest import StoreFactory
from tests.support.cli import contextful_in

MANIFEST = """\
[project]
name = "drift"

[[pipeline]]
id = "orders"
{declaration}

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


@pytest.fixture
def env() -> dict[str, str]:
    return {}


def _landed(project: Path, env: dict[str, str], declaration: str) -> Path:
    (project / "raw").mkdir()
    (project / "raw" / "a.ndjson").write_text('{"id": 1, "n": 1, "user": {"name": "ann"}}\n'
                                              '{"id": 2, "n": 1, "user": {"name": "bob"}}\n')
    (project / "contextful.toml").write_text(MANIFEST.format(declaration=declaration))
    contextful_in(project, "pipeline", "run", env=env)
    (project / "raw" / "b.ndjson").write_text('{"id": 3, "n": 2, "user": {"name": "cy"}}\n')  # a new input waits
    return project


def _table(project: Path, env: dict[str, str]) -> dict:
    return json.loads(contextful_in(project, "--json", "table", "show", "orders", env=env).stdout)


def _refused(project: Path, env: dict[str, str], stored: str, declared: str, prop: str) -> None:
    before = _table(project, env)
    for words in (("pipeline", "validate"), ("pipeline", "plan"), ("pipeline", "run")):
        proc = contextful_in(project, *words, env=env, check=False)
        assert proc.returncode == (3 if words[1] == "validate" else 5), (words, proc.stdout, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, (words, proc.stderr)
        line = errors[0]
        assert line.startswith("error: TableDeclarationChanged: table 'orders' (pipeline 'orders'): "), line
        assert f"{prop} is {stored} in the store but {declared} in contextful.toml" in line, line
        assert "contextful table drop orders" in line and "table =" in line, line
    after = _table(project, env)
    assert after["rows"] == before["rows"] == 2 and after["commit_seq"] == before["commit_seq"]
    assert after["primary_key"] == before["primary_key"] and after["schema"] == before["schema"]


def test_a_changed_primary_key_is_refused_by_name_and_nothing_lands(tmp_path: Path, env: dict[str, str]) -> None:
    project = _landed(tmp_path, env, 'primary_key = ["id"]')
    (project / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id", "n"]'))
    _refused(project, env, "['id']", "['id', 'n']", "primary_key")
    proc = contextful_in(project, "pipeline", "validate", env=env, check=False)
    assert "re-key" in proc.stderr and "--primary-key id,n" in proc.stderr
    (project / "contextful.toml").write_text(MANIFEST.format(declaration="primary_key = []"))
    _refused(project, env, "['id']", "none", "primary_key")
    (project / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id"]'))
    contextful_in(project, "pipeline", "validate", env=env)
    contextful_in(project, "pipeline", "run", env=env)  # the declaration it landed under: it runs on
    assert _table(project, env)["rows"] == 3


def test_a_switch_to_relational_after_a_nested_landing_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    project = _landed(tmp_path, env, "")
    (project / "contextful.toml").write_text(MANIFEST.format(declaration='normalize = "relational"'))
    _refused(project, env, "'nested'", "'relational'", "normalize")
    assert "orders__" not in contextful_in(project, "table", "list", env=env).stdout  # no child table either
    (project / "contextful.toml").write_text(MANIFEST.format(declaration='normalize = "nested"'))
    contextful_in(project, "pipeline", "run", env=env)
    names = [c["name"] for c in _table(project, env)["schema"]]
    assert "user" in names and "_cf_id" not in names and "user__name" not in names
    (project / "contextful.toml").write_text(MANIFEST.format(declaration='normalize = "relational"'))
    contextful_in(project, "table", "drop", "orders", env=env)  # the migration the error names
    contextful_in(project, "pipeline", "run", env=env)
    after = _table(project, env)
    names = [c["name"] for c in after["schema"]]
    assert after["rows"] == 3 and "_cf_id" in names and "user__name" in names and "user" not in names


def test_a_switch_to_nested_after_a_relational_landing_names_the_child_tables(tmp_path: Path,
                                                                              env: dict[str, str]) -> None:
    project = _landed(tmp_path, env, 'normalize = "relational"\nprimary_key = ["id"]')
    (project / "raw" / "c.ndjson").write_text('{"id": 4, "n": 2, "user": {"name": "di"}, "tags": ["x"]}\n')
    contextful_in(project, "pipeline", "run", env=env)
    (project / "raw" / "d.ndjson").write_text('{"id": 5, "n": 2, "user": {"name": "ed"}}\n')
    (project / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id"]'))
    before = _table(project, env)
    proc = contextful_in(project, "pipeline", "run", env=env, check=False)
    assert proc.returncode == 5
    assert "normalize is 'relational' in the store but 'nested' in contextful.toml" in proc.stderr
    assert "contextful table drop orders__tags" in proc.stderr
    assert _table(project, env)["commit_seq"] == before["commit_seq"]


@pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres), "s3"])
def test_the_run_path_refuses_a_changed_declaration_on_every_adapter(tmp_path: Path, make_store: StoreFactory,
                                                                     store_kind: str) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text('{"id": 1, "n": 1, "user": {"name": "ann"}}\n')
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id"]'))
    store = make_store()
    [landed] = run_pipelines(store, load_manifest(tmp_path))
    assert landed.ok
    seq = store.table("orders").snapshot().commit_seq
    (tmp_path / "raw" / "b.ndjson").write_text('{"id": 2, "n": 1, "user": {"name": "bob"}}\n')
    for declaration, setting, stored, declared in (
            ('primary_key = ["n"]', "primary_key", "['id']", "['n']"),
            ('primary_key = ["id"]\nnormalize = "relational"', "normalize", "'nested'", "'relational'")):
        (tmp_path / "contextful.toml").write_text(MANIFEST.format(declaration=declaration))
        manifest = load_manifest(tmp_path)
        with pytest.raises(TableDeclarationChanged) as caught:
            plan_pipeline(store, manifest, manifest.pipeline("orders"))
        assert (caught.value.table, caught.value.setting, caught.value.stored, caught.value.declared) == (
            "orders", setting, stored, declared)
        [result] = run_pipelines(store, manifest)
        assert [(f.error, f.exit_code) for f in result.failures] == [("TableDeclarationChanged", 5)]
        assert store.table("orders").snapshot().commit_seq == seq and store.table("orders").count() == 1
        assert store.table_names() == ["orders"]
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id"]'))
    [again] = run_pipelines(store, load_manifest(tmp_path))
    assert again.ok and store.table("orders").count() == 2


@pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres), "s3"])
def test_the_mode_a_table_was_created_under_is_kept_with_its_head(tmp_path: Path, make_store: StoreFactory,
                                                                  store_kind: str) -> None:
    """A nested landing of data that holds a ``_cf_id`` column of its own is not taken for relational:
    the mode is kept with the table's head when the table is created, and an ``order_by`` declared
    later (a commit of its own) keeps it."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text('{"_cf_id": 7, "id": 1, "n": 1}\n')
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id"]'))
    store = make_store()
    assert run_pipelines(store, load_manifest(tmp_path))[0].ok
    (tmp_path / "raw" / "b.ndjson").write_text('{"_cf_id": 8, "id": 2, "n": 1}\n')
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(declaration='primary_key = ["id"]\norder_by = "n"'))
    [again] = run_pipelines(store, load_manifest(tmp_path))
    assert again.ok, again.failures
    head = store.table("orders").refresh()
    assert head.declared == (("normalize", "nested"),) and head.order_by == "n" and store.table("orders").count() == 2
    (tmp_path / "contextful.toml").write_text(
        MANIFEST.format(declaration='primary_key = ["id"]\norder_by = "n"\nnormalize = "relational"'))
    [refused] = run_pipelines(store, load_manifest(tmp_path))
    assert [f.error for f in refused.failures] == ["TableDeclarationChanged"]


@pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres), "s3"])
def test_serves_drain_keeps_received_batches_queued_under_a_changed_declaration(tmp_path: Path,
                                                                                make_store: StoreFactory,
                                                                                store_kind: str) -> None:
    """Serve's drain lands received batches without ``pipeline run``: it refuses a changed declaration
    the same way, and the batch stays queued until the manifest declares the table as it landed."""
    import time

    import pyarrow as pa
    from contextful.engine.config.manifest import Manifest, PipelineSpec, SourceSpec
    from contextful.engine.control.drain import drain_queues
    from contextful.engine.land.receive.spool import Queue, key_digest, queue_root
    from contextful.engine.project import parse_project

    project, _ = parse_project({}, tmp_path)
    source = SourceSpec("receive", {"key_retention_secs": 60})

    def manifest(key: tuple[str, ...]) -> Manifest:
        return Manifest(tmp_path, project, (PipelineSpec("clicks", source, "clicks", primary_key=key),))

    def spool(key: str, ids: list[int]) -> None:
        queue = Queue(queue_root(tmp_path), "clicks")
        try:
            now = time.time_ns() // 1000
            digest = key_digest("clicks", key)
            queue.index.touch(digest, key, now)
            queue.spool(key, digest, {"clicks": pa.table({"id": ids, "n": [1] * len(ids)})}, received_us=now,
                        body_bytes=0, body_sha256="")
        finally:
            queue.close()

    store = make_store()
    spool("first", [1, 2])
    assert drain_queues(store, manifest(("id",))).settled == 1
    spool("second", [3])
    refused = drain_queues(store, manifest(("n",)))
    assert refused.settled == 0 and len(refused.failures) == 1
    assert refused.failures[0].startswith("clicks: TableDeclarationChanged: table 'clicks' (pipeline 'clicks'): "
                                          "primary_key is ['id'] in the store but ['n'] in contextful.toml")
    assert store.table("clicks").count() == 2
    assert drain_queues(store, manifest(("id",))).settled == 1  # still queued: it lands once the key is back
    assert store.table("clicks").count() == 3


def test_a_table_load_naming_another_key_is_refused_and_lands_nothing(tmp_path: Path, env: dict[str, str]) -> None:
    """``table load --primary-key`` into a table keyed otherwise would merge its rows by the table's key,
    not the one named: refused by name with both keys and the re-key steps; a load naming the table's
    own key, or none, lands as before."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "contextful.toml").write_text('[project]\nname = "loads"\n')
    (project / "a.csv").write_text("id,k,v\n1,x,a\n2,x,b\n")
    (project / "b.csv").write_text("id,k,v\n1,y,c\n3,y,d\n")
    contextful_in(project, "table", "load", "t", "a.csv", "--primary-key", "id", env=env)
    before = json.loads(contextful_in(project, "--json", "table", "show", "t", env=env).stdout)

    refused = contextful_in(project, "table", "load", "t", "b.csv", "--primary-key", "k", env=env, check=False)
    assert refused.returncode == 5, refused.stderr
    line = refused.stderr.strip()
    assert line.startswith("error: TableDeclarationChanged: table 't': primary_key is ['id'] in the store but "
                           "['k'] in this table load"), line
    assert "--primary-key k" in line and "contextful table drop t" in line
    after = json.loads(contextful_in(project, "--json", "table", "show", "t", env=env).stdout)
    assert (after["commit_seq"], after["primary_key"]) == (before["commit_seq"], ["id"])

    for same in (["--primary-key", "id"], []):
        contextful_in(project, "table", "load", "t", "b.csv", *same, env=env)
    rows = json.loads(contextful_in(project, "--json", "sql", "SELECT id, v FROM t ORDER BY id", env=env).stdout)
    assert [(r["id"], r["v"]) for r in rows] == [(1, "c"), (2, "b"), (3, "d")]  # merged by id
