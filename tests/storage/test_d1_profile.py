"""The D1 profile selected end to end (``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1``): ``contextful
pipeline run`` lands a files pipeline with its catalog and journal in D1 and its parts in R2, a fresh
directory reads the rows back, and a profile missing its Worker binding refuses before anything runs.

Real components: the session's Worker under miniflare (a fresh namespace per test) and the CLI as a
child process.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.corpus import CorpusMirror
from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.objects import CORPUS_PREFIX, R2Objects
from contextful.storage.d1.recovery import provision
from contextful.storage.errors import StorageCapabilityMissing

from tests.support.cli import contextful_in

pytestmark = pytest.mark.d1

MANIFEST = """
[project]
name = "d1"

[[pipeline]]
id = "orders"
table = "orders"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def profile_env(binding: D1Binding) -> dict[str, str]:
    return {"CONTEXTFUL_STORAGE_PROFILE": "cloudflare-d1", "CONTEXTFUL_D1_URL": binding.url,
            "CONTEXTFUL_D1_TOKEN": binding.token, "CONTEXTFUL_D1_NAMESPACE": binding.namespace}


def project(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "contextful.toml").write_text(MANIFEST)
    return directory


@pytest.mark.clause("run.journal.d1-profile")
def test_a_files_pipeline_runs_on_the_profile_and_a_fresh_directory_reads_it_back(d1_binding: D1Binding,
                                                                               tmp_path: Path) -> None:
    env = profile_env(d1_binding)
    first = project(tmp_path / "machine-a")
    (first / "raw").mkdir()
    (first / "raw" / "a.ndjson").write_text("".join(json.dumps({"id": i, "amount": i * 10}) + "\n" for i in range(5)))
    contextful_in(first, "store", "provision", env=env)  # once per deployment: the recovery identity
    out = json.loads(contextful_in(first, "--json", "pipeline", "run", env=env).stdout)
    assert out[0]["ok"] and out[0]["tables"][0]["rows"] == 5

    client = d1_binding.client()
    # The catalog's head and its commit are in D1; the store's objects and parts are in R2.
    assert client.query("SELECT commit_seq FROM cf_tables WHERE name = 'orders'") == [(1,)]
    assert client.query("SELECT count(*) FROM cf_journal_owners")[0][0] >= 1  # the run's execution journaled
    corpus = {o.key.removeprefix(f"{CORPUS_PREFIX}/") for o in client.list(CORPUS_PREFIX + "/")}
    assert "store.json" in corpus
    parts = [key for key in corpus if key.startswith("tables/orders/parts/")]
    assert parts and all(key.endswith(".parquet") for key in parts)
    assert not (first / ".contextful" / "store" / "catalog.sqlite").exists()

    second = project(tmp_path / "machine-b")  # no raw inputs, no store: only the manifest and the binding
    rows = json.loads(contextful_in(second, "--json", "sql", "SELECT sum(amount)::BIGINT AS s, count(*) AS n FROM orders",
                                    env=env).stdout)
    assert rows == [{"s": 100, "n": 5}]
    again = json.loads(contextful_in(first, "--json", "pipeline", "run", env=env).stdout)
    assert again[0]["tables"][0]["rows"] == 0  # the inputs' cursor came back from D1: nothing lands twice


@pytest.mark.clause("run.journal.d1-profile")
def test_the_profile_selects_every_d1_adapter_and_r2_for_the_corpus(d1_binding: D1Binding, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in profile_env(d1_binding).items():
        monkeypatch.setenv(key, value)
    with Store.open(tmp_path / "store") as store:
        provision(store)
        assert isinstance(store.catalog, D1Catalog) and store.catalog.client.namespace == d1_binding.namespace
        assert isinstance(store.objects, CorpusMirror) and isinstance(store.objects.remote, R2Objects)
        assert type(store.journal).__name__ == "D1JournalStore" and type(store.awakeables).__name__ == (
            "D1AwakeableStore")
        assert type(store.outbox).__name__ == "D1OutboxStore" and type(store.blobs).__name__ == "D1BlobStore"
        store.append("t", pa.table({"id": [1, 2]}))
        uuid = store.uuid
    assert json.loads(d1_binding.client().get(f"{CORPUS_PREFIX}/store.json") or b"{}")["store_uuid"] == uuid
    other = dataclasses.replace(d1_binding, namespace=d1_binding.namespace + "_x")
    monkeypatch.setenv("CONTEXTFUL_D1_NAMESPACE", other.namespace)
    with Store.open(tmp_path / "store-elsewhere") as elsewhere:  # another namespace: another store
        assert elsewhere.uuid != uuid and elsewhere.table_names() == []


@pytest.mark.clause("run.journal.storage-incomplete")
def test_missing_worker_bindings_refuse_naming_each_before_anything_runs(d1_binding: D1Binding,
                                                                        tmp_path: Path) -> None:
    where = project(tmp_path / "p")
    (where / "raw").mkdir()
    (where / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    env = {"CONTEXTFUL_STORAGE_PROFILE": "cloudflare-d1"}
    proc = contextful_in(where, "pipeline", "run", env=env, check=False)
    assert proc.returncode != 0
    assert "error: StorageCapabilityMissing" in proc.stderr
    assert "CONTEXTFUL_D1_URL" in proc.stderr and "CONTEXTFUL_D1_TOKEN" in proc.stderr
    assert not (where / ".contextful").exists()  # nothing made, nothing landed

    only_url = contextful_in(where, "pipeline", "run", env=env | {"CONTEXTFUL_D1_URL": d1_binding.url}, check=False)
    assert only_url.returncode != 0 and "CONTEXTFUL_D1_TOKEN" in only_url.stderr
    assert "CONTEXTFUL_D1_URL" not in only_url.stderr.split("lacks", 1)[1]
    assert d1_binding.client().list("") == []  # the Worker was never written to
    with pytest.raises(StorageCapabilityMissing) as info:
        Store.open(tmp_path / "api", profile="cloudflare-d1")
    assert info.value.profile == "cloudflare-d1"
    assert [m.split(" ")[0] for m in info.value.missing] == ["CONTEXTFUL_D1_URL", "CONTEXTFUL_D1_TOKEN"]


@pytest.mark.clause("run.journal.storage-incomplete")
def test_a_corpus_that_lost_its_store_json_refuses_and_mints_none(bound_env: dict[str, str], d1_binding: D1Binding,
                                                                 tmp_path: Path) -> None:
    first = project(tmp_path / "a")
    (first / "raw").mkdir()
    (first / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    contextful_in(first, "store", "provision", env=bound_env)
    contextful_in(first, "pipeline", "run", env=bound_env)
    client = d1_binding.client()
    client.delete(f"{CORPUS_PREFIX}/store.json")  # the corpus lost its state; D1 still serves the store

    proc = contextful_in(project(tmp_path / "b"), "pipeline", "run", env=bound_env, check=False)
    assert proc.returncode != 0 and "error: StorageCapabilityMissing" in proc.stderr
    assert "the corpus state" in proc.stderr and "store.json" in proc.stderr
    assert client.get(f"{CORPUS_PREFIX}/store.json") is None  # no new store minted over the lost one


@pytest.fixture
def bound_env(d1_binding: D1Binding) -> dict[str, str]:
    return profile_env(d1_binding)
