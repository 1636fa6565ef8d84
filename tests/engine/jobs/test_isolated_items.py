"""Isolated items and defer parking (``surface.delegate.defer-parks``; docs/jobs.md, "Isolated items
and parking"), against the reference delegate (datasets/enrich_delegate.py) running as a real child
process on loopback.

Fires that travel in time run through ``engine.jobs.fire`` (what ``job fire`` and serve's job
children run) over a store on a :class:`ManualClock`, the engine's instant a defer's wait rides
(``surface.delegate.clocks``); the delegate's request log is the proof of what was sent. What a user
sees (the exit code, the "parked until" line, validation) runs through ``contextful`` itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.control.worker_key import KEY_VARIABLE
from contextful.engine.jobs.scope import job_scope
from contextful.engine.read import connect
from contextful.engine.run.execution import recorded_value
from contextful.engine.run.items import ItemOutcomes
from contextful.storage import Store
from contextful.storage.clock import ManualClock, from_us, to_us
from contextful.storage.journal import CLOSED_FAILED, CLOSED_OK, PENDING

from tests.engine.jobs.delegates import CHILD, KEY, Delegate, Start, applied, clocked_store, fire
from tests.engine.jobs.project import rows
from tests.support.cli import contextful_in

JOB = "stage-screen"
DUE = pa.table({"entity_id": ["e-1", "e-2", "e-3"], "pass_id": ["p-1", "p-2", "p-3"]})
"""The first column is the entity, not the item: the item is named by ``logical_key = "pass_id"``."""

MANIFEST = """\
[project]
name = "isolated"

[[external]]
id = "due_items"
table = "due_items"

[control.delegates.stages]
url = "{url}"
mode = "call"

[[job]]
name = "stage-screen"
kind = "store-driven"
schedule = "every 15m"
body = {{ delegate = "stages" }}
statement = "{statement}"
max_in_flight = {max_in_flight}
tables = ["screen_result"]
retry = {{ attempts = 5, base_s = 0, max_s = 0 }}
{isolated}
"""

ISOLATED = ('isolated_items = { logical_key = "pass_id", entity_key = "entity_id", entity_namespace = "entity", '
            'max_attempts = 3 }')
STATEMENT = "SELECT entity_id, pass_id FROM due_items ORDER BY pass_id"


def project(root: Path, url: str, *, isolated: str = ISOLATED, statement: str = STATEMENT,
            max_in_flight: int = 1) -> int:
    """Write the project and import (or apply) it: the version applied."""
    return applied(root, MANIFEST.format(url=url, isolated=isolated, statement=statement,
                                         max_in_flight=max_in_flight))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    store = clocked_store(tmp_path / "store", "due_items", DUE)
    yield store
    store.close()


def at(store: Store, seconds: float) -> str:
    """The engine's instant ``seconds`` from now, as a delegate writes a retry_at."""
    return (from_us(store.clock.now_us()) + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def items(store: Store) -> list[tuple]:
    return rows(store, "SELECT logical_key, entity_namespace, entity_key, outcome, attempts, reason FROM _items "
                       "ORDER BY logical_key")


def steps(store: Store, prefix: str) -> list[tuple[str, object]]:
    """The journal steps of the job's execution whose label starts with ``prefix``, with their values."""
    owner = store.journal.owner(job_scope(JOB).key)
    assert owner is not None
    return [(s.label, recorded_value(s)) for s in store.journal.steps(owner.execution_id)
            if s.label.startswith(prefix)]


def sent(delegate: Delegate) -> list[tuple[str, int]]:
    """Each request the delegate received: the entity it concerns and the attempt it carries."""
    return [(r["envelope"]["entity"]["key"], r["envelope"]["attempt"]) for r in delegate.requests()]


@pytest.mark.clause("surface.delegate.defer-parks", "run.items.outcome-record")
def test_scenario_a_defer_ten_minutes_ahead_parks_the_item_until_the_first_fire_after_it(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    """WHEN a delegate answers defer with a retry_at ten minutes ahead, THEN the item's failed-attempt
    count is unchanged and the first fire after that instant sends the request again."""
    retry_at = at(store, 600)
    delegate = delegate_of({"e-2": [f"defer:{retry_at}"]})
    root = tmp_path / "project"
    version = project(root, delegate.url)

    first = fire(root, version, store)
    assert first.ok and first.pending
    assert first.summary == f"2 item(s) completed, 0 failed; 1 item(s) parked until {retry_at}"
    assert (first.detail["failed"], first.detail["parked"], first.detail["parked_until"]) == (0, 1, retry_at)
    # p-2 is neither terminal nor failed: no _items row, no receipt; the others landed under their entity
    assert items(store) == [("p-1", "entity", "e-1", "completed", 1, None), ("p-3", "entity", "e-3", "completed", 1, None)]
    assert ItemOutcomes(store, JOB).receipt("p-2") is None
    owner = store.journal.owner(job_scope(JOB).key)
    assert owner is not None and owner.status == PENDING
    assert steps(store, "row/p-2/delegate/") == [
        ("row/p-2/delegate/1/guard", steps(store, "row/p-2/delegate/1/guard")[0][1]),
        ("row/p-2/delegate/1", {"defer": retry_at, "attempt": 1, "defers": 1})]
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1)]

    store.clock.advance(599)  # a fire before retry_at sends the parked item nothing
    early = fire(root, version, store)
    assert early.ok and early.pending and early.detail["execution"] == owner.execution_id
    assert early.summary == f"0 item(s) completed, 0 failed; 1 item(s) parked until {retry_at}"
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1)]
    assert store.journal.owner(job_scope(JOB).key).status == PENDING

    store.clock.advance(1)  # at retry_at: the first fire re-admits it under replay, attempt 2
    after = fire(root, version, store)
    assert after.ok and not after.pending, after
    assert after.detail["execution"] == owner.execution_id and after.detail["settled_before"] == 2
    requests = delegate.requests()
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1), ("e-2", 2)]
    again, deferred = requests[3]["envelope"], requests[1]["envelope"]
    assert again["idempotency_key"] == deferred["idempotency_key"]  # the same item of the same execution
    assert again["step"] == "row/p-2/delegate/2" and again["entity"]["namespace"] == "entity"
    assert [label for label, _ in steps(store, "row/p-2/")] == [
        "row/p-2/delegate/1/guard", "row/p-2/delegate/1", "row/p-2/delegate/2/guard", "row/p-2/delegate/2"]
    assert items(store)[1] == ("p-2", "entity", "e-2", "completed", 2, None)
    assert rows(store, "SELECT pass_id, entity_id FROM screen_result ORDER BY pass_id") == \
        [("p-1", "e-1"), ("p-2", "e-2"), ("p-3", "e-3")]
    assert store.journal.owner(job_scope(JOB).key).status == CLOSED_OK


@pytest.mark.clause("surface.delegate.defer-parks", "run.items.terminal-outcome")
def test_a_defer_is_no_failed_attempt_so_max_attempts_counts_failures_alone(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    first_at, second_at = at(store, 60), at(store, 120)
    # two defers, then transient failures: the item still fails max_attempts (2) times before it is exhausted
    delegate = delegate_of({"e-1": [f"defer:{first_at}", f"defer:{second_at}", "transient", "transient"]})
    root = tmp_path / "project"
    version = project(root, delegate.url, isolated=ISOLATED.replace("max_attempts = 3", "max_attempts = 2"))
    assert fire(root, version, store).detail["parked"] == 1
    store.clock.advance(60)
    second = fire(root, version, store)  # attempt 2 defers again: parked, not exhausted
    assert second.ok and second.pending and second.detail["parked"] == 1 and second.detail["failed"] == 0
    assert ItemOutcomes(store, JOB).receipt("p-1") is None
    store.clock.advance(60)
    last = fire(root, version, store)  # attempts 3 and 4 fail: the budget's two failures, spent now
    assert not last.ok and not last.pending  # the execution closes: nothing is parked or unsettled
    reason = "DelegateAnsweredTransient: delegate 'stages' answered transient: scripted transient"
    assert items(store)[0][:4] == ("p-1", "entity", "e-1", "exhausted") and items(store)[0][4] == 4
    assert items(store)[0][5].startswith(reason), items(store)[0]
    assert [a for k, a in sent(delegate) if k == "e-1"] == [1, 2, 3, 4]
    assert store.journal.owner(job_scope(JOB).key).status == CLOSED_FAILED
    assert ItemOutcomes(store, JOB).receipt("p-1")["outcome"] == "exhausted"


@pytest.mark.clause("surface.delegate.defer-parks")
def test_a_retry_at_already_past_parks_the_item_until_the_next_fire(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    past = at(store, -3600)
    delegate = delegate_of({"e-3": [f"defer:{past}"]})
    root = tmp_path / "project"
    version = project(root, delegate.url)
    first = fire(root, version, store)
    assert first.pending and first.summary.endswith(f"1 item(s) parked until {past}")
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1)]  # not retried within the fire
    nxt = fire(root, version, store)  # the clock has not moved: the next fire re-admits it
    assert nxt.ok and not nxt.pending
    assert sent(delegate)[-1] == ("e-3", 2) and items(store)[2][3:5] == ("completed", 2)


@pytest.mark.clause("surface.delegate.defer-parks", "surface.delegate.rejected")
@pytest.mark.parametrize(("retry_at", "why"), [
    ("tomorrow", "a defer answer's retry_at is an RFC 3339 UTC instant, not 'tomorrow'"),
    ("2023-11-15T00:23:20+02:00", ("a defer answer's retry_at is an RFC 3339 UTC instant, not "
                                  "'2023-11-15T00:23:20+02:00'")),
    ("2023-11-14T23:13:22Z", ("a defer's retry_at 2023-11-14T23:13:22Z lies more than 3600 s past the engine's "
                             "instant 2023-11-14T22:13:21Z")),
])
def test_an_unreadable_or_too_distant_retry_at_closes_the_item_permanent(
        tmp_path: Path, store: Store, delegate_of: Start, retry_at: str, why: str) -> None:
    assert at(store, 0) == "2023-11-14T22:13:21Z"  # the engine's instant the cases are written against
    delegate = delegate_of({"e-2": [f"defer:{retry_at}"]})
    root = tmp_path / "project"
    outcome = fire(root, project(root, delegate.url), store)
    assert not outcome.pending and not outcome.ok
    assert items(store)[1][3:] == ("permanent", 1, (f"DelegateAnswerRejected: delegate 'stages': answer rejected: "
                                                   f"{why}"))
    assert sent(delegate).count(("e-2", 1)) == 1 and len(sent(delegate)) == 3  # permanent: never retried
    assert steps(store, "row/p-2/delegate/1") == [("row/p-2/delegate/1/guard",
                                                   steps(store, "row/p-2/delegate/1/guard")[0][1])]


def test_an_isolated_items_run_ids_and_receipt_name_no_key_a_reader_could_invert(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    """Decision terminal-item-s: an isolated item's run ids are digests no reader inverts, and its
    receipt sits in a catalog cursor no read face exposes."""
    delegate = delegate_of()
    root = tmp_path / "project"
    assert fire(root, project(root, delegate.url), store).ok
    found = rows(store, "SELECT logical_key, entity_key, attempt_run_id FROM _items ORDER BY logical_key")
    outcomes = ItemOutcomes(store, JOB)
    for logical, entity, run_id in found:
        assert re.fullmatch(r"item-[0-9a-f]{24}", run_id) and logical not in run_id and entity not in run_id
        scope = outcomes.receipt_scope(logical)
        assert re.fullmatch(rf"receipt/{JOB}/[0-9a-f]{{32}}", scope)
        assert outcomes.receipt(logical)["attempt_run_id"] == run_id
    con = connect(store)  # the read face: every relation it serves, none holding a receipt
    try:
        relations = [r[0] for r in con.sql("SELECT table_name FROM information_schema.tables").fetchall()]
        for relation in relations:
            text = json.dumps(con.sql(f'SELECT * FROM "{relation}"').fetchall(), default=str)
            assert "receipt/" not in text, relation
    finally:
        con.close()
    assert "_items" in relations


def test_a_statement_not_selecting_the_named_columns_fails_the_fire_by_name(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of()
    root = tmp_path / "project"
    version = project(root, delegate.url, statement="SELECT pass_id FROM due_items")
    outcome = fire(root, version, store)
    assert not outcome.ok
    assert outcome.failures == (("JobItemKeyInvalid: [[job]] 'stage-screen': key column 'entity_id': the statement "
                                "selects no column 'entity_id' (it selects pass_id); select one row per item with a "
                                "non-null key"),)
    assert delegate.requests() == [] and "_items" not in store.table_names(include_reserved=True)



def cli_project(root: Path, url: str, schedule: str = "every 15m") -> dict[str, str]:
    """The project as a user has it: written, imported by ``contextful pipeline import``, its input
    landed in its store; the environment ``contextful`` runs with (the worker key)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text(MANIFEST.format(url=url, isolated=ISOLATED, statement=STATEMENT,
                                                          max_in_flight=1).replace("every 15m", schedule)
                                          + '\n[project.zone]\ndefault = "eu"\n')
    env = {KEY_VARIABLE: KEY}
    contextful_in(root, "pipeline", "import", env=env)
    store = Store.open(str(root / ".contextful" / "store"))
    try:
        store.append("due_items", DUE)
    finally:
        store.close()
    return env


def wall(seconds: int) -> str:
    """The system clock (the engine's instant under ``contextful``) ``seconds`` from now, whole seconds."""
    now = datetime.now(UTC).replace(microsecond=0)
    return (now + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


@pytest.mark.clause("surface.delegate.defer-parks")
def test_job_fire_parks_deferred_items_without_failing_and_sends_a_parked_item_nothing_before_its_retry_at(
        tmp_path: Path, delegate_of: Start) -> None:
    later, past = wall(600), wall(-60)
    delegate = delegate_of({"e-2": [f"defer:{later}"], "e-3": [f"defer:{past}"]})
    root = tmp_path / "project"
    env = cli_project(root, delegate.url)
    first = contextful_in(root, "--json", "job", "fire", JOB, env=env)  # exit 0: parking is no failure
    doc = json.loads(first.stdout)
    assert (doc["status"], doc["ok"], doc["exit_code"]) == ("parked", True, 0)
    assert doc["summary"] == f"1 item(s) completed, 0 failed; 2 item(s) parked until {past}"
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1)]
    second = contextful_in(root, "job", "fire", JOB, env=env)
    # the past retry_at re-admits p-3 under attempt 2; p-2 stays parked and is sent nothing
    assert second.stdout.strip() == (f"job:{JOB} v1: parked: 1 item(s) completed, 0 failed; 1 item(s) parked "
                                     f"until {later}")
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1), ("e-3", 2)]
    [fired] = json.loads(contextful_in(root, "--json", "job", "history", JOB, env=env).stdout)  # one execution
    assert (fired["status"], fired["ok"], fired["summary"]) == (
        "parked", True, f"1 item(s) completed, 0 failed; 1 item(s) parked until {later}")
    landed = json.loads(contextful_in(root, "--json", "sql", "SELECT logical_key, attempts FROM _items "
                                                             "ORDER BY logical_key", env=env).stdout)
    assert landed == [{"logical_key": "p-1", "attempts": 1}, {"logical_key": "p-3", "attempts": 2}]


def test_validation_names_every_isolated_items_problem_with_its_job_and_key(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text(MANIFEST.format(
        url="http://127.0.0.1:9/", statement=STATEMENT, max_in_flight=1,
        isolated='isolated_items = { entity_key = "entity_id", entity_namespace = "", shard = 1, max_attempts = 0 }'
    ) + '\n[[job]]\nname = "nightly"\nkind = "fold"\ntarget = ["due_items"]\nisolated_items = { logical_key = "x" }\n')
    proc = contextful_in(root, "job", "validate", check=False)
    assert proc.returncode != 0
    for line in [("[[job]] 'stage-screen'.isolated_items.shard: is no key of isolated_items (keys: logical_key, "
                 "entity_key, entity_namespace, max_attempts)"),
                 ("[[job]] 'stage-screen'.isolated_items.logical_key: is required: the statement's column naming "
                 "each item"),
                 "[[job]] 'stage-screen'.isolated_items.entity_namespace: must be a non-empty string, not ''",
                 "[[job]] 'stage-screen'.isolated_items.max_attempts: must be an integer >= 1, not 0",
                 "[[job]] 'nightly'.isolated_items: is a store-driven job's key only"]:
        assert line in proc.stderr, proc.stderr
    assert proc.stderr.count("ManifestValueInvalid") == 5


def killed_after_two_answers(tmp_path: Path, delegate: Delegate, isolated: str = ISOLATED) -> tuple[Path, int]:
    """Fire the project in a child process (the daemon, on the system clock) with p-1, p-2 and p-3 in
    flight together; SIGKILL it once p-1's and p-2's answers are journaled and p-3's request (whose
    answer never comes in time) was sent: the project and its version."""
    setup = Store.open(str(tmp_path / "store"))
    setup.append("due_items", DUE)
    setup.close()
    root = tmp_path / "project"
    version = project(root, delegate.url, isolated=isolated, max_in_flight=3)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(version), str(tmp_path / "store")],
                             env={**os.environ})
    watch = Store.open(str(tmp_path / "store"))
    try:
        deadline = time.monotonic() + 120
        answered: list[str] = []
        while len(answered) < 2 or "e-3" not in [k for k, _ in sent(delegate)]:  # a condition with a deadline
            assert time.monotonic() < deadline and child.poll() is None, "the child never journaled both answers"
            owner = watch.journal.owner(job_scope(JOB).key)
            if owner is not None:
                answered = [s.label for s in watch.journal.steps(owner.execution_id)
                            if s.label.startswith("row/") and not s.label.endswith("/guard")]
            threading.Event().wait(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        watch.close()
    assert sorted(answered) == ["row/p-1/delegate/1", "row/p-2/delegate/1"]
    return root, version


@pytest.mark.slow
@pytest.mark.clause("surface.delegate.defer-parks")
def test_a_fire_killed_after_a_defer_was_journaled_loses_nothing_and_repeats_no_answered_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delegate_of: Start) -> None:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    retry_at = wall(600)
    # p-1 answers ok, p-2 defers, p-3's answer never comes before the kill
    delegate = delegate_of({"e-2": [f"defer:{retry_at}"], "e-3": ["hold:600"]})
    root, version = killed_after_two_answers(tmp_path, delegate)
    store_root = tmp_path / "store"
    store = Store.open(str(store_root), clock=ManualClock(to_us(datetime.fromisoformat(retry_at)) - 60_000_000))
    try:
        assert "screen_result" not in store.table_names()  # p-1's landing never committed
        before = fire(root, version, store)  # a minute before retry_at: the defer survived the kill
        assert before.ok and before.pending and before.summary.endswith(f"1 item(s) parked until {retry_at}")
        assert sorted(sent(delegate)[3:]) == [("e-3", 1)]  # only the call whose answer never came, again
        store.clock.advance(60)
        after = fire(root, version, store)
        assert after.ok and not after.pending, after
        assert sent(delegate)[4:] == [("e-2", 2)]
        assert items(store) == [("p-1", "entity", "e-1", "completed", 1, None),
                                ("p-2", "entity", "e-2", "completed", 2, None),
                                ("p-3", "entity", "e-3", "completed", 1, None)]
        assert rows(store, "SELECT pass_id FROM screen_result ORDER BY pass_id") == [("p-1",), ("p-2",), ("p-3",)]
        requests = delegate.requests()
        assert [r["envelope"]["attempt"] for r in requests if r["envelope"]["entity"]["key"] == "e-1"] == [1]
        assert [r["envelope"]["attempt"] for r in requests if r["envelope"]["entity"]["key"] == "e-2"] == [1, 2]
        assert len({r["envelope"]["idempotency_key"] for r in requests if r["envelope"]["entity"]["key"] == "e-3"}) == 1
    finally:
        store.close()


@pytest.mark.clause("surface.delegate.defer-parks")
def test_serve_counts_a_fire_that_parked_items_as_fired_not_failed(tmp_path: Path, delegate_of: Start) -> None:
    from contextful.engine.control.credentials import generate_key

    later = wall(600)
    delegate = delegate_of({"e-1": [f"defer:{later}"]})
    root = tmp_path / "project"  # yearly: due when first armed, then not again for months
    env = cli_project(root, delegate.url, schedule="0 0 1 1 *")
    _pin, key = generate_key(tmp_path / "keys" / "issuer.pem")  # serve mints each fire's credential
    done = contextful_in(root, "--json", "pipeline", "serve", "--cycle", "--issuer-key", str(key), env=env,
                         check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["fired"] == [f"job:{JOB}"] and answer["failed"] == []
    assert sent(delegate) == [("e-1", 1), ("e-2", 1), ("e-3", 1)]
    landed = json.loads(contextful_in(root, "--json", "sql", "SELECT logical_key FROM _items ORDER BY logical_key",
                                      env=env).stdout)
    assert landed == [{"logical_key": "p-2"}, {"logical_key": "p-3"}]  # p-1 parked: no row until it ends


@pytest.mark.slow
@pytest.mark.clause("surface.delegate.defer-parks")
def test_a_defer_journaled_before_a_kill_spends_no_attempt_of_a_one_attempt_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delegate_of: Start) -> None:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    retry_at = wall(600)
    delegate = delegate_of({"e-2": [f"defer:{retry_at}"], "e-3": ["hold:600"]})
    root, version = killed_after_two_answers(tmp_path, delegate, ISOLATED.replace("max_attempts = 3",
                                                                                  "max_attempts = 1"))
    store = Store.open(str(tmp_path / "store"), clock=ManualClock(to_us(datetime.fromisoformat(retry_at))))
    try:  # at retry_at: the parked item is re-admitted under attempt 2, its one allowed failure unspent
        outcome = fire(root, version, store)
        assert outcome.ok and not outcome.pending, outcome
        assert items(store) == [("p-1", "entity", "e-1", "completed", 1, None),
                                ("p-2", "entity", "e-2", "completed", 2, None),
                                ("p-3", "entity", "e-3", "completed", 1, None)]
        assert sorted(sent(delegate)[3:]) == [("e-2", 2), ("e-3", 1)]  # p-1 lands as recorded
        assert store.journal.owner(job_scope(JOB).key).status == CLOSED_OK
    finally:
        store.close()
