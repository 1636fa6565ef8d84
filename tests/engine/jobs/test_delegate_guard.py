"""Durable callback guards through the production path: a store-driven job whose body is a delegate,
fired with ``contextful job fire`` on the D1 profile (``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1``).

Real components: the session's Worker under miniflare (a fresh namespace per test), reached by the
CLI through a recording proxy on loopback (the order of the D1 batches as they went by); the
reference delegate (datasets/enrich_delegate.py) as a child process holding a call on a gate (a
named pipe: opening it proves the call is held, closing it lets the call return); the CLI as child
processes, SIGKILLed while the delegate holds a call. A re-run that must find its crashed holder's
lease lapsed runs with its wall clock a lease ahead (tests/support/clock_shift) instead of sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.jobs.scope import job_scope
from contextful.storage import Store
from contextful.storage.d1.client import D1Binding
from contextful.storage.d1.guards import REPLAY_SAFE, UNKNOWN, CallbackGuards, Guard
from contextful.storage.d1.journal import D1JournalStore
from contextful.storage.d1.recovery import provision
from contextful.storage.journal import CLOSED_OK

from tests.engine.jobs.delegates import KEY, MANIFEST, Delegate, Start
from tests.support.cli import contextful_in
from tests.support.recording_proxy import Captured, RecordingProxy

pytestmark = pytest.mark.d1

JOB = "enrich-documents"
SCOPE = job_scope(JOB).key
CLOCK_SHIFT = Path(__file__).resolve().parents[2] / "support" / "clock_shift"
LEASE_AHEAD_S = 150
"""How far ahead a re-run's clock runs: past the crashed fire's 60 s owner lease (its calls' 5 s
timeout plus half a lease is shorter), inside the 300 s a signature's timestamp may be skewed."""



class Site:
    """A project on the D1 profile whose CLI reaches the Worker through a recording proxy."""

    def __init__(self, root: Path, binding: D1Binding, proxy: RecordingProxy) -> None:
        self.root, self.binding, self.proxy = root, binding, proxy
        self.env = {"CONTEXTFUL_STORAGE_PROFILE": "cloudflare-d1", "CONTEXTFUL_D1_URL": proxy.url,
                    "CONTEXTFUL_D1_TOKEN": binding.token, "CONTEXTFUL_D1_NAMESPACE": binding.namespace,
                    "CONTEXTFUL_WORKER_KEY": KEY}
        self.journal = D1JournalStore(binding.client())

    @property
    def guards(self) -> CallbackGuards:
        return self.journal.guards

    def cli(self, *args: str, check: bool = True, ahead_s: float = 0) -> subprocess.CompletedProcess[str]:
        return contextful_in(self.root, *args, env=self._env(ahead_s), check=check)

    def start_fire(self) -> subprocess.Popen[str]:
        """``contextful job fire`` as a child process the test may kill."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | self.env
        return subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "job", "fire", JOB], cwd=self.root,
                                env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _env(self, ahead_s: float) -> dict[str, str]:
        if not ahead_s:
            return self.env
        path = os.pathsep.join(p for p in (str(CLOCK_SHIFT), os.environ.get("PYTHONPATH", "")) if p)
        return self.env | {"CONTEXTFUL_TEST_CLOCK_SHIFT_S": str(ahead_s), "PYTHONPATH": path}

    def steps(self, execution_id: str) -> dict[str, bytes]:
        return {step.label: step.value for step in self.journal.steps(execution_id)}


ACQUIRE = b"cf_callback_guards (token"
"""What the batch acquiring a callback guard holds (``storage.d1.guards``)."""


@pytest.fixture
def unanswered() -> list[bytes]:
    """SQL fragments whose first batch's answer the proxy drops (each dropped once)."""
    return []


def _unanswered(fragments: list[bytes]) -> Callable[[Captured], bool]:
    def drop(captured: Captured) -> bool:
        hit = next((f for f in fragments if captured.path == "/d1/batch" and f in captured.body), None)
        if hit is not None:
            fragments.remove(hit)
        return hit is not None

    return drop


@pytest.fixture
def site(tmp_path: Path, d1_binding: D1Binding, monkeypatch: pytest.MonkeyPatch,
         unanswered: list[bytes]) -> Iterator[Site]:
    proxy = RecordingProxy(d1_binding.url, unanswered=_unanswered(unanswered)).start()
    root = tmp_path / "project"
    root.mkdir()
    for name, value in {"CONTEXTFUL_STORAGE_PROFILE": "cloudflare-d1", "CONTEXTFUL_D1_URL": d1_binding.url,
                        "CONTEXTFUL_D1_TOKEN": d1_binding.token,
                        "CONTEXTFUL_D1_NAMESPACE": d1_binding.namespace}.items():
        monkeypatch.setenv(name, value)
    with Store.open(root / ".contextful" / "store") as store:  # the deployment's store, its input landed
        provision(store)
        store.append("documents", pa.table({"doc_id": ["d1"], "body": ["two words"]}))
    yield Site(root, d1_binding, proxy)
    proxy.stop()


def applied(site: Site, delegate: Delegate, window: int | None, max_in_flight: int = 1) -> None:
    binding = 'timeout = "5s"' + ("" if window is None else f"\ndedup_window_secs = {window}")
    (site.root / "contextful.toml").write_text(MANIFEST.format(url=f"{delegate.url}/enrich", mode="call",
                                                               binding=binding, max_in_flight=max_in_flight,
                                                               attempts=1))
    site.cli("pipeline", "import")


def gated(tmp_path: Path, delegate_of: Start) -> tuple[Delegate, Path]:
    """A reference delegate whose first call for item d1 waits on a gate (a named pipe)."""
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    return delegate_of({"d1": [f"gate:{gate}"]}), gate


def hold_gate(gate: Path, fire: subprocess.Popen[str], timeout_s: float = 120) -> int:
    """Open the gate's writing end: it opens once the delegate holds the call (its reading end open).
    The descriptor; closing it lets the call return."""
    opened: list[int] = []
    opener = threading.Thread(target=lambda: opened.append(os.open(gate, os.O_WRONLY)), daemon=True)
    opener.start()
    deadline = time.monotonic() + timeout_s
    while opener.is_alive():  # a condition with a deadline: the delegate opened the gate, or the fire ended
        opener.join(0.1)
        if fire.poll() is not None and opener.is_alive():
            _, err = fire.communicate()
            os.close(os.open(gate, os.O_RDONLY | os.O_NONBLOCK))  # let the opener go
            pytest.fail(f"the fire ended before its call was held: exit {fire.returncode}: {err}")
        assert time.monotonic() < deadline, "the delegate never held the call"
    return opened[0]


def kill(fire: subprocess.Popen[str]) -> None:
    fire.send_signal(signal.SIGKILL)
    fire.wait(timeout=60)


def crashed_in_call(tmp_path: Path, site: Site, delegate_of: Start, window: int | None) -> tuple[Delegate, Guard]:
    """A fire SIGKILLed while the delegate holds its call (the delegate then answers a caller that is
    gone): the delegate, and the one guard the call left."""
    delegate, gate = gated(tmp_path, delegate_of)
    applied(site, delegate, window=window)
    fire = site.start_fire()
    held = hold_gate(gate, fire)
    kill(fire)
    os.close(held)
    (guard,) = site.guards.guards()
    return delegate, guard


def batches(captured: list[Captured]) -> list[list[dict]]:
    """Every D1 batch the CLI sent, in the order they went by: each one's statements."""
    return [json.loads(c.body)["statements"] for c in captured if c.path == "/d1/batch" and c.body]


def index_of(found: list[list[dict]], sql: str, param: str | None = None) -> int:
    """The first batch holding a statement whose SQL contains ``sql`` (and, if given, ``param``)."""
    for i, statements in enumerate(found):
        if any(sql in s["sql"] and (param is None or param in s["params"]) for s in statements):
            return i
    raise AssertionError(f"no batch ran {sql!r} with {param!r}")


@pytest.mark.clause("run.callback-guard.identity", "run.callback-guard.release")
def test_a_delegate_call_runs_under_a_guard_recording_its_identity_deleted_before_its_answer_is_journaled(
        tmp_path: Path, site: Site, delegate_of: Start) -> None:
    delegate, gate = gated(tmp_path, delegate_of)
    applied(site, delegate, window=3600, max_in_flight=2)
    with Store.open(site.root / ".contextful" / "store") as store:  # a second item, in flight beside d1
        store.append("documents", pa.table({"doc_id": ["d2"], "body": ["three more words"]}))
    fire = site.start_fire()
    try:
        held = hold_gate(gate, fire)
    except BaseException:
        kill(fire)
        raise
    try:
        (guard,) = site.guards.guards()  # committed while the delegate holds the call
        owner = site.journal.owner(SCOPE)
        *_, request = delegate.requests()  # d1's, the last: d2's call takes its turn before or after it
        assert request["envelope"]["entity"]["key"] == "d1"
        assert owner is not None and request["envelope"]["execution_id"] == owner.execution_id
        assert (guard.execution_id, guard.attempt, guard.holder) == (owner.execution_id, owner.attempts, owner.holder)
        assert guard.journal_entry == "row/d1/delegate/1" == request["envelope"]["step"]
        assert guard.idempotency_key == request["idempotency_key_header"] == request["envelope"]["idempotency_key"]
        assert guard.dedup_window_secs == 3600 and guard.scopes == (SCOPE,)
        assert owner.held_since_us is not None and owner.held_since_us <= guard.admitted_us <= time.time_ns() // 1000
        assert "row/d1/delegate/1" not in site.steps(owner.execution_id)  # its answer is not journaled yet
    finally:
        os.close(held)  # the call returns
    _, err = fire.communicate(timeout=120)
    assert fire.returncode == 0, err
    assert site.guards.guards() == []
    recorded = site.steps(guard.execution_id)["row/d1/delegate/1"]
    assert b'"chars":11' in recorded and b'"words":3' in recorded
    assert sorted(r["envelope"]["entity"]["key"] for r in delegate.requests()) == ["d1", "d2"]
    assert "row/d2/delegate/1" in site.steps(guard.execution_id)
    assert site.journal.owner(SCOPE).status == CLOSED_OK  # type: ignore[union-attr]
    # as the batches went by: the guard's deletion, then the journaling of the call's answer
    sent = batches(site.proxy.captured)
    acquired = index_of(sent, "cf_callback_guards (token", guard.token)
    released = index_of(sent, "DELETE FROM", guard.token)
    journaled = index_of(sent, "cf_journal_steps (execution_id", "row/d1/delegate/1")
    assert acquired < released < journaled


@pytest.mark.clause("run.callback-guard.replay", "run.journal.d1-guard")
def test_a_guard_outlives_its_holders_crash_and_a_rerun_replays_it_with_the_same_key_once_the_lease_lapsed(
        tmp_path: Path, site: Site, delegate_of: Start) -> None:
    delegate, guard = crashed_in_call(tmp_path, site, delegate_of, window=3600)
    owner = site.journal.owner(SCOPE)
    assert owner is not None and guard.holder == owner.holder

    # the holder is gone but its lease runs: the re-run transfers nothing and sends nothing
    early = site.cli("job", "fire", JOB, check=False)
    assert early.returncode != 0 and "error: CallbackGuardHeld: " in early.stderr
    assert guard.token in early.stderr and "its owner lease has not lapsed" in early.stderr
    assert "evidence class replay-safe" in early.stderr
    assert site.guards.guards() == [guard] and site.journal.owner(SCOPE) == owner
    assert len(delegate.requests()) == 1

    # a lease later, without an operator: the guard's release and the takeover in one batch, the key sent again
    site.proxy.captured.clear()
    rerun = site.cli("--json", "job", "fire", JOB, ahead_s=LEASE_AHEAD_S)
    fired = json.loads(rerun.stdout)
    assert fired["status"] == "ok" and fired["execution"] == guard.execution_id
    first, second = delegate.requests()
    assert second["idempotency_key_header"] == first["idempotency_key_header"] == guard.idempotency_key
    assert second["envelope"]["execution_id"] == guard.execution_id
    (replay,) = [statements for statements in batches(site.proxy.captured)
                 if any("DELETE FROM" in s["sql"] and guard.token in s["params"] for s in statements)
                 and any(s["sql"].startswith("UPDATE") and "cf_journal_owners" in s["sql"] for s in statements)]
    assert len(replay) == 2  # the takeover of the owner row and the guard's release: one D1 batch
    assert site.guards.guards() == []
    assert site.journal.owner(SCOPE).status == CLOSED_OK  # type: ignore[union-attr]


@pytest.mark.clause("run.callback-guard.manual", "run.journal.d1-guard")
def test_a_crashed_call_to_a_delegate_without_a_window_waits_for_an_operator_then_the_rerun_proceeds(
        tmp_path: Path, site: Site, delegate_of: Start) -> None:
    delegate, guard = crashed_in_call(tmp_path, site, delegate_of, window=None)
    assert guard.dedup_window_secs is None

    # even a lease later, with its holder gone: evidence class unknown, no replay, nothing sent
    refused = site.cli("job", "fire", JOB, check=False, ahead_s=LEASE_AHEAD_S)
    assert refused.returncode != 0 and "error: CallbackGuardHeld: " in refused.stderr
    assert f"evidence class {UNKNOWN}" in refused.stderr and "declares no deduplication window" in refused.stderr
    assert f"contextful storage reconcile-guard {guard.token}" in refused.stderr
    assert site.guards.guards() == [guard] and len(delegate.requests()) == 1

    done = site.cli("storage", "reconcile-guard", guard.token, "--evidence", "the enricher's log shows no write",
                    "--operator", "ana")
    assert guard.token in done.stdout
    assert site.guards.guards() == []
    (audit,) = site.guards.audit()
    assert audit[:3] == (guard.token, "the enricher's log shows no write", "ana")
    rerun = json.loads(site.cli("--json", "job", "fire", JOB).stdout)  # its holder is dead: taken over at once
    assert rerun["status"] == "ok" and rerun["execution"] == guard.execution_id
    assert [r["idempotency_key_header"] for r in delegate.requests()] == [guard.idempotency_key] * 2
    assert site.journal.owner(SCOPE).status == CLOSED_OK  # type: ignore[union-attr]


def test_a_lost_acquire_answer_is_an_unknown_outcome_never_a_second_acquire_and_the_rerun_reads_the_guard(
        tmp_path: Path, site: Site, delegate_of: Start, unanswered: list[bytes]) -> None:
    delegate = delegate_of()
    applied(site, delegate, window=3600)
    unanswered.append(ACQUIRE)  # the Worker commits the guard; its answer never reaches the fire
    lost = site.cli("job", "fire", JOB, check=False)
    assert lost.returncode != 0 and "error: CommitOutcomeUnknown: " in lost.stderr
    (guard,) = site.guards.guards()  # it landed, once: nothing acquired it a second time
    assert guard.token in lost.stderr and guard.journal_entry == "row/d1/delegate/1"
    assert sum(ACQUIRE in c.body for c in site.proxy.captured) == 1
    assert delegate.requests() == []  # no call went out under a guard it did not hear of
    owner = site.journal.owner(SCOPE)
    assert owner is not None and owner.status == "pending" and owner.execution_id == guard.execution_id

    # the re-run reads the guard: its holder is gone; while the lease runs it refuses, naming its class
    early = site.cli("job", "fire", JOB, check=False)
    assert early.returncode != 0 and f"evidence class {REPLAY_SAFE}" in early.stderr and guard.token in early.stderr
    rerun = json.loads(site.cli("--json", "job", "fire", JOB, ahead_s=LEASE_AHEAD_S).stdout)
    assert rerun["status"] == "ok" and rerun["execution"] == guard.execution_id
    assert [r["idempotency_key_header"] for r in delegate.requests()] == [guard.idempotency_key]
    assert site.guards.guards() == []
