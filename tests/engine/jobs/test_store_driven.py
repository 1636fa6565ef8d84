"""Store-driven jobs fired through their runner over real stores (local/SQLite, PostgreSQL catalog,
S3 root): the applied version's declaration, the body a ``[project] modules`` module registers, at
most ``max_in_flight`` items at once, each item's rows and ``_items`` row in one commit, a failing
item failing alone, a stopped fire resumed without redoing settled items, and changed structure
meeting pinned-plan-changed before any replay or publication."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.jobs.scope import job_scope
from contextful.engine.read import connect
from contextful.storage import Store
from contextful.storage.errors import (
    JobDelegateUnbound,
    JobItemKeyInvalid,
    OwnerPlanMismatch,
)
from contextful.storage.journal import CLOSED_FAILED, CLOSED_OK, PENDING

from tests.conftest import StoreFactory
from tests.engine.jobs.project import applied, bodies, fire, fire_context, reset_bodies, rows, write_project

DOCS = pa.table({"doc_id": ["d1", "d2", "d3", "d4", "d5"], "body": ["a", "bb", "ccc", "dddd", "eeeee"]})


@pytest.fixture
def store(make_store: StoreFactory, store_kind: str) -> Iterator[Store]:
    from contextful.storage.clock import ManualClock

    store = make_store(clock=ManualClock())
    store.append("documents", DOCS)
    store.clock.advance(1)
    reset_bodies()
    yield store
    reset_bodies()


def items(store: Store) -> list[tuple]:
    return rows(store, "SELECT logical_key, outcome, attempts, execution_id FROM _items ORDER BY logical_key")


@pytest.mark.clause("surface.fire.scheduled-body")
def test_a_fire_hands_every_row_to_the_registered_body_of_the_applied_version(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project")
    version = applied(root)
    # An unapplied edit of the working file changes nothing a fire reads.
    write_project(root, statement="SELECT doc_id, body FROM documents WHERE doc_id = 'd1'", tables='"other"')
    outcome = fire(fire_context(root, version, store))
    assert outcome.ok, outcome
    assert (outcome.rows, outcome.detail["completed"]) == (5, 5)
    assert sorted(bodies().CALLS) == ["d1", "d2", "d3", "d4", "d5"]
    oracle = rows(store, "SELECT doc_id, length(body) FROM documents ORDER BY doc_id")  # plain DuckDB over the input
    assert rows(store, "SELECT doc_id, score FROM scores ORDER BY doc_id") == oracle
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == CLOSED_OK
    assert owner.scope == "host:job:score-documents"
    assert items(store) == [(k, "completed", 1, owner.execution_id) for k in ["d1", "d2", "d3", "d4", "d5"]]
    assert "other" not in store.table_names()


@pytest.mark.clause("surface.fire.scheduled-body")
def test_at_most_max_in_flight_items_run_at_once(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project", statement="SELECT doc_id, body FROM documents WHERE doc_id < 'd5'")
    bodies_module = _imported(root)
    bodies_module.BARRIER.append(threading.Barrier(2))  # two bodies must meet: a lone one times out and fails
    outcome = fire(fire_context(root, applied(root), store))
    assert outcome.ok, outcome
    assert bodies_module.IN_FLIGHT[1] == 2
    assert rows(store, "SELECT count(*) FROM _items WHERE outcome = 'completed'") == [(4,)]


@pytest.mark.clause("surface.fire.scheduled-body")
def test_a_failing_item_fails_alone_by_name_under_the_retry_budget(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project")
    module = _imported(root)
    module.PERMANENT.add("d2")
    module.TRANSIENT.update({"d3": 1, "d4": 5})  # d3 recovers on its 2nd attempt; d4 spends the budget of 2
    outcome = fire(fire_context(root, applied(root), store))
    assert not outcome.ok
    assert sorted(line.split(":")[0] for line in outcome.failures) == ["item 'd2'", "item 'd4'"]
    assert any("ValueError: cannot score d2" in line for line in outcome.failures)
    got = {k: (o, a) for k, o, a, _e in items(store)}
    assert got == {"d1": ("completed", 1), "d2": ("permanent", 1), "d3": ("completed", 2), "d4": ("exhausted", 2),
                   "d5": ("completed", 1)}
    assert rows(store, "SELECT doc_id FROM scores ORDER BY doc_id") == [("d1",), ("d3",), ("d5",)]
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == CLOSED_FAILED


@pytest.mark.clause("surface.fire.scheduled-history")
def test_a_stopped_fire_is_resumed_by_the_next_without_redoing_settled_items(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project", max_in_flight=1)
    version = applied(root)
    module = _imported(root)
    stop = threading.Event()
    module.ANSWERED["d2"] = stop  # the fire is stopped (serve stopping) once d2 is answered
    first = fire(fire_context(root, version, store, cancel=stop))
    assert not first.ok and first.detail["left"] == 0 and first.detail["completed"] == 2
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == PENDING
    assert [k for k, *_ in items(store)] == ["d1", "d2"]
    # Rows landing after the execution opened are not its items: it reads as of its recorded instant.
    store.append("documents", pa.table({"doc_id": ["d0"], "body": ["late"]}))
    module.CALLS.clear()
    second = fire(fire_context(root, version, store))
    assert second.ok, second
    assert module.CALLS == ["d3", "d4", "d5"]
    assert (second.detail["resumed"], second.detail["settled_before"]) == (True, 2)
    assert second.detail["execution"] == first.detail["execution"] == owner.execution_id
    assert [(k, o) for k, o, _a, _e in items(store)] == [(k, "completed") for k in ["d1", "d2", "d3", "d4", "d5"]]
    assert {e for *_, e in items(store)} == {owner.execution_id}
    assert rows(store, "SELECT doc_id, count(*) FROM scores GROUP BY doc_id ORDER BY doc_id") == \
        [(k, 1) for k in ["d1", "d2", "d3", "d4", "d5"]]


@pytest.mark.clause("surface.fire.executable-pin")
@pytest.mark.parametrize("change", ["output membership", "input declaration", "input shape", "statement"])
def test_changed_structure_under_a_pending_execution_meets_pinned_plan_changed(
        tmp_path: Path, store: Store, change: str) -> None:
    root = write_project(tmp_path / "project", max_in_flight=1)
    version = applied(root)
    module = _imported(root)
    stop = threading.Event()
    module.ANSWERED["d1"] = stop
    fire(fire_context(root, version, store, cancel=stop))
    pending = store.journal.owner(job_scope("score-documents").key)
    assert pending is not None and pending.status == PENDING
    if change == "output membership":
        write_project(root, max_in_flight=1, tables='"scores", "extra"')
    elif change == "input declaration":
        (root / "contextful.toml").write_text((root / "contextful.toml").read_text().replace(
            'id = "documents"', 'id = "documents_feed"'))
    elif change == "statement":
        write_project(root, max_in_flight=1, statement="SELECT doc_id, body FROM documents WHERE body <> ''")
    else:  # a new column lands in the input relation
        store.append("documents", pa.table({"doc_id": ["d9"], "body": ["x"], "lang": ["en"]}))
    if change != "input shape":
        version = applied(root)
    module.CALLS.clear()
    before = items(store), rows(store, "SELECT count(*) FROM scores")
    with pytest.raises(OwnerPlanMismatch) as raised:
        fire(fire_context(root, version, store))
    assert raised.value.fields["execution"] == pending.execution_id
    assert raised.value.fields["pinned"] == pending.plan_ref
    assert module.CALLS == []  # nothing replayed, nothing handed over
    assert (items(store), rows(store, "SELECT count(*) FROM scores")) == before  # nothing published
    assert store.journal.owner(job_scope("score-documents").key) == pending


def test_unchanged_structure_under_a_new_version_resumes(tmp_path: Path, store: Store) -> None:
    """A schedule or bound change is no structure: the pending execution resumes under the new version."""
    root = write_project(tmp_path / "project", max_in_flight=1)
    version = applied(root)
    module = _imported(root)
    stop = threading.Event()
    module.ANSWERED["d1"] = stop
    first = fire(fire_context(root, version, store, cancel=stop))
    write_project(root, max_in_flight=3)
    second = fire(fire_context(root, applied(root), store))
    assert second.ok and second.detail["execution"] == first.detail["execution"]
    assert second.detail["settled_before"] == 1


@pytest.mark.clause("surface.delegate.binding")
def test_an_unbound_delegate_refuses_at_fire_before_anything_opens(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project")
    version = applied(root)
    ctx = fire_context(root, version, store)
    import dataclasses

    delegated = dataclasses.replace(ctx, job=dataclasses.replace(ctx.job, body=None, delegate="stages"))
    with pytest.raises(JobDelegateUnbound) as raised:
        fire(delegated)
    assert (raised.value.fields["job"], raised.value.fields["delegate"]) == ("score-documents", "stages")
    assert store.journal.owner(job_scope("score-documents").key) is None


def test_a_repeated_item_key_refuses_and_hands_nothing_over(tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project",
                         statement="SELECT substr(doc_id, 1, 1) AS k, body FROM documents")
    refused = fire(fire_context(root, applied(root), store))
    assert not refused.ok and refused.failures[0].startswith(f"{JobItemKeyInvalid.__name__}: ")
    assert "'k'" in refused.failures[0]
    assert bodies().CALLS == []
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == CLOSED_FAILED  # a failed fire, recorded; the next opens anew


def _imported(root: Path):
    """The registration module, imported as parsing the project's manifest imports it."""
    from contextful.engine.config import load_manifest

    load_manifest(root)
    return bodies()


@pytest.mark.clause("surface.fire.scheduled-body")
def test_a_declared_as_of_reads_the_input_relation_as_of_that_instant(tmp_path: Path, store: Store) -> None:
    from contextful.storage.clock import from_us

    instant = from_us(store.clock.now_us()).isoformat()
    store.clock.advance(1)
    store.append("documents", pa.table({"doc_id": ["d6"], "body": ["later"]}))
    root = write_project(tmp_path / "project", extra=f'as_of = "{instant}"')
    outcome = fire(fire_context(root, applied(root), store))
    assert outcome.ok and outcome.detail["as_of"] == instant
    con = connect(store, as_of=instant)  # the read path's own as_of over the same store: the oracle
    try:
        oracle = con.sql("SELECT doc_id FROM documents ORDER BY doc_id").fetchall()
    finally:
        con.close()
    assert sorted(bodies().CALLS) == [k for (k,) in oracle] == ["d1", "d2", "d3", "d4", "d5"]


@pytest.mark.clause("surface.fire.scheduled-body")
def test_an_answer_for_a_table_the_job_does_not_write_fails_that_item_and_lands_nothing_of_it(
        tmp_path: Path, store: Store) -> None:
    root = write_project(tmp_path / "project")
    _imported(root).ELSEWHERE.add("d3")
    outcome = fire(fire_context(root, applied(root), store))
    assert outcome.failures == (("item 'd3': permanent: JobAnswerInvalid: [[job]] 'score-documents' item 'd3': the "
                                 "body's answer names table 'elsewhere', which is not among the job's tables "
                                 "(scores)"),)
    assert "elsewhere" not in store.table_names()
    assert rows(store, "SELECT doc_id FROM scores ORDER BY doc_id") == [("d1",), ("d2",), ("d4",), ("d5",)]


CHILD = """
import sys
from contextful.engine.control.apply import load_version
from contextful.engine.jobs.fire import fire_in
from contextful.storage import Store
from contextful.storage.catalog.postgres import PostgresCatalog

root, version, store_root, dsn, schema = sys.argv[1:]
store = Store.open(store_root, catalog=PostgresCatalog(dsn, schema) if dsn else None)
manifest = load_version(__import__("pathlib").Path(root), int(version))
fire_in(store, manifest, int(version), manifest.jobs[0])
"""


@pytest.mark.clause("surface.fire.scheduled-history")
@pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_fire_killed_mid_items_is_resumed_at_once_by_the_next_without_redoing_settled_items(
        tmp_path: Path, make_store: StoreFactory, store_kind: str, request: pytest.FixtureRequest) -> None:
    """A real child process (a unit child under serve) is SIGKILLed while its third item runs; the
    next fire takes the dead holder's execution over at once and hands over only what is unsettled."""
    import os
    import signal
    import subprocess
    import sys

    store = make_store()  # the system clock: the child's lease is a real one
    store.append("documents", DOCS)
    reset_bodies()
    root = write_project(tmp_path / "project", max_in_flight=1)
    version = applied(root)
    dsn, schema = "", ""
    if store_kind == "postgres":
        dsn, schema = store.catalog.dsn, store.catalog.schema
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(version), str(store.objects.root), dsn, schema],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "STOREDRIVEN_BLOCK_AT": "d3"})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "blocked d3"  # d1 and d2 are committed by now
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    owner = store.journal.owner(job_scope("score-documents").key)
    assert owner is not None and owner.status == PENDING and owner.lease_expires_us > store.clock.now_us()
    assert [k for k, *_ in items(store)] == ["d1", "d2"]
    module = _imported(root)
    module.CALLS.clear()
    outcome = fire(fire_context(root, version, store))
    assert outcome.ok, outcome
    assert (outcome.detail["execution"], outcome.detail["attempt"]) == (owner.execution_id, 2)
    assert module.CALLS == ["d3", "d4", "d5"]
    assert rows(store, "SELECT doc_id, count(*) FROM scores GROUP BY doc_id ORDER BY doc_id") == \
        [(k, 1) for k in ["d1", "d2", "d3", "d4", "d5"]]
    assert [(k, o, e) for k, o, _a, e in items(store)] == [(k, "completed", owner.execution_id)
                                                           for k in ["d1", "d2", "d3", "d4", "d5"]]
    reset_bodies()
