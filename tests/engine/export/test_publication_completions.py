"""Producer completions (``run.export.group-source``): a successful store-driven job or materialized
model build, fired as a user fires it (``contextful job fire``, a child process over a real project
and SQLite store), records ONE immutable completion binding its run id (the fire's execution),
its pinned input frontier and every output's frontier, an empty output included. Each frontier is
checked against an independent oracle: the store's heads read through ``Store.pin`` after the fire."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from contextful.engine.export.publications import Completion, open_completions
from contextful.engine.project import open_store

from tests.engine.export.publication_project import BODIES, Project


@pytest.fixture
def project(tmp_path: Path) -> Project:
    found = Project(tmp_path / "p")
    found.cli("pipeline", "import")
    found.land("a", [1, 2, 3])
    return found


@pytest.mark.clause("run.export.group-source")
def test_a_store_driven_fire_records_one_completion_with_every_output_frontier(project: Project) -> None:
    orders_at_fire = project.heads(["orders"])["orders"]
    fired = project.fire("enrich")
    assert fired["status"] == "ok", fired
    project.land("b", [4])  # a later input commit: not in the completed run's frontier
    heads = project.heads(["enriched", "orders"])
    assert heads["orders"] > orders_at_fire
    [completion] = project.completions()
    assert completion["producer"] == "enrich" and completion["kind"] == "store-driven"
    assert completion["run_id"] == fired["execution"]
    assert completion["input_frontier"]["as_of_us"] > 0
    assert completion["input_frontier"]["tables"] == {"orders": orders_at_fire}
    # every output, the empty one included (no item wrote "rejected": no commit)
    assert completion["outputs"] == [{"table": "enriched", "commit_seq": heads["enriched"]},
                                     {"table": "rejected", "commit_seq": None}]
    store = open_store(project.root)
    try:
        completions = open_completions(store)
        assert completions is not None
        assert completions.latest("enrich") == Completion.from_json(completion)
        assert completions.of_run(fired["execution"]) == Completion.from_json(completion)
    finally:
        store.close()


@pytest.mark.clause("run.export.group-source")
def test_a_materialized_build_records_its_models_build_ids_and_watermarks(project: Project) -> None:
    fired = project.fire("build_reports")
    assert fired["status"] == "ok", fired
    heads = project.heads(["daily", "weekly", "orders"])
    [completion] = project.completions()
    assert (completion["producer"], completion["kind"], completion["run_id"]) == ("build_reports", "build",
                                                                                  fired["execution"])
    assert completion["outputs"] == [{"table": "daily", "commit_seq": heads["daily"]},
                                     {"table": "weekly", "commit_seq": heads["weekly"]}]
    assert completion["input_frontier"] == {"watermarks": {"daily": {"orders": heads["orders"]},
                                                           "weekly": {"orders": heads["orders"]}}}
    # a fire that materializes nothing (every model current) records nothing
    again = project.fire("build_reports")
    assert again["status"] == "ok" and "nothing to build" in again["summary"], again
    assert len(project.completions()) == 1


@pytest.mark.clause("run.export.group-source")
def test_a_completion_is_one_immutable_record(project: Project) -> None:
    fired = project.fire("enrich")
    [completion] = project.completions()
    store = open_store(project.root)
    try:
        completions = open_completions(store)
        assert completions is not None
        forged = Completion.from_json(completion | {"outputs": [{"table": "enriched", "commit_seq": 999}]})
        kept = completions.record(forged)  # the same run recorded again keeps its first record
        assert kept == Completion.from_json(completion)
    finally:
        store.close()
    with closing(sqlite3.connect(project.catalog)) as conn:
        for statement in ("UPDATE cf_publication_completions SET body = '{}'",
                          "DELETE FROM cf_publication_completions"):
            with pytest.raises(sqlite3.IntegrityError, match="a producer completion is immutable"):
                conn.execute(statement)
    assert project.completions() == [completion]
    assert completion["run_id"] == fired["execution"]


@pytest.mark.clause("run.export.group-source")
def test_a_failed_fire_records_no_completion(project: Project) -> None:
    """One item failing for good fails the fire: it completed nothing, and records nothing."""
    failing = BODIES.replace("def enrich(row):\n", "def enrich(row):\n    if row[\"id\"] == 2:\n        raise ValueError(\"no\")\n")
    (project.root / "shop" / "bodies.py").write_text(failing)
    failed = project.cli("--json", "job", "fire", "enrich", check=False)
    assert failed.returncode != 0
    outcome = json.loads(failed.stdout)
    assert outcome["status"] == "failed" and outcome["detail"]["completed"] == 2, outcome
    assert project.completions() == []
