"""``surface.fire.scheduled-history``, first half: a scheduled store-driven job's next fire is
computed from its host execution's recorded start, failed attempts included, read from the journal
on the SQLite and the PostgreSQL catalogs (``engine.jobs.scope.last_start_us``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.control.arm import ArmedEntry, ArmedSet, History
from contextful.engine.control.schedule import parse_schedule
from contextful.engine.jobs.scope import job_scope, last_start_us
from contextful.storage import Store
from contextful.storage.clock import ManualClock
from contextful.storage.journal import CLOSED_FAILED, CLOSED_OK

from tests.conftest import StoreFactory
from tests.engine.jobs.project import applied, fire, fire_context, reset_bodies, write_project
from tests.engine.jobs.test_store_driven import _imported

MINUTE_US = 60_000_000
MINUTE0 = 1_900_000_020_000_000  # a minute boundary (a whole multiple of 60 s since the epoch)
T0 = MINUTE0 + 17_000_000


@pytest.fixture(params=["local", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_kind(request: pytest.FixtureRequest) -> str:
    """The journal's catalogs: SQLite (the local root's) and PostgreSQL."""
    return request.param


@pytest.fixture
def store(make_store: StoreFactory, store_kind: str) -> Iterator[Store]:
    store = make_store(clock=ManualClock(T0))
    store.append("documents", pa.table({"doc_id": ["d1", "d2"], "body": ["a", "bb"]}))
    reset_bodies()
    yield store
    reset_bodies()


def next_fire(store: Store, schedule: str) -> int:
    """The job's next fire as serve's armed set computes it from the journal's recorded start."""
    armed = ArmedSet([ArmedEntry("job:score-documents", parse_schedule(schedule, "job:score-documents"))], T0)
    armed.update("job:score-documents", History(last_start_us(store.journal, "score-documents")))
    return armed.next_fire("job:score-documents")


@pytest.mark.clause("surface.fire.scheduled-history")
def test_the_next_fire_follows_the_recorded_start_of_each_execution_failed_ones_included(
        tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project")
    version = applied(root)
    assert last_start_us(store.journal, "score-documents") is None  # never ran: due at once when armed
    assert next_fire(store, "every 1m") == T0

    _imported(root).PERMANENT.add("d2")  # the first fire fails an item: its execution closes failed
    assert not fire(fire_context(root, version, store)).ok
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == CLOSED_FAILED
    assert last_start_us(store.journal, "score-documents") == T0
    assert next_fire(store, "every 1m") == MINUTE0 + MINUTE_US  # the next minute after the start

    store.clock.advance(150)  # a fire whose statement fails: a failed fire, recorded, its start too
    write_project(root, statement="SELECT doc_id, body FROM no_such_table")
    broken = applied(root)
    failed = fire(fire_context(root, broken, store))
    assert not failed.ok and failed.failures[0].startswith("QueryInvalid")
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == CLOSED_FAILED
    assert last_start_us(store.journal, "score-documents") == T0 + 150_000_000
    assert next_fire(store, "every 1m") == MINUTE0 + 3 * MINUTE_US  # start at MINUTE0 + 167 s

    store.clock.advance(60)  # the next fire is a new execution: its start is the one recorded
    assert not fire(fire_context(root, broken, store)).ok
    assert last_start_us(store.journal, "score-documents") == T0 + 210_000_000


@pytest.mark.clause("surface.fire.scheduled-history")
def test_a_later_successful_execution_moves_the_recorded_start(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project")
    version = applied(root)
    assert fire(fire_context(root, version, store)).ok
    store.clock.advance(3600)
    assert fire(fire_context(root, version, store)).ok
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == CLOSED_OK
    assert last_start_us(store.journal, "score-documents") == T0 + 3_600_000_000
