"""Isolated items of a store-driven job whose body is registered (no delegate, so nothing defers):
the ``logical_key`` column names each item, its entity lands in ``_items``, and ``max_attempts``
is its budget in place of the job's ``retry`` attempts (docs/jobs.md, "Isolated items and parking")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.storage import Store
from contextful.storage.clock import ManualClock

from tests.engine.jobs.project import applied, bodies, fire, fire_context, reset_bodies, rows, write_project

DOCS = pa.table({"doc_id": ["d1", "d2", "d3"], "body": ["a", "bb", "ccc"]})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(str(tmp_path / "store"), clock=ManualClock())
    store.append("documents", DOCS)
    store.clock.advance(1)
    reset_bodies()
    yield store
    reset_bodies()
    store.close()


@pytest.mark.clause("run.items.outcome-record", "run.items.terminal-outcome")
def test_an_isolated_item_is_named_by_its_logical_key_and_spends_max_attempts_not_the_jobs_retry(
        tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project", statement="SELECT body, doc_id FROM documents ORDER BY doc_id",
                         extra='isolated_items = { logical_key = "doc_id", entity_key = "body", max_attempts = 3 }')
    load_manifest(root)  # imports the registration module
    # the job's retry allows 2 attempts: d2 recovers on its 3rd, d3 spends the 3 isolated_items allows
    bodies().TRANSIENT.update({"d2": 2, "d3": 5})
    outcome = fire(fire_context(root, applied(root), store))
    assert not outcome.ok
    assert rows(store, "SELECT logical_key, entity_namespace, entity_key, outcome, attempts FROM _items "
                       "ORDER BY logical_key") == [("d1", "job:score-documents", "a", "completed", 1),
                                                   ("d2", "job:score-documents", "bb", "completed", 3),
                                                   ("d3", "job:score-documents", "ccc", "exhausted", 3)]
    assert sorted(bodies().CALLS) == ["d1", "d2", "d2", "d2", "d3", "d3", "d3"]
