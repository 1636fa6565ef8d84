"""The container profile (``CONTEXTFUL_STORAGE_PROFILE=postgres``): what it selects, how the corpus
moves between the bucket and a working directory, and what it refuses before admitting an execution.

Real components: the session's PostgreSQL server (a fresh schema per test) and its S3-compatible
server (a fresh bucket per test). The end-to-end disposable machine is ``test_disposable_machine``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.storage import ManualClock, Store
from contextful.storage.blobs.postgres import PostgresBlobStore
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.container import EXECUTION_TABLES, RECOVERY_KEY, provision
from contextful.storage.corpus import CorpusMirror
from contextful.storage.errors import ExecutionRecoveryMismatch, StagingFailed, StorageCapabilityMissing
from contextful.storage.journal.postgres import PostgresJournalStore
from contextful.storage.objects import ObjectStore
from contextful.storage.outbox.postgres import PostgresOutboxStore

from tests.storage.container_site import ContainerSite
from tests.support.cli import contextful_in
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.postgres, pytest.mark.s3]

PLAN = plan_reference({"job": "container"})


@pytest.fixture
def site(pg_dsn: str, pg_schema: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[ContainerSite]:
    found = ContainerSite.fresh(pg_dsn, pg_schema, s3_server)
    for key, value in found.env.items():
        monkeypatch.setenv(key, value)
    yield found
    found.drop()


def bucket(site: ContainerSite) -> ObjectStore:
    return ObjectStore(site.bucket)


def open_in(directory: Path) -> Store:
    return Store.open(directory / "store")


@pytest.mark.clause("run.journal.container-profile", "run.journal.postgres-stores")
def test_the_profile_keeps_every_recorded_value_off_the_local_disk(site: ContainerSite, tmp_path: Path) -> None:
    first = open_in(tmp_path / "machine-a")
    provision(first)
    assert isinstance(first.objects, CorpusMirror) and first.objects.corpus_url == site.bucket
    assert isinstance(first.catalog, PostgresCatalog) and first.catalog.schema == site.schema
    journal, blobs, outbox = first.journal, first.blobs, first.outbox
    assert isinstance(journal, PostgresJournalStore) and journal.schema == site.schema
    assert isinstance(blobs, PostgresBlobStore) and blobs.schema == site.schema
    assert isinstance(outbox, PostgresOutboxStore) and outbox.schema == site.schema
    clock = ManualClock()
    execution = open_execution(journal, "job:orders", PLAN, lease_s=60.0, clock=clock)
    recorded = execution.step("fetch", lambda: {"rows": 3})
    digest = blobs.put(b"a paid answer")
    first.create_table("orders").append(pa.table({"id": [1, 2, 3]}))
    # push-after-run: every object the run wrote is in the bucket once the commit returned.
    parts = [p.path for p in first.catalog.live_parts("orders", first.table("orders").head.commit_seq)]
    assert parts and all(bucket(site).exists(key) for key in parts)
    assert bucket(site).exists("store.json")
    first.close()
    shutil.rmtree(tmp_path / "machine-a")  # the machine is gone: store cache, spool, temp

    second = open_in(tmp_path / "machine-b")
    assert second.uuid == first.uuid  # store.json came from the bucket, not minted afresh
    # pull-before-run: reading the snapshot pulls its parts into the new working copy first.
    assert not any((tmp_path / "machine-b" / "store" / key).exists() for key in parts)
    assert second.table("orders").to_arrow().column("id").to_pylist() == [1, 2, 3]
    assert all((tmp_path / "machine-b" / "store" / key).exists() for key in parts)
    assert second.blobs.get(digest) == b"a paid answer"
    clock.advance(61)  # machine a never renews again: its lease lapses
    again = open_execution(second.journal, "job:orders", PLAN, lease_s=60.0, clock=clock)
    assert again.execution_id == execution.execution_id
    assert again.step("fetch", lambda: pytest.fail("a recorded step ran again")) == recorded
    again.close(ok=True)
    second.close()


@pytest.mark.clause("run.journal.container-profile")
def test_a_run_whose_objects_cannot_reach_the_bucket_commits_nothing(site: ContainerSite, tmp_path: Path,
                                                                    s3_server: S3Server) -> None:
    store = open_in(tmp_path / "machine")
    table = store.create_table("orders")
    table.append(pa.table({"id": [1]}))
    assert isinstance(store.objects, CorpusMirror)
    store.objects.remote = ObjectStore(f"s3://missing-{s3_server.new_bucket()}x/corpus")  # the bucket went away
    with pytest.raises((StagingFailed, OSError)):
        table.append(pa.table({"id": [2]}))
    # The part lay whole on the local disk, but no commit references it.
    assert [c.commit_seq for c in store.catalog.commits("orders")] == [1]
    assert store.table("orders").to_arrow().column("id").to_pylist() == [1]
    store.close()


@pytest.mark.clause("run.journal.storage-incomplete")
def test_missing_bindings_refuse_before_any_execution_is_admitted(site: ContainerSite, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # No bucket, and the DSN only through libpq's own variables: both named, at once.
    monkeypatch.delenv("CONTEXTFUL_CORPUS_BUCKET")
    monkeypatch.delenv("CONTEXTFUL_POSTGRES_DSN")
    for key, value in psycopg.conninfo.conninfo_to_dict(site.dsn).items():
        monkeypatch.setenv({"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE",
                            "password": "PGPASSWORD"}[key], str(value))
    store = open_in(tmp_path / "unbound")
    with pytest.raises(StorageCapabilityMissing) as info:
        open_execution(store.journal, "job:x", PLAN)
    assert info.value.profile == "postgres"
    assert [m.split(" ")[0] for m in info.value.missing] == ["CONTEXTFUL_POSTGRES_DSN", "CONTEXTFUL_CORPUS_BUCKET"]
    with pytest.raises(StorageCapabilityMissing):
        store.outbox  # noqa: B018 - the property opens the outbox
    assert not set(EXECUTION_TABLES) & site.tables()  # nothing admitted, nothing provisioned
    store.close()


@pytest.mark.clause("run.journal.storage-incomplete")
def test_weak_guards_and_a_missing_corpus_refuse_before_admission(site: ContainerSite, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_in(tmp_path / "machine")
    provision(store)
    store.close()
    # A server session that acknowledges commits before they are durable: no strict guard.
    monkeypatch.setenv("CONTEXTFUL_POSTGRES_DSN", f"{site.dsn} options='-c synchronous_commit=off'")
    weak = open_in(tmp_path / "machine")
    with pytest.raises(StorageCapabilityMissing) as info:
        weak.journal  # noqa: B018
    assert len(info.value.missing) == 1 and "synchronous_commit is off" in info.value.missing[0]
    weak.close()
    monkeypatch.setenv("CONTEXTFUL_POSTGRES_DSN", site.dsn)
    # The corpus state: the bucket lost its store.json.
    bucket(site).delete(["store.json"])
    with pytest.raises(StorageCapabilityMissing) as info:
        open_in(tmp_path / "machine")  # the working copy still has one: the bucket decides
    assert info.value.missing[0].startswith(f"the corpus state: {site.bucket} holds no store.json")
    assert not bucket(site).exists("store.json")  # no new store was minted over the corpus


def test_a_machine_that_found_no_store_json_joins_the_store_another_opened_meanwhile(
        site: ContainerSite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The corpus-state check looked at the bucket, then at the catalog: a machine that opened the
    new store between the two made the other look like a lost corpus (``StorageCapabilityMissing``).
    Forced: the other machine opens right after this one found the bucket without ``store.json``."""
    looked = ObjectStore.exists
    meanwhile: list[Store] = []
    fired = False

    def exists(objects: ObjectStore, key: str) -> bool:
        nonlocal fired
        found = looked(objects, key)
        if key == "store.json" and not found and not fired:
            fired = True
            meanwhile.append(open_in(tmp_path / "machine-a"))  # its own look finds none either, then it binds
        return found

    monkeypatch.setattr(ObjectStore, "exists", exists)
    with open_in(tmp_path / "machine-b") as joined:
        assert meanwhile, "the other machine never opened in between"
        assert joined.uuid == meanwhile[0].uuid
    meanwhile[0].close()


@pytest.mark.clause("run.journal.storage-incomplete")
def test_a_profile_without_an_outbox_refuses_it(tmp_path: Path) -> None:
    with Store.open(tmp_path / "local") as store, pytest.raises(StorageCapabilityMissing) as info:
        store.outbox  # noqa: B018
    assert info.value.profile == "sqlite" and "a supported outbox" in info.value.missing[0]


@pytest.mark.clause("run.journal.execution-recovery")
def test_start_up_provisions_no_recovery_identity(site: ContainerSite, tmp_path: Path) -> None:
    store = open_in(tmp_path / "machine")
    with pytest.raises(ExecutionRecoveryMismatch) as info:
        open_execution(store.journal, "job:x", PLAN)
    assert info.value.schema == site.schema
    assert "cf_journal_owners" in info.value.reason and "cf_recovery" in info.value.reason
    assert "cf_recovery" not in site.tables() and not bucket(site).exists(RECOVERY_KEY)
    store.close()
    # The explicit step records it (the CLI verb), once; the same verb again changes nothing.
    env = site.env
    first = contextful_in(tmp_path, "--json", "--store", str(tmp_path / "machine" / "store"), "store", "provision",
                          env=env)
    identity = json.loads(first.stdout)
    again = contextful_in(tmp_path, "--json", "--store", str(tmp_path / "machine" / "store"), "store", "provision",
                          env=env)
    assert json.loads(again.stdout) == identity
    assert json.loads(bucket(site).get_bytes(RECOVERY_KEY))["recovery_id"] == identity["recovery_id"]
    store = open_in(tmp_path / "machine")
    execution = open_execution(store.journal, "job:x", PLAN)
    execution.close(ok=True)
    store.close()


@pytest.mark.clause("run.journal.execution-recovery")
def test_a_mismatched_recovery_identity_admits_nothing(site: ContainerSite, tmp_path: Path) -> None:
    store = open_in(tmp_path / "machine")
    identity = provision(store)
    store.close()
    # The execution database of another deployment restored here: another identity.
    site.sql("UPDATE cf_recovery SET value = %s", (json.dumps({**identity.__dict__, "recovery_id": "f" * 32}),))
    store = open_in(tmp_path / "machine")
    with pytest.raises(ExecutionRecoveryMismatch) as info:
        store.journal  # noqa: B018
    assert "f" * 32 in info.value.reason and identity.recovery_id in info.value.reason
    with pytest.raises(ExecutionRecoveryMismatch):
        store.outbox  # noqa: B018
    store.close()
    assert site.sql("SELECT count(*) FROM cf_journal_owners") == [(0,)]


@pytest.mark.clause("run.journal.execution-recovery")
def test_a_corpus_only_restore_admits_no_paid_or_effectful_work(site: ContainerSite, tmp_path: Path) -> None:
    store = open_in(tmp_path / "machine")
    provision(store)
    execution = open_execution(store.journal, "job:pay", PLAN)
    execution.step("charge the card", lambda: {"charged": True})
    store.close()
    site.drop()  # the execution database is lost; the bucket survives
    restored = open_in(tmp_path / "replacement")
    with pytest.raises(ExecutionRecoveryMismatch) as info:
        open_execution(restored.journal, "job:pay", PLAN)
    assert "missing" in info.value.reason
    with pytest.raises(ExecutionRecoveryMismatch) as info:
        provision(restored)  # the explicit step refuses too: it would re-admit the paid step
    assert "corpus-only restore" in info.value.reason
    with pytest.raises(ExecutionRecoveryMismatch):
        restored.outbox  # noqa: B018
    restored.close()
    assert not set(EXECUTION_TABLES) & site.tables()  # the refused step created nothing


@pytest.mark.clause("run.journal.container-profile")
def test_a_store_root_in_the_bucket_is_the_corpus_binding(site: ContainerSite, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXTFUL_CORPUS_BUCKET")
    with Store.open(site.bucket) as store:  # no working copy: every object is written to the bucket directly
        assert not isinstance(store.objects, CorpusMirror) and store.objects.url == site.bucket
        assert provision(store).corpus == site.bucket
        execution = open_execution(store.journal, "job:x", PLAN)
        execution.close(ok=True)
    assert json.loads(bucket(site).get_bytes(RECOVERY_KEY))["schema"] == site.schema
