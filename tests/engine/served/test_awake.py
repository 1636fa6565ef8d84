"""The resume route (engine.served.awake): ``POST``/``GET /awake/<token>`` on a real served face.

Real HTTP on loopback (``serve_project`` in process; ``contextful pipeline serve`` in a child
process for the command's wiring), real signed credentials (Ed25519), real awakeable stores. The
store's and the route's clock is a ManualClock: a deadline or a credential's expiry is an instant
the test moves past, never a sleep.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.control.credentials import (
    PIN_VARIABLE,
    generate_key,
    issue,
    issuer_key,
    load_signing_key,
)
from contextful.engine.run.execution import open_execution
from contextful.engine.run.keeper import Keeper
from contextful.engine.served.awake import MAX_PAYLOAD_BYTES
from contextful.engine.served.face import serve_face
from contextful.engine.served.project import Served, serve_project
from contextful.storage import Store
from contextful.storage.awakeables import PENDING, RESOLVED, TIMED_OUT, AwakeableRow, AwakeableStore
from contextful.storage.clock import ManualClock
from contextful.storage.errors import AwakeableTimedOut, ExecutionSuspended
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

T0_US = 1_800_000_000_000_000
HOUR_US = 3_600_000_000


def request(url: str, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    """One request on its own connection: status, Content-Type, body."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Observed:
    """The store's real awakeable store, noting each call: proof of what a request read."""

    def __init__(self, inner: AwakeableStore) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if callable(attribute):
            def noted(*args: Any, **kwargs: Any) -> Any:
                self.calls.append(name)
                return attribute(*args, **kwargs)
            return noted
        return attribute


@dataclass
class Face:
    """A project pinning one issuer key, its store, and the served face hosting the resume route."""

    root: Path
    key: Ed25519PrivateKey
    clock: ManualClock
    store: Store
    served: Served
    opened: list[int] = field(default_factory=list)
    """One entry per time the route opened its store."""

    @property
    def url(self) -> str:
        return self.served.urls["awake"]

    def credential(self, subject: str = "relay", *, on_behalf_of: str | None = None, audience: str = "awake",
                   key: Ed25519PrivateKey | None = None, ttl_s: int = 600) -> str:
        return issue(key or self.key, subject, audience, ttl_s, on_behalf_of=on_behalf_of, clock=self.clock)

    def mint(self, seq: int, label: str = "approve", deadline_us: int = T0_US + HOUR_US) -> str:
        return self.store.awakeables.mint("exec-1", seq, label, deadline_us, self.clock.now_us()).token

    def observe(self) -> Observed:
        """Put an observer over the awakeable store the route reads (once it opened it)."""
        observed = Observed(self.store.awakeables)
        self.store._awakeables = observed  # type: ignore[assignment]
        return observed


@pytest.fixture
def face(tmp_path: Path, decoder: object) -> Iterator[Face]:
    key = Ed25519PrivateKey.generate()
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text(f'[project]\nissuer_keys = ["{issuer_key(key.public_key()).text}"]\n')
    manifest = load_manifest(root)
    clock = ManualClock(T0_US)
    store = Store.open(manifest.project.store, clock=clock)
    opened: list[int] = []

    def open_store() -> Store:
        opened.append(1)
        return store

    served = serve_project(manifest, open_store, "127.0.0.1:0", decoder=decoder,  # type: ignore[arg-type]
                           queue_root=tmp_path / "queues")
    assert served.awake is not None
    served.awake.clock = clock
    yield Face(root, key, clock, store, served, opened)
    served.shutdown(5)
    store.close()


def error_of(answer: tuple[int, str, bytes]) -> tuple[int, str]:
    status, content_type, body = answer
    assert content_type == "application/json"
    doc = json.loads(body)
    assert set(doc) == {"error", "detail"}  # the served face's one error shape
    return status, doc["error"]


@pytest.mark.clause("run.suspend.resume-route")
def test_post_answers_200_with_the_recorded_payload_404_409_and_410(face: Face) -> None:
    token = face.mint(1)
    soon = face.mint(2, "review", deadline_us=T0_US + 60_000_000)
    auth = bearer(face.credential())

    status, content_type, body = request(face.url, "POST", f"/awake/{token}", b'{"approved": true}', auth)
    assert (status, content_type, body) == (200, "application/octet-stream", b'{"approved": true}')
    assert face.store.awakeables.get(token).payload == b'{"approved": true}'  # type: ignore[union-attr]
    # the same payload again answers the recorded one; another conflicts and changes nothing
    assert request(face.url, "POST", f"/awake/{token}", b'{"approved": true}', auth)[::2] == \
        (200, b'{"approved": true}')
    assert error_of(request(face.url, "POST", f"/awake/{token}", b'{"approved": false}', auth)) == \
        (409, "AwakeableAlreadyResolved")
    assert face.store.awakeables.get(token).payload == b'{"approved": true}'  # type: ignore[union-attr]

    assert error_of(request(face.url, "POST", "/awake/no-such-token", b"x", auth)) == (404, "AwakeableUnknown")

    face.clock.advance(60)  # the deadline instant: pending past it is expired (lazily)
    assert error_of(request(face.url, "POST", f"/awake/{soon}", b"late", auth)) == (410, "AwakeableTimedOut")
    assert face.store.awakeables.get(soon).state == TIMED_OUT  # type: ignore[union-attr]  # as told

    # a payload declared past the bound is refused before a byte of it is read; the awakeable stays pending
    fresh = face.mint(3, deadline_us=T0_US + HOUR_US)
    host, port = face.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", f"/awake/{fresh}")
        for name, value in {**auth, "Content-Length": str(MAX_PAYLOAD_BYTES + 1)}.items():
            conn.putheader(name, value)
        conn.endheaders()  # the headers alone: the answer comes before any body
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())["error"]) == (413, "RequestBodyTooLarge")
    finally:
        conn.close()
    assert face.store.awakeables.get(fresh).state == PENDING  # type: ignore[union-attr]


@pytest.mark.clause("run.suspend.resume-route")
def test_get_reports_the_state_without_resuming(face: Face) -> None:
    token = face.mint(1, "approve", deadline_us=T0_US + HOUR_US)
    soon = face.mint(2, "review", deadline_us=T0_US + 60_000_000)
    auth = bearer(face.credential(on_behalf_of="alice"))

    for _ in range(2):  # asking twice changes nothing
        status, content_type, body = request(face.url, "GET", f"/awake/{token}", headers=auth)
        assert (status, content_type) == (200, "application/json")
        assert json.loads(body) == {"state": "pending", "label": "approve", "execution_id": "exec-1",
                                    "created_at": "2027-01-15T08:00:00+00:00",
                                    "deadline": "2027-01-15T09:00:00+00:00", "resolved_at": None,
                                    "subject": None, "payload_base64": None}
    assert face.store.awakeables.get(token).state == PENDING  # type: ignore[union-attr]
    assert {r.token for r in face.store.awakeables.pending_for("exec-1", face.clock.now_us())} == {token, soon}

    face.clock.advance(60)
    assert json.loads(request(face.url, "GET", f"/awake/{soon}", headers=auth)[2])["state"] == "expired"
    assert request(face.url, "POST", f"/awake/{token}", b"\x00\xffok", auth)[0] == 200
    doc = json.loads(request(face.url, "GET", f"/awake/{token}", headers=auth)[2])
    assert (doc["state"], doc["subject"], doc["resolved_at"]) == ("resolved", "alice", "2027-01-15T08:01:00+00:00")
    assert base64.b64decode(doc["payload_base64"]) == b"\x00\xffok"
    assert error_of(request(face.url, "GET", "/awake/no-such-token", headers=auth)) == (404, "AwakeableUnknown")


@pytest.mark.clause("run.suspend.resume-authenticates")
def test_the_credential_is_admitted_before_the_registry_is_read(face: Face) -> None:
    live = face.mint(1)
    stranger = Ed25519PrivateKey.generate()
    refusals = {
        "none": {},
        "not bearer": {"Authorization": f"Basic {face.credential()}"},
        "unpinned issuer": bearer(face.credential(key=stranger)),
        "another audience": bearer(face.credential(audience="fire")),
        "garbage": bearer("cfc1.e30.AAAA"),
    }
    expired = face.credential(ttl_s=60)

    def answers() -> list[tuple[int, str, bytes]]:
        got = []
        for headers in refusals.values():
            by_token = [request(face.url, method, f"/awake/{token}", b"yes" if method == "POST" else None, headers)
                        for token in (live, "no-such-token") for method in ("POST", "GET")]
            assert all(a == by_token[0] for a in by_token), by_token  # a live and an unknown token alike
            got.append(by_token[0])
        return got

    for status, _content_type, body in answers():
        assert status == 401 and json.loads(body)["error"] == "CredentialUnadmitted"
        assert live.encode() not in body
    assert face.opened == []  # no refused request opened the store, so none read the registry

    assert request(face.url, "GET", f"/awake/{live}", headers=bearer(face.credential()))[0] == 200  # opens it
    observed = face.observe()
    face.clock.advance(60)  # the short credential's exp instant
    refusals["expired"] = bearer(expired)
    assert [a[0] for a in answers()] == [401] * len(refusals)
    assert observed.calls == []  # with the store open, a refused request still reads nothing
    assert observed.inner.get(live).state == PENDING  # type: ignore[union-attr]
    assert request(face.url, "POST", f"/awake/{live}", b"yes", bearer(face.credential()))[0] == 200
    assert observed.calls == ["resolve"]


@pytest.mark.clause("run.suspend.resume-authenticates")
def test_the_verified_on_behalf_of_is_recorded_as_the_caller_subject(face: Face) -> None:
    relayed, direct = face.mint(1), face.mint(2)
    assert request(face.url, "POST", f"/awake/{relayed}", b"ok",
                   bearer(face.credential("svc://relay", on_behalf_of="alice")))[0] == 200
    assert request(face.url, "POST", f"/awake/{direct}", b"ok", bearer(face.credential("bob")))[0] == 200
    rows = {t: face.store.awakeables.get(t) for t in (relayed, direct)}
    assert {t: (r.state, r.subject) for t, r in rows.items() if r is not None} == \
        {relayed: (RESOLVED, "alice"), direct: (RESOLVED, "bob")}
    # a credential claiming another on_behalf_of after signing is refused, and records nothing
    token = face.credential("svc://relay", on_behalf_of="alice")
    head, claims, signature = token.split(".")
    forged = json.loads(base64.urlsafe_b64decode(claims + "=="))
    forged["on_behalf_of"] = "mallory"
    forged_claims = base64.urlsafe_b64encode(json.dumps(forged, sort_keys=True, separators=(",", ":")).encode())
    third = face.mint(3)
    assert request(face.url, "POST", f"/awake/{third}", b"ok",
                   bearer(f"{head}.{forged_claims.rstrip(b'=').decode()}.{signature}"))[0] == 401
    assert face.store.awakeables.get(third).subject is None  # type: ignore[union-attr]


@pytest.mark.clause("run.suspend.resume-route", "run.suspend.resume-authenticates")
def test_a_post_wakes_the_suspended_execution_with_the_payload(face: Face) -> None:
    tokens: queue.Queue[str] = queue.Queue()

    def run() -> bytes:  # an execution suspending, as a job's step does, until someone posts the token back
        execution = open_execution(face.store.journal, "job:approve", "plan-1", clock=face.clock)
        payload = execution.suspend("approve", 3600, on_token=tokens.put, wait_s=60)
        execution.close(True)
        return payload

    with ThreadPoolExecutor(1, thread_name_prefix="suspended-execution") as pool:
        waiting = pool.submit(run)
        token = tokens.get(timeout=60)  # pending: the execution is waiting on it
        auth = bearer(face.credential("svc://relay", on_behalf_of="dana"))
        assert json.loads(request(face.url, "GET", f"/awake/{token}", headers=auth)[2])["state"] == "pending"
        assert not waiting.done()  # GET resumed nothing
        assert request(face.url, "POST", f"/awake/{token}", b"approved by dana", auth)[::2] == \
            (200, b"approved by dana")
        assert waiting.result(timeout=60) == b"approved by dana"
    row = face.store.awakeables.get(token)
    assert row is not None and (row.state, row.subject) == (RESOLVED, "dana")


class _Broken:
    """An awakeable store that fails in a way no route expects, naming the token it was asked for."""

    def resolve(self, token: str, *_: object) -> None:
        raise RuntimeError(f"the registry broke while resolving {token}")


def test_no_log_line_of_the_face_holds_a_token_whole(face: Face, caplog: pytest.LogCaptureFixture) -> None:
    """Request lines (DEBUG), a request line http.server refuses, a failed route's trace, and a face
    that does not serve the route: every log record shows a token's first characters only."""
    caplog.set_level(logging.DEBUG)
    token, unknown = face.mint(1), "Z" * 43
    auth = bearer(face.credential())
    assert request(face.url, "POST", f"/awake/{token}", b"go", auth)[0] == 200
    assert request(face.url, "GET", f"/awake/{token}?why=audit", headers=auth)[0] == 200
    assert request(face.url, "POST", f"/awake/{token}", b"go")[0] == 401
    assert request(face.url, "GET", f"/awake/{unknown}", headers=auth)[0] == 404
    assert request(face.url, "GET", f"/AWAKE/{token}", headers=auth)[0] == 404  # no route, still a token
    host, port = face.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as raw:  # a request line http.server refuses
        raw.sendall(f"POST /awake/{token} junk HTTP/1.1\r\n\r\n".encode())
        assert raw.makefile("rb").readline().startswith(b"HTTP/1.1 400")
    kept, face.store._awakeables = face.store.awakeables, _Broken()  # type: ignore[assignment]
    try:
        assert request(face.url, "POST", f"/awake/{token}", b"go", auth)[0] == 500
    finally:
        face.store._awakeables = kept
    other = serve_face(("127.0.0.1", 0), [])  # a face without the route: a token sent there is no less secret
    try:
        assert request(other.url, "POST", f"/awake/{token}", b"go", auth)[0] == 404
    finally:
        other.shutdown(5)

    served = [r for r in caplog.records if r.name.startswith("contextful.engine.served")]
    lines = [r.getMessage() for r in served]
    hint = f"/awake/{token[:6]}…"
    assert sum(f'"POST {hint} HTTP/1.1" 200' in line for line in lines) == 1, lines  # DEBUG request lines seen
    assert any(f'"GET {hint}?why=audit HTTP/1.1" 200' in line for line in lines), lines
    assert any(f'"POST {hint} HTTP/1.1" 401' in line for line in lines), lines
    assert any(f"/awake/{unknown[:6]}…" in line for line in lines), lines
    assert any(f"/AWAKE/{token[:6]}…" in line for line in lines), lines
    assert any("code 400" in line and f"{hint} junk HTTP/1.1" in line for line in lines), lines
    [failed] = [line for line in lines if "failed" in line]
    assert f"served: POST {hint} failed" in failed and f"resolving {token[:6]}…" in failed, failed
    assert sum(f'"POST {hint} HTTP/1.1" 404' in line for line in lines) == 1, lines  # the other face's
    assert all(r.exc_info is None for r in served)  # a trace is written masked, never left to a formatter
    assert token not in caplog.text and unknown not in caplog.text
    assert all(token not in line and unknown not in line for line in lines)


@pytest.mark.clause("run.suspend.resume-route", "run.suspend.expired-token")
def test_a_post_read_in_time_that_loses_to_the_waiters_timeout_answers_410_as_the_run_records(face: Face) -> None:
    """The route reads the awakeable pending before its deadline; before it writes, the suspended
    execution looks past the deadline and records the timeout; then the route's write comes. The
    caller is answered 410, and the row, the execution's step and its replays all say timed out."""
    execution = open_execution(face.store.journal, "job:approve", "plan-1", holder="h1", lease_s=7200,
                               clock=face.clock, keeper=Keeper(face.clock, start=False))
    with pytest.raises(ExecutionSuspended) as suspended:
        execution.suspend("approve", 3600, wait_s=0)
    token = suspended.value.token
    waiter: list[AwakeableTimedOut] = []
    route_store = face.store.awakeables  # the real adapter the route resolves through
    read = route_store.get

    def get_then_the_waiter_times_out(asked: str) -> AwakeableRow | None:
        row = read(asked)
        if not waiter:  # the route's look: the deadline is still ahead of its instant
            assert row is not None and row.state == PENDING and face.clock.now_us() < row.deadline_us
            face.clock.advance(3600)
            with pytest.raises(AwakeableTimedOut) as timed_out:
                execution.suspend("approve", 3600)
            waiter.append(timed_out.value)
        return row

    setattr(route_store, "get", get_then_the_waiter_times_out)  # noqa: B010 - a hook over the real adapter
    auth = bearer(face.credential(on_behalf_of="dana"))
    assert error_of(request(face.url, "POST", f"/awake/{token}", b"approved", auth)) == (410, "AwakeableTimedOut")
    assert [w.token for w in waiter] == [token]
    row = read(token)
    assert row is not None and (row.state, row.payload, row.subject) == (TIMED_OUT, None, None)
    auth = bearer(face.credential(on_behalf_of="dana"))  # the clock moved past the first one's expiry
    assert json.loads(request(face.url, "GET", f"/awake/{token}", headers=auth)[2])["state"] == "expired"
    assert [s.value[:1] for s in face.store.journal.steps(execution.execution_id)] == [b"t"]  # the timeout
    resumed = open_execution(face.store.journal, "job:approve", "plan-1", holder="h1", lease_s=60, clock=face.clock,
                             keeper=Keeper(face.clock, start=False))
    with pytest.raises(AwakeableTimedOut):
        resumed.suspend("approve", 3600)  # replay reads what the caller was told


def _serve(project: Path, *args: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """``contextful pipeline serve ARGS`` (one address option) in a child process; its URL by label."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "pipeline",
                             "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # printed once the address is bound
    found = re.fullmatch(r"listening on (\S+)(?: \((\w+)\))?\n", line)
    assert found is not None, line + (proc.stderr.read() if proc.stderr else "")
    return proc, {found.group(2) or "": found.group(1)}


@pytest.mark.clause("run.suspend.resume-route", "run.suspend.resume-authenticates")
def test_the_serve_command_hosts_the_route_and_never_creates_a_store(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    pin, key_file = generate_key(tmp_path / "keys" / "issuer.pem")
    (project / "contextful.toml").write_text(f'[project]\nissuer_keys = ["{pin.text}"]\n')
    token = issue(load_signing_key(key_file), "ops", "awake", 600, on_behalf_of="carol")

    proc, urls = _serve(project, "--awake-http", "127.0.0.1:0")
    try:
        # no store yet: the route never creates one, and every token is unknown
        assert error_of(request(urls["awake"], "GET", "/awake/anything", headers=bearer(token))) == \
            (404, "AwakeableUnknown")
        assert not (project / ".contextful").exists()
        with Store.open(load_manifest(project).project.store) as store:  # a run suspends: the store and its row
            minted = store.awakeables.mint("exec-9", 4, "approve", store.clock.now_us() + HOUR_US, store.clock.now_us())
        assert error_of(request(urls["awake"], "POST", f"/awake/{minted.token}", b"go")) == (401, "CredentialUnadmitted")
        assert request(urls["awake"], "POST", f"/awake/{minted.token}", b"go", bearer(token))[::2] == (200, b"go")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    with Store.open(load_manifest(project).project.store, create=False) as store:
        row = store.awakeables.get(minted.token)
        assert row is not None and (row.state, row.payload, row.subject) == (RESOLVED, b"go", "carol")


@pytest.mark.clause("run.suspend.resume-authenticates")
def test_the_machines_pin_replaces_the_manifests(face: Face, decoder: object, monkeypatch: pytest.MonkeyPatch) -> None:
    token = face.mint(1)
    machine_key = Ed25519PrivateKey.generate()
    monkeypatch.setenv(PIN_VARIABLE, issuer_key(machine_key.public_key()).text)
    served = serve_project(load_manifest(face.root), lambda: face.store, "127.0.0.1:0", decoder=decoder,  # type: ignore[arg-type]
                           queue_root=face.root / "queues")
    try:
        assert served.awake is not None
        served.awake.clock = face.clock
        url = served.urls["awake"]
        assert error_of(request(url, "GET", f"/awake/{token}", headers=bearer(face.credential()))) == \
            (401, "CredentialUnadmitted")
        assert request(url, "GET", f"/awake/{token}", headers=bearer(face.credential(key=machine_key)))[0] == 200
    finally:
        served.shutdown(5)


def test_serve_hosts_the_route_only_where_an_issuer_key_is_pinned(tmp_path: Path, decoder: object) -> None:
    from contextful.storage.errors import SpecInvalid

    (tmp_path / "contextful.toml").write_text("[project]\n")
    manifest = load_manifest(tmp_path)
    opener: Callable[[], Store] = lambda: Store.open(tmp_path / "store")
    for kwargs in ({"address": "127.0.0.1:0"}, {"address": None, "awake_address": "127.0.0.1:0"}):
        with pytest.raises(SpecInvalid, match="issuer"):
            serve_project(manifest, opener, decoder=decoder, queue_root=tmp_path / "q", **kwargs)  # type: ignore[arg-type]
