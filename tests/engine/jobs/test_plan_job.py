"""Plan jobs fired through their runner over real stores: the compiled plan file beside the
manifest lowered onto ONE execution under ``job:<name>`` pinned to the plan's reference; a file
edited after compiling, or compiled from declarations no longer applied, refused; a recompiled file
under a pending execution meeting pinned-plan-changed; a stopped fire resumed as the same execution."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from contextful.engine.control.apply import apply_manifest, import_manifest, load_version
from contextful.engine.jobs.context import JobContext
from contextful.engine.jobs.plan_job import read_plan_file, write_plan_file
from contextful.engine.jobs.scope import job_scope
from contextful.engine.read import connect
from contextful.storage import Store
from contextful.storage.clock import ManualClock
from contextful.storage.errors import JobPlanInvalid, OwnerPlanMismatch
from contextful.storage.journal import CLOSED_OK, PENDING

from tests.conftest import StoreFactory
from tests.engine.jobs.project import fire

MANIFEST = """\
[project]
name = "planned"

[[pipeline]]
id = "orders"
primary_key = [{key}]
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]

[[model]]
name = "per_customer"
sql = "SELECT customer, count(*) AS n, sum(amount) AS amount FROM orders GROUP BY customer"

[[job]]
name = "nightly"
kind = "plan"
schedule = "0 2 * * *"
plan = "plans/all.json"
"""

ORDERS = [{"id": 1, "customer": "ada", "amount": 5}, {"id": 2, "customer": "lin", "amount": 7},
          {"id": 3, "customer": "ada", "amount": 11}]


@pytest.fixture
def store(make_store: StoreFactory, store_kind: str) -> Iterator[Store]:
    yield make_store(clock=ManualClock())


def project(root: Path, key: str = '"id"') -> Path:
    (root / "raw").mkdir(parents=True, exist_ok=True)
    (root / "plans").mkdir(exist_ok=True)
    (root / "raw" / "orders.ndjson").write_text("".join(json.dumps(o) + "\n" for o in ORDERS))
    (root / "contextful.toml").write_text(MANIFEST.format(key=key))
    return root


def compiled(root: Path, version: int) -> str:
    """Compile the applied version's plan into the job's plan file (what a user does after apply)."""
    return write_plan_file(load_version(root, version), root / "plans" / "all.json")


def context(root: Path, version: int, store: Store, cancel: threading.Event | None = None) -> JobContext:
    manifest = load_version(root, version)
    return JobContext(manifest.jobs[0], manifest, version, store, cancel=cancel or threading.Event())


@pytest.mark.clause("surface.fire.plan-job")
def test_a_plan_job_lowers_its_plan_file_onto_one_execution_pinned_to_the_plans_reference(
        tmp_path: Path, store: Store) -> None:
    root = project(tmp_path / "p")
    version = import_manifest(root).version
    reference = compiled(root, version)
    assert reference == load_version(root, version).plan.reference  # the plan's version: its content hash
    outcome = fire(context(root, version, store))
    assert outcome.ok, outcome
    assert outcome.detail["stages"]["pipelines"]["ran"] == ["orders"]
    assert outcome.detail["stages"]["models"]["ran"] == ["per_customer"]
    owner = store.journal.owner(job_scope("nightly").key)
    assert owner is not None and (owner.status, owner.plan_ref, owner.attempts) == (CLOSED_OK, reference, 1)
    assert owner.execution_id == outcome.detail["execution"]
    oracle = duckdb.sql(f"SELECT customer, count(*), sum(amount) FROM read_json_auto('{root}/raw/orders.ndjson') "
                        "GROUP BY customer ORDER BY customer").fetchall()  # plain DuckDB over the same input
    con = connect(store)
    try:
        assert con.sql("SELECT customer, n, amount FROM per_customer ORDER BY customer").fetchall() == oracle
    finally:
        con.close()


@pytest.mark.clause("surface.fire.plan-job")
def test_a_plan_file_edited_or_compiled_from_other_declarations_refuses_before_anything_opens(
        tmp_path: Path, store: Store) -> None:
    root = project(tmp_path / "p")
    version = import_manifest(root).version
    compiled(root, version)
    path = root / "plans" / "all.json"
    doc = json.loads(path.read_text())
    doc["plan"]["nodes"]["model:per_customer"]["sql"] = "SELECT 1 AS n"
    path.write_text(json.dumps(doc))
    with pytest.raises(JobPlanInvalid, match="edited after compiling"):
        fire(context(root, version, store))
    compiled(root, version)
    project(root, key='"id", "customer"')  # the pipeline's declaration changes and is applied
    applied = apply_manifest(root).version
    with pytest.raises(JobPlanInvalid) as raised:
        read_plan_file(context(root, applied, store))
    assert "pipeline:orders differ from the applied version 2" in raised.value.fields["why"]
    with pytest.raises(JobPlanInvalid):
        fire(context(root, applied, store))
    assert store.journal.owner(job_scope("nightly").key) is None
    assert "orders" not in store.table_names()


@pytest.mark.clause("surface.fire.plan-job")
def test_a_stopped_plan_fire_resumes_as_the_same_execution_and_a_recompiled_plan_meets_pinned_plan_changed(
        tmp_path: Path, store: Store) -> None:
    root = project(tmp_path / "p")
    version = import_manifest(root).version
    reference = compiled(root, version)
    stopped = threading.Event()
    stopped.set()  # serve stopping as the fire starts: nothing runs, the execution stays pending
    first = fire(context(root, version, store, cancel=stopped))
    assert not first.ok and first.detail["stages"] == {}
    pending = store.journal.owner(job_scope("nightly").key)
    assert pending is not None and (pending.status, pending.plan_ref) == (PENDING, reference)

    project(root, key='"id", "customer"')
    changed = apply_manifest(root).version
    compiled(root, changed)  # a new plan version while the old one's execution is pending
    with pytest.raises(OwnerPlanMismatch) as raised:
        fire(context(root, changed, store))
    assert (raised.value.fields["pinned"], raised.value.fields["execution"]) == (reference, pending.execution_id)
    assert "orders" not in store.table_names()  # nothing ran, nothing published

    project(root)  # back to the pinned declarations: the pending execution resumes
    back = apply_manifest(root).version
    compiled(root, back)
    second = fire(context(root, back, store))
    assert second.ok and (second.detail["execution"], second.detail["resumed"]) == (pending.execution_id, True)
    assert store.journal.owner(job_scope("nightly").key).status == CLOSED_OK
