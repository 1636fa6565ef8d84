"""Store-driven jobs whose body is a delegate: the reference delegate (datasets/enrich_delegate.py)
runs as a real child process on loopback, and each fire runs through ``engine.jobs.fire`` as
``job fire`` and serve's job children do (the daemon-restart scenario in a child process SIGKILLed).

The envelope each request carries, the signatures both ways, answers that are rejected (unsigned,
skewed, bound to another request, outside the vocabulary, over the step-result bound), a non-200
status, a delegate slower than its timeout, ok/transient/permanent/defer outcomes under the retry
budget, a submit binding refused before anything opens, and a version change meeting a pending
execution as pinned-plan-changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.control.worker_key import KEY_VARIABLE, WorkerKey
from contextful.engine.jobs.scope import job_scope
from contextful.engine.run.items import ItemOutcomes
from contextful.storage import Store
from contextful.storage.clock import from_us
from contextful.storage.errors import DelegateSubmitUnfilled, OwnerPinsMismatch
from contextful.storage.journal import CLOSED_OK, PENDING

from tests.engine.jobs.delegates import CHILD, KEY, MANIFEST, Start, applied, clocked_store, fire
from tests.engine.jobs.project import rows

JOB = "enrich-documents"
DOCS = pa.table({"doc_id": ["d1", "d2", "d3"], "body": ["one", "two words", "three more words"]})



@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    store = clocked_store(tmp_path / "store", "documents", DOCS)
    yield store
    store.close()


def project(root: Path, url: str, *, mode: str = "call", binding: str = "", max_in_flight: int = 1,
            attempts: int = 1) -> int:
    """Write the project and import or apply it: the version applied."""
    return applied(root, MANIFEST.format(url=url, mode=mode, binding=binding, max_in_flight=max_in_flight,
                                         attempts=attempts))


def items(store: Store) -> list[tuple]:
    return rows(store, "SELECT logical_key, outcome, attempts, reason FROM _items ORDER BY logical_key")


ENRICHED = [("d1", "one", 5, 2), ("d2", "two words", 11, 3), ("d3", "three more words", 18, 4)]
"""Each row enriched: its text values' characters and words, counted over doc_id and body (plain Python)."""


@pytest.mark.clause("surface.delegate.envelope", "surface.delegate.signed", "surface.delegate.outcome",
                    "surface.delegate.clocks")
def test_each_item_is_one_signed_call_whose_ok_answer_lands_as_completion(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of()
    version = project(tmp_path / "project", delegate.url + "/enrich")
    opened_at = from_us(store.clock.now_us())
    outcome = fire(tmp_path / "project", version, store)
    assert outcome.ok, outcome
    assert rows(store, "SELECT doc_id, body, chars, words FROM enriched ORDER BY doc_id") == ENRICHED
    owner = store.journal.owner(job_scope(JOB).key)
    assert owner is not None and owner.status == CLOSED_OK
    assert [(k, o, a) for k, o, a, _ in items(store)] == [(k, "completed", 1) for k in ["d1", "d2", "d3"]]
    sent = delegate.requests()
    assert [r["envelope"]["entity"]["key"] for r in sent] == ["d1", "d2", "d3"]
    for request, key in zip(sent, ["d1", "d2", "d3"], strict=True):
        envelope = request["envelope"]
        assert request["signed"] and request["path"] == "/enrich"  # signed as call over timestamp and body
        assert request["idempotency_key_header"] == envelope["idempotency_key"]
        assert len(envelope["idempotency_key"]) == 64
        assert envelope["entity"] == {"namespace": f"job:{JOB}", "key": key, "fence": 1}
        assert envelope["version"] == version  # fired from applied snapshot `version`
        assert (envelope["job"], envelope["execution_id"], envelope["attempt"]) == (JOB, owner.execution_id, 1)
        assert envelope["step"] == f"row/{key}/delegate/1"
        assert envelope["tables"] == ["enriched"] and envelope["row"]["doc_id"] == key
        assert envelope["pins"]["body_dependency_delegate"] == "enricher"
        # the deadline rides the engine's (injected) instant, not the wall clock
        assert envelope["deadline"] == (opened_at + timedelta(seconds=300)).isoformat().replace("+00:00", "Z")
    assert len({r["envelope"]["idempotency_key"] for r in sent}) == 3


@pytest.mark.clause("surface.delegate.host")
def test_the_virtual_host_reaches_the_loopback_address_the_operator_maps_it_to(
        tmp_path: Path, store: Store, delegate_of: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    delegate = delegate_of()
    root = tmp_path / "project"
    version = project(root, "http://contextful.delegate/enrich", attempts=1)
    unmapped = fire(root, version, store)  # no mapping: deployment drift, each attempt closes Transient
    assert [o for _, o, _, _ in items(store)] == ["exhausted"] * 3 and delegate.requests() == []
    assert "CONTEXTFUL_DELEGATE_HOST maps the contextful.delegate virtual host to no loopback host:port" in \
        items(store)[0][3]
    assert not unmapped.ok
    monkeypatch.setenv("CONTEXTFUL_DELEGATE_HOST", delegate.url.removeprefix("http://"))
    store.append("documents", pa.table({"doc_id": ["d4"], "body": ["four"]}))
    assert fire(root, version, store).ok
    sent = delegate.requests()
    assert [(r["host"], r["path"], r["envelope"]["entity"]["key"]) for r in sent] == \
        [("contextful.delegate", "/enrich", k) for k in ["d1", "d2", "d3", "d4"]]


def test_a_request_signed_otherwise_is_refused_by_the_reference_delegate(tmp_path: Path, delegate_of: Start) -> None:
    """The reference delegate verifies ``call`` signatures: a request signed under another key gets 401."""
    import urllib.error
    import urllib.request

    delegate = delegate_of()
    body = b'{"entity": {"key": "x"}}'
    wrong = WorkerKey(b"w" * 40).headers("call", int(time.time()), body)
    request = urllib.request.Request(delegate.url + "/enrich", data=body, headers=wrong, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    assert [r["signed"] for r in delegate.requests()] == [False]


@pytest.mark.clause("surface.delegate.rejected", "surface.delegate.signed", "surface.delegate.clocks")
@pytest.mark.parametrize(("behaviour", "why"), [
    ("unsigned", "it carries no Contextful-Timestamp or Contextful-Signature header"),
    ("skewed", "is more than 300 s from this clock"),
    ("rebound", "its signature does not verify as a answer under the worker key"),
])
def test_an_unsigned_skewed_or_misbound_answer_closes_the_attempt_transient(
        tmp_path: Path, store: Store, delegate_of: Start, behaviour: str, why: str) -> None:
    delegate = delegate_of({"d2": [behaviour, behaviour]})
    version = project(tmp_path / "project", delegate.url, attempts=2)
    outcome = fire(tmp_path / "project", version, store)
    assert not outcome.ok
    found = items(store)
    assert [(k, o, a) for k, o, a, _ in found] == [("d1", "completed", 1), ("d2", "exhausted", 2),
                                                   ("d3", "completed", 1)]
    assert found[1][3].startswith("DelegateAnswerRejected: delegate 'enricher': answer rejected: ")
    assert why in found[1][3]
    assert delegate.sent_keys().count("d2") == 2  # transient: retried under the budget
    assert rows(store, "SELECT doc_id FROM enriched ORDER BY doc_id") == [("d1",), ("d3",)]


@pytest.mark.clause("surface.delegate.rejected")
@pytest.mark.parametrize(("behaviour", "why"), [
    ("outcome:maybe", "outcome 'maybe' is none of ok, defer, transient, permanent"),
    ("oversize", "the answer is over the step-result bound of 1048576 bytes"),
])
def test_an_answer_outside_the_vocabulary_or_over_step_result_closes_the_attempt_permanent(
        tmp_path: Path, store: Store, delegate_of: Start, behaviour: str, why: str) -> None:
    delegate = delegate_of({"d2": [behaviour, behaviour]})
    version = project(tmp_path / "project", delegate.url, attempts=2)
    fire(tmp_path / "project", version, store)
    found = items(store)
    assert (found[1][0], found[1][1], found[1][2]) == ("d2", "permanent", 1)
    assert found[1][3] == f"DelegateAnswerRejected: delegate 'enricher': answer rejected: {why}"
    assert delegate.sent_keys().count("d2") == 1  # permanent: no retry
    assert ItemOutcomes(store, JOB).receipt("d2")["outcome"] == "permanent"


@pytest.mark.clause("surface.delegate.status")
def test_a_status_other_than_200_closes_transient_whatever_its_body(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    # status:503 and status:201 carry a signed ok body: the status decides, not the body
    delegate = delegate_of({"d1": ["status:503"], "d2": ["status:201", "status:201"]})
    version = project(tmp_path / "project", delegate.url, attempts=2)
    fire(tmp_path / "project", version, store)
    found = items(store)
    assert [(k, o, a) for k, o, a, _ in found] == [("d1", "completed", 2), ("d2", "exhausted", 2),
                                                   ("d3", "completed", 1)]
    assert found[1][3] == "DelegateAnswerRejected: delegate 'enricher': answer rejected: the call answered HTTP 201, not 200"
    assert rows(store, "SELECT doc_id FROM enriched ORDER BY doc_id") == [("d1",), ("d3",)]
    assert ItemOutcomes(store, JOB).receipt("d2")["outcome"] == "exhausted"  # a terminal receipt, budget spent


@pytest.mark.clause("surface.delegate.status", "surface.delegate.outcome")
def test_transient_and_permanent_answers_follow_the_retry_budget_and_a_permanent_answer_is_terminal(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of({"d1": ["transient"], "d2": ["permanent"], "d3": ["transient", "transient"]})
    version = project(tmp_path / "project", delegate.url, attempts=2)
    outcome = fire(tmp_path / "project", version, store)
    assert not outcome.ok
    assert items(store) == [
        ("d1", "completed", 2, None),
        ("d2", "permanent", 1, "DelegateAnsweredPermanent: delegate 'enricher' answered permanent: scripted permanent"),
        ("d3", "exhausted", 2, "DelegateAnsweredTransient: delegate 'enricher' answered transient: scripted transient"),
    ]
    assert delegate.sent_keys() == ["d1", "d1", "d2", "d3", "d3"]
    assert ItemOutcomes(store, JOB).receipt("d2")["outcome"] == "permanent"
    assert rows(store, "SELECT doc_id, chars, words FROM enriched") == [("d1", 5, 2)]


@pytest.mark.clause("surface.delegate.outcome", "surface.delegate.defer-parks")
def test_a_defer_of_a_job_without_isolated_items_closes_transient(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of({"d1": ["defer:2030-01-01T00:10:00Z"]})
    version = project(tmp_path / "project", delegate.url, attempts=2)
    assert fire(tmp_path / "project", version, store).ok
    assert [(k, o, a) for k, o, a, _ in items(store)] == [("d1", "completed", 2), ("d2", "completed", 1),
                                                          ("d3", "completed", 1)]
    assert delegate.sent_keys() == ["d1", "d1", "d2", "d3"]


@pytest.mark.clause("surface.delegate.call-mode")
def test_an_answer_after_the_timeout_closes_transient_and_its_late_body_records_nothing(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of({"d2": ["hold:4"]})  # the delegate answers ok, 4 s late for a 1 s timeout
    version = project(tmp_path / "project", delegate.url, binding='timeout = "1s"', attempts=1)
    outcome = fire(tmp_path / "project", version, store)
    found = items(store)
    assert (found[1][1], found[1][3]) == ("exhausted", ("DelegateAnswerRejected: delegate 'enricher': answer "
                                                        "rejected: no answer within its 1 s timeout; the attempt "
                                                        "closes Transient"))
    assert not outcome.ok
    assert rows(store, "SELECT doc_id FROM enriched ORDER BY doc_id") == [("d1",), ("d3",)]
    owner = store.journal.owner(job_scope(JOB).key)
    assert owner is not None
    assert [s.label for s in store.journal.steps(owner.execution_id) if s.label.startswith("row/d2/")] == \
        ["row/d2/delegate/1/guard"]  # the request's guard, and no answer


def guards(store: Store) -> list[dict]:
    """The guards the fire's call requests journaled, in order."""
    owner = store.journal.owner(job_scope(JOB).key)
    assert owner is not None
    # a JSON step value is stored behind a one-byte tag (engine.run.execution)
    return [json.loads(s.value[1:]) for s in store.journal.steps(owner.execution_id) if s.label.endswith("/guard")]


@pytest.mark.clause("surface.delegate.dedup-window")
@pytest.mark.parametrize(("binding", "window"), [("dedup_window_secs = 86400", 86400), ("", None)])
def test_each_call_requests_guard_records_the_dedup_window_under_its_identity(
        tmp_path: Path, store: Store, delegate_of: Start, binding: str, window: int | None) -> None:
    delegate = delegate_of({"d2": ["transient"]})
    version = project(tmp_path / "project", delegate.url, binding=binding, attempts=2)
    assert fire(tmp_path / "project", version, store).ok
    owner = store.journal.owner(job_scope(JOB).key)
    assert owner is not None
    sent = delegate.requests()
    recorded = guards(store)
    assert len(recorded) == len(sent) == 4  # one guard per call request, the retried one included
    assert sorted((g["journal_entry"], g["idempotency_key"]) for g in recorded) == \
        sorted((r["envelope"]["step"], r["idempotency_key_header"]) for r in sent)
    for entry in recorded:
        assert (entry["execution"], entry["attempt"], entry["dedup_window_secs"]) == (owner.execution_id, 1, window)
        assert entry["holder"] and entry["admitted_at"].endswith("Z")


@pytest.mark.clause("surface.delegate.submit-unfilled")
def test_a_submit_binding_refuses_before_any_execution_opens(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of()
    version = project(tmp_path / "project", delegate.url, mode="submit")
    with pytest.raises(DelegateSubmitUnfilled) as raised:
        fire(tmp_path / "project", version, store)
    assert (raised.value.fields["job"], raised.value.fields["delegate"]) == (JOB, "enricher")
    assert "bind mode = \"call\"" in str(raised.value)
    assert store.journal.owner(job_scope(JOB).key) is None  # no execution opened
    assert "_items" not in store.table_names(include_reserved=True) and delegate.requests() == []
    # the same items are all due once the binding names call
    version = project(tmp_path / "project", delegate.url, mode="call")
    assert fire(tmp_path / "project", version, store).ok
    assert delegate.sent_keys() == ["d1", "d2", "d3"]


@pytest.mark.clause("surface.delegate.version")
def test_a_changed_version_meets_a_pending_execution_as_pinned_plan_changed(
        tmp_path: Path, store: Store, delegate_of: Start) -> None:
    delegate = delegate_of()
    root = tmp_path / "project"
    version = project(root, delegate.url, binding='version = "prompts-v1"')
    stopped = threading.Event()
    stopped.set()  # the fire opens its execution and stops before handing any item over: it stays pending
    assert fire(root, version, store, cancel=stopped).detail["left"] == 0
    pending = store.journal.owner(job_scope(JOB).key)
    assert pending is not None and pending.status == PENDING
    assert pending.pin_map()["body_dependency_delegate_version"] == "prompts-v1"
    changed = project(root, delegate.url, binding='version = "prompts-v2"')
    with pytest.raises(OwnerPinsMismatch) as raised:  # the pending item refuses (pinned-plan-changed)
        fire(root, changed, store)
    assert raised.value.fields["execution"] == pending.execution_id
    assert "body_dependency_delegate_version: pinned prompts-v1, offered prompts-v2" in str(raised.value)
    assert delegate.requests() == [] and store.journal.owner(job_scope(JOB).key) == pending
    # the unchanged version resumes the pending execution
    back = project(root, delegate.url, binding='version = "prompts-v1"')
    outcome = fire(root, back, store)
    assert outcome.ok and outcome.detail["execution"] == pending.execution_id
    assert {r["envelope"]["pins"]["body_dependency_delegate_version"] for r in delegate.requests()} == {"prompts-v1"}
    # with nothing pending, the changed version opens a fresh execution identity pinned to it
    store.append("documents", pa.table({"doc_id": ["d4"], "body": ["four"]}))
    changed = project(root, delegate.url, binding='version = "prompts-v2"')
    fresh = fire(root, changed, store)
    assert fresh.ok and fresh.detail["execution"] != pending.execution_id
    assert store.journal.owner(job_scope(JOB).key).pin_map()["body_dependency_delegate_version"] == "prompts-v2"


@pytest.mark.slow
@pytest.mark.clause("surface.delegate.call-mode")
def test_scenario_a_restart_before_landing_lands_the_recorded_rows_with_no_second_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delegate_of: Start) -> None:
    """WHEN a delegate answers ok with rows for one item and the daemon restarts before that item's
    landing commits, THEN the resumed item lands the recorded rows and the delegate receives no
    second request."""
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    store = Store.open(str(tmp_path / "store"))  # the system clock: the child's lease is a real one
    store.append("documents", DOCS.slice(0, 2))
    delegate = delegate_of({"d2": ["hold:600"]})  # d1 answers at once; d2's answer never comes in time
    root = tmp_path / "project"
    version = project(root, delegate.url, max_in_flight=2, binding='timeout = "3600s"')
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(version), str(store.objects.root)],
                             env={**os.environ})
    try:
        deadline = time.monotonic() + 120
        recorded: list[str] = []
        while not recorded:  # a condition with a deadline: d1's ok answer journaled, d2 in flight
            assert time.monotonic() < deadline and child.poll() is None, "the child never recorded d1's answer"
            owner = store.journal.owner(job_scope(JOB).key)
            if owner is not None and "d2" in delegate.sent_keys():
                recorded = [s.label for s in store.journal.steps(owner.execution_id)
                            if s.label.startswith("row/") and not s.label.endswith("/guard")]
            threading.Event().wait(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert recorded == ["row/d1/delegate/1"]
    assert "enriched" not in store.table_names()  # d1's landing never committed
    outcome = fire(root, version, store)
    assert outcome.ok, outcome
    assert outcome.detail["execution"] == owner.execution_id
    assert rows(store, "SELECT doc_id, body, chars, words FROM enriched ORDER BY doc_id") == ENRICHED[:2]
    assert delegate.sent_keys() == ["d1", "d2", "d2"] or delegate.sent_keys() == ["d2", "d1", "d2"]
    store.close()
