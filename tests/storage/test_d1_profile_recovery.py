"""The D1 profile's recovery identity and backup (``run.journal.d1-recovery``, ``run.journal.d1-backup``,
and the D1 half of ``run.journal.execution-recovery``).

The identity binds the store and the binding's namespace to the R2 identity object's generation;
an execution is admitted only while D1 and R2 agree. ``contextful store backup`` captures the
execution database, the R2 frontier, the identity and the schema.

Real components: the session's Worker under miniflare (a fresh namespace per test), the CLI as a
child process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.storage import ManualClock, Store
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.recovery import EXECUTION_TABLES, IDENTITY_KEY, provision
from contextful.storage.errors import ExecutionRecoveryMismatch

from tests.storage.test_d1_profile import profile_env, project
from tests.support.cli import contextful_in

pytestmark = pytest.mark.d1

PLAN = plan_reference({"job": "d1-recovery"})


@pytest.fixture
def bound(d1_binding: D1Binding, monkeypatch: pytest.MonkeyPatch) -> Iterator[D1Binding]:
    for key, value in profile_env(d1_binding).items():
        monkeypatch.setenv(key, value)
    yield d1_binding


def tables(binding: D1Binding) -> set[str]:
    placed = binding.client().sql("cf_")
    return {str(n)[len(placed):] for (n,) in binding.client().query(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, ?) = ?", (len(placed), placed))}


@pytest.mark.clause("run.journal.execution-recovery")
def test_normal_start_up_provisions_nothing_and_admits_no_execution(d1_binding: D1Binding, tmp_path: Path) -> None:
    where = project(tmp_path / "p")
    (where / "raw").mkdir()
    (where / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    proc = contextful_in(where, "pipeline", "run", env=profile_env(d1_binding), check=False)
    assert proc.returncode != 0 and "error: ExecutionRecoveryMismatch" in proc.stderr
    assert "execution tables" in proc.stderr and "cf_journal_owners" in proc.stderr
    assert not {t.removeprefix("cf_") for t in EXECUTION_TABLES} & tables(d1_binding)  # none made
    assert d1_binding.client().get(IDENTITY_KEY) is None
    assert d1_binding.client().query("SELECT count(*) FROM cf_commits") == [(0,)]  # nothing landed


@pytest.mark.clause("run.journal.d1-recovery", "run.journal.execution-recovery")
def test_a_missing_identity_object_refuses_admission(bound: D1Binding, tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        identity = provision(store)
        assert open_execution(store.journal, "job:a", PLAN).execution_id  # admitted
    assert json.loads(bound.client().get(IDENTITY_KEY) or b"{}") == {
        "recovery_id": identity.recovery_id, "store_uuid": identity.store_uuid, "schema": bound.namespace,
        "generation": identity.generation}

    bound.client().delete(IDENTITY_KEY)  # the R2 frontier lost the object
    with Store.open(tmp_path / "store") as store, pytest.raises(ExecutionRecoveryMismatch) as info:
        store.journal  # noqa: B018 - the property admits the execution
    assert info.value.schema == bound.namespace
    assert IDENTITY_KEY in info.value.reason and "missing" in info.value.reason


@pytest.mark.clause("run.journal.d1-recovery", "run.journal.execution-recovery")
def test_a_mismatched_generation_refuses_admission(bound: D1Binding, tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        identity = provision(store)
    client = bound.client()
    # The bucket restored apart from the database: the identity object of another generation.
    other = json.loads(client.get(IDENTITY_KEY) or b"{}") | {"generation": "g-elsewhere"}
    client.put(IDENTITY_KEY, json.dumps(other).encode())
    with Store.open(tmp_path / "fresh") as store:
        with pytest.raises(ExecutionRecoveryMismatch) as info:
            store.outbox  # noqa: B018
        assert identity.generation in info.value.reason and "g-elsewhere" in info.value.reason
        with pytest.raises(ExecutionRecoveryMismatch):
            open_execution(store.journal, "job:a", PLAN)
    assert client.query("SELECT count(*) FROM cf_journal_owners") == [(0,)]  # nothing admitted


@pytest.mark.clause("run.journal.execution-recovery")
def test_a_corpus_only_restore_admits_no_work_and_provision_refuses_it(bound: D1Binding, tmp_path: Path) -> None:
    with Store.open(tmp_path / "store") as store:
        identity = provision(store)
    client = bound.client()
    client.batch([("DROP TABLE cf_recovery", ()), ("DROP TABLE cf_journal_steps", ())])  # the database was lost
    with Store.open(tmp_path / "store") as store:
        with pytest.raises(ExecutionRecoveryMismatch) as info:
            provision(store)
        assert identity.recovery_id in info.value.reason and "corpus-only restore" in info.value.reason
        with pytest.raises(ExecutionRecoveryMismatch) as admitted:
            store.journal  # noqa: B018
        assert "cf_journal_steps" in admitted.value.reason and "cf_recovery" in admitted.value.reason
    assert "recovery" not in tables(bound)  # the refusal recorded no identity


def _provisioned_and_landed(binding: D1Binding, tmp_path: Path,
                            lines: str) -> tuple[Path, dict[str, str], dict[str, str]]:
    """A project on the profile: provisioned (its recovery identity, returned) and one file of ``lines`` landed."""
    env = profile_env(binding)
    where = project(tmp_path / "p")
    (where / "raw").mkdir()
    (where / "raw" / "a.ndjson").write_text(lines)
    identity = json.loads(contextful_in(where, "--json", "store", "provision", env=env).stdout)
    contextful_in(where, "pipeline", "run", env=env)
    return where, env, identity


@pytest.mark.clause("run.journal.d1-backup")
def test_store_backup_captures_the_execution_database_r2_frontier_identity_and_schema(
        d1_binding: D1Binding, tmp_path: Path) -> None:
    where, env, identity = _provisioned_and_landed(d1_binding, tmp_path, '{"id": 1}\n{"id": 2}\n')
    client = d1_binding.client()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        with Store.open(where / ".contextful" / "store") as store:
            execution = open_execution(store.journal, "job:paid", PLAN, clock=ManualClock())
            execution.step("call", lambda: {"paid": 1})
            digest = store.blobs.put(b"a paid answer")
            store.append("more", pa.table({"id": [3]}))

    out = tmp_path / "backup.json"
    summary = json.loads(contextful_in(where, "--json", "store", "backup", str(out), env=env).stdout)
    assert summary["recovery_id"] == identity["recovery_id"]
    backup = json.loads(out.read_text())
    assert backup["identity"] == identity
    captured = set(backup["database"])
    assert captured == {f"cf_{t}" for t in tables(d1_binding)}  # every table: guard and export rows included
    assert set(EXECUTION_TABLES) <= captured and {"cf_outbox_streams", "cf_outbox_events"} <= captured
    assert set(backup["schema"]["tables"]) == captured and backup["schema"]["namespace"] == d1_binding.namespace
    assert all(ddl.startswith("CREATE TABLE") for ddl in backup["schema"]["tables"].values())
    assert [row[0] for row in backup["database"]["cf_blobs"]] == [digest]
    assert any(row[0] == execution.execution_id for row in backup["database"]["cf_journal_steps"])
    assert {row[0] for row in backup["database"]["cf_tables"]} >= {"orders", "more"}
    frontier = {o["key"]: o["etag"] for o in backup["r2_frontier"]}
    assert frontier[f"blobs/{digest}"] == client.head(f"blobs/{digest}")
    assert frontier[IDENTITY_KEY] == client.head(IDENTITY_KEY) and "corpus/store.json" in frontier
    parts = [k for k in frontier if k.startswith("corpus/tables/orders/parts/")]
    assert parts and all(frontier[k] == client.head(k) for k in parts)


@pytest.mark.clause("run.journal.d1-backup")
def test_a_writer_committing_during_the_capture_refuses_it(bound: D1Binding, tmp_path: Path) -> None:
    from contextful.storage.d1.recovery import capture

    with Store.open(tmp_path / "store") as store:
        provision(store)
        store.append("t", pa.table({"id": [1]}))
        assert capture(store)["identity"]["store_uuid"] == store.uuid  # quiet writers: captured

        def late_writer() -> None:
            store.append("t", pa.table({"id": [2]}))

        with pytest.raises(ExecutionRecoveryMismatch) as info:
            capture(store, during=late_writer)
        assert "a writer committed while the backup was captured" in info.value.reason


def _lose_the_database(binding: D1Binding) -> None:
    """The D1 database is lost (its R2 namespace survives): every ``cf_…`` table of the namespace dropped."""
    client = binding.client()
    client.batch([(f"DROP TABLE cf_{name}", ()) for name in sorted(tables(binding))])
    assert not tables(binding)


@pytest.mark.clause("run.journal.d1-backup", "run.journal.d1-recovery")
def test_store_restore_puts_a_lost_database_back_and_runs_resume_where_they_stopped(
        d1_binding: D1Binding, tmp_path: Path) -> None:
    where, env, identity = _provisioned_and_landed(d1_binding, tmp_path, '{"id": 1}\n{"id": 2}\n')
    backup = tmp_path / "backup.json"
    contextful_in(where, "store", "backup", str(backup), env=env)
    before = {t: d1_binding.client().query(f"SELECT count(*) FROM cf_{t}")[0][0] for t in tables(d1_binding)}

    _lose_the_database(d1_binding)
    lost = contextful_in(where, "pipeline", "run", env=env, check=False)
    assert lost.returncode != 0 and "error: ExecutionRecoveryMismatch" in lost.stderr

    restored = json.loads(contextful_in(where, "--json", "store", "restore", str(backup), env=env).stdout)
    assert restored["recovery_id"] == identity["recovery_id"] and restored["objects_checked"] > 0
    assert {t: d1_binding.client().query(f"SELECT count(*) FROM cf_{t}")[0][0] for t in before} == before
    # admitted again, where it stopped: the landed file is not read twice, a new one lands
    (where / "raw" / "b.ndjson").write_text('{"id": 3}\n')
    again = json.loads(contextful_in(where, "--json", "pipeline", "run", env=env).stdout)
    assert again[0]["ok"] and again[0]["tables"][0]["rows"] == 1
    rows = json.loads(contextful_in(where, "--json", "sql", "SELECT count(*) AS n, count(DISTINCT id) AS d FROM orders",
                                    env=env).stdout)
    assert rows == [{"n": 3, "d": 3}]

    # a living database is never overwritten: the restore refuses and changes nothing
    heads = d1_binding.client().query("SELECT name, commit_seq FROM cf_tables ORDER BY name")
    refused = contextful_in(where, "store", "restore", str(backup), env=env, check=False)
    assert refused.returncode != 0 and "error: ExecutionRecoveryMismatch" in refused.stderr
    assert f"records recovery identity {identity['recovery_id']}" in refused.stderr
    assert d1_binding.client().query("SELECT name, commit_seq FROM cf_tables ORDER BY name") == heads


@pytest.mark.clause("run.journal.d1-recovery")
def test_a_restore_whose_r2_frontier_lost_an_object_refuses_naming_it_and_writes_nothing(
        d1_binding: D1Binding, tmp_path: Path) -> None:
    where, env, _identity = _provisioned_and_landed(d1_binding, tmp_path, '{"id": 1}\n')
    backup = tmp_path / "backup.json"
    contextful_in(where, "store", "backup", str(backup), env=env)
    part = next(o["key"] for o in json.loads(backup.read_text())["r2_frontier"] if "/parts/" in o["key"])

    _lose_the_database(d1_binding)
    d1_binding.client().delete(part)  # R2 lost an object the captured catalog references
    proc = contextful_in(where, "store", "restore", str(backup), env=env, check=False)
    assert proc.returncode != 0 and "error: ExecutionRecoveryMismatch" in proc.stderr
    assert f"the R2 object {part} of the backup's frontier is missing" in proc.stderr
    assert "recovery" not in tables(d1_binding)  # nothing restored: no identity admits work

    tampered = json.loads(backup.read_text())
    tampered["schema"]["tables"]["cf_recovery"] += " "
    backup.write_text(json.dumps(tampered))
    proc = contextful_in(where, "store", "restore", str(backup), env=env, check=False)
    assert "does not match its digest" in proc.stderr and "recovery" not in tables(d1_binding)
