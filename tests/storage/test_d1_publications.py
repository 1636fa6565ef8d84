"""Coordinated publications on the D1 profile (``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1``):
``contextful export group`` (a child process) delivering the publication test project's groups to a
receiver process on loopback, with every piece of sender state in D1
(``engine.export.publications.d1``).

* ``run.export.group-d1-state``: D1 holds each group's producer frontier, the staged outbox and the
  publication's active namespace; the completing acknowledgement and its promotion are one batch (a
  fault at the promotion leaves the acknowledgement unrecorded too).
* ``run.export.group-d1-lease``: one versioned lease row per publication; a writer whose lease
  passed to a second exporter changes no row.
* ``run.export.group-d1-recovery``: a fresh empty directory with only the bindings resumes an
  interrupted group from D1 with byte-identical identifiers before staging a later frontier.
* ``run.export.group-storage`` (D1 half): a group over 8 MiB of sender state refuses before staging.

Real components: the session's Worker under miniflare (a fresh namespace per test), the CLI and the
receiver as child processes, the delivery tests' loopback gate between them. Oracles: D1's rows read directly
through the binding, the receiver's SQLite file, identifiers recomputed with hashlib.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.storage.d1.client import D1Binding, D1Client

from tests.engine.export import conftest as export_fixtures
from tests.engine.export.publication_project import MANIFEST, Gate, Project, ReceiverProcess
from tests.storage.test_d1_profile import profile_env

pytestmark = pytest.mark.d1


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class Forwarder(Gate):
    """The delivery tests' gate (``allow``: how many more events it passes before answering 503),
    which also holds the request carrying event sequence ``hold_at`` until :meth:`let_go`, setting
    ``holding`` when it arrives; :attr:`bodies` is what it was sent, in order."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.hold_at = -1
        self.holding, self.go = threading.Event(), threading.Event()
        forwarder, gate_handler = self, self.server.RequestHandlerClass

        class Handler(gate_handler):  # type: ignore[valid-type,misc]
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if json.loads(body)["sequence"] == forwarder.hold_at:
                    forwarder.hold_at = -1
                    forwarder.holding.set()
                    forwarder.go.wait(120)  # released by the test; the deadline bounds a broken test only
                self.rfile = io.BytesIO(body)
                super().do_POST()

        self.server.RequestHandlerClass = Handler

    @property
    def bodies(self) -> list[bytes]:
        return [body for _headers, body in self.seen]

    def let_go(self) -> None:
        self.go.set()

    def close(self) -> None:
        self.go.set()
        super().close()


receiver = export_fixtures.receiver
"""The export tests' receiver process fixture."""


@pytest.fixture
def forwarder(receiver: ReceiverProcess) -> Iterator[Forwarder]:
    found = Forwarder(receiver.events_url)
    yield found
    found.close()


def d1_project(root: Path, binding: D1Binding, destination: str, manifest: str = MANIFEST) -> Project:
    """The publication test project on the D1 profile, its store provisioned, ``orders`` landed with
    ids 1..3 and both producers fired once."""
    project = d1_project_files(root, binding, destination, manifest)
    project.cli("store", "provision")
    project.cli("pipeline", "import")
    project.land("a", [1, 2, 3])
    project.fire("enrich")
    project.fire("build_reports")
    return project


def d1_project_files(root: Path, binding: D1Binding, destination: str, manifest: str = MANIFEST) -> Project:
    """The project's files alone in ``root`` (no store, nothing landed), bound to the D1 profile."""
    project = Project(root, None, profile_env(binding))
    project.write(destination, manifest)
    return project


@pytest.fixture
def project(tmp_path: Path, d1_binding: D1Binding, forwarder: Forwarder) -> Project:
    return d1_project(tmp_path / "machine-a", d1_binding, forwarder.url)


def export_group(project: Project, check: bool = True) -> Any:
    return project.cli("--json", "export", "group", "bi", check=check)


def d1_state(client: D1Client) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the publication state in D1, table by table (the write token aside)."""
    return {
        "senders": client.query("SELECT publication, version, holder, expires_us, active_group, active_namespace, "
                                "frontier FROM cf_publication_senders ORDER BY publication"),
        "groups": client.query("SELECT group_id, publication, sequence, identity, events, acknowledged "
                               "FROM cf_publication_groups ORDER BY sequence"),
        "events": client.query("SELECT group_id, sequence, part, event_id, kind, payload FROM cf_publication_events "
                               "ORDER BY group_id, sequence, part")}


def staged_events(client: D1Client, order: int) -> list[tuple[str, str]]:
    """Group ``order``'s staged ``(event_id, payload)`` pairs, read from D1."""
    rows = client.query("SELECT e.sequence, e.part, e.event_id, e.payload FROM cf_publication_events e JOIN "
                        "cf_publication_groups g USING (group_id) WHERE g.sequence = ? ORDER BY e.sequence, e.part",
                        (order,))
    events: dict[int, tuple[str, str]] = {}
    for sequence, _part, event_id, payload in rows:
        events[sequence] = (event_id, events.get(sequence, ("", ""))[1] + payload)
    return [events[n] for n in sorted(events)]


@pytest.mark.clause("run.export.group-d1-state")
def test_d1_holds_the_outbox_frontier_and_active_namespace_and_one_batch_completes_a_group(
        project: Project, receiver: ReceiverProcess, forwarder: Forwarder, d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    # a fault at the promotion (a D1 trigger refusing the active group's update) fails the whole batch
    fault = ("CREATE TRIGGER fault BEFORE UPDATE OF active_group ON cf_publication_senders "
             "BEGIN SELECT RAISE(ABORT, 'injected fault'); END")
    client.batch([(fault, ())])
    failed = export_group(project, check=False)
    assert failed.returncode != 0 and "error: CatalogRejected:" in failed.stderr and "injected fault" in \
        failed.stderr, failed.stderr
    assert len(forwarder.bodies) == 5  # the receiver heard (and acknowledged) all five
    state = d1_state(client)
    # the group-complete event's acknowledgement did not land without its promotion: 4 of 5, nothing active
    assert [(g[2], g[4], g[5]) for g in state["groups"]] == [(1, 5, 4)]
    assert [(s[4], s[5], s[6]) for s in state["senders"]] == [(None, None, None)]
    assert not (project.root / ".contextful" / "store" / "catalog.sqlite").exists()  # nothing local

    client.batch([("DROP TRIGGER fault", ())])
    forwarder.seen.clear()
    resumed = json.loads(export_group(project).stdout)
    assert (resumed["resumed"], resumed["order"], resumed["delivered"]) == (True, 1, 1)
    events = staged_events(client, 1)
    assert forwarder.bodies == [events[4][1].encode()]  # the last event reoffered, as staged
    group_id = resumed["group"]
    identity = json.loads(events[0][1])["identity"]
    assert group_id == _digest(identity) and [e for e, _p in events] == [
        _digest({"group": group_id, "sequence": n}) for n in range(5)]
    state = d1_state(client)
    # D1 holds the group's producer frontier (its identity), its outbox and the active namespace
    assert [(g[0], g[2], json.loads(g[3]), g[4], g[5]) for g in state["groups"]] == [(group_id, 1, identity, 5, 5)]
    assert identity["input_frontier"] == {c["producer"]: c["input_frontier"] for c in _completions(client)}
    assert [(s[0], s[4], s[5], json.loads(s[6])) for s in state["senders"]] == [
        ("bi", group_id, "bi", identity["next_state"])]
    active = receiver.active()
    assert active is not None and (active["group_id"], active["order"]) == (group_id, 1)

    # a rebuild into a fresh namespace: staged at the next position with order 1, and its completing
    # acknowledgement promotes it and its namespace in D1 as the receiver switches to it
    rebuilt = json.loads(project.cli("--json", "export", "rebuild", "bi", "--namespace", "epoch2").stdout)
    assert client.query("SELECT sequence, json_extract(identity, '$.namespace') AS ns, "
                        "json_extract(identity, '$.order') AS n FROM cf_publication_groups ORDER BY sequence") == [
        (1, "bi", 1), (2, "epoch2", 1)]
    assert [(s[4], s[5]) for s in d1_state(client)["senders"]] == [(rebuilt["group"], "epoch2")]
    switched = receiver.published()
    assert switched is not None and (switched["namespace"], switched["group_id"]) == ("epoch2", rebuilt["group"])


def _completions(client: D1Client) -> list[dict[str, Any]]:
    return [json.loads(body) for (body,) in client.query("SELECT body FROM cf_publication_completions")]


def spawn_export(project: Project) -> subprocess.Popen[str]:
    """``contextful --json export group bi`` started as its own process (as ``contextful_in`` runs one)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | project.env
    return subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--json", "export", "group", "bi"],
                            cwd=project.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.clause("run.export.group-d1-lease")
def test_a_writer_whose_lease_passed_to_a_second_exporter_changes_no_row(
        project: Project, receiver: ReceiverProcess, forwarder: Forwarder, d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    forwarder.hold_at = 2  # exporter A delivers events 0 and 1, then waits on the receiver's answer to 2
    first = spawn_export(project)
    try:
        assert forwarder.holding.wait(120), first.communicate()
        # A holds the publication's one lease row: versioned, naming A's process, with an expiry
        [(version, holder, expires_us)] = client.query("SELECT version, holder, expires_us FROM "
                                                       "cf_publication_senders WHERE publication = 'bi'")
        assert f"{first.pid}" in holder and version >= 3 and expires_us > 0
        assert [(g[2], g[5]) for g in d1_state(client)["groups"]] == [(1, 2)]
        assert len(forwarder.bodies) == 2  # 0 and 1 (2 is held)

        # A's lease expires (its expiry moved to the past: 30 s of wall time, without waiting them out);
        # exporter B takes it, and its receiver refuses it: B acknowledged nothing
        client.batch([("UPDATE cf_publication_senders SET expires_us = 1 WHERE publication = 'bi'", ())])
        forwarder.allow = 0
        second = export_group(project, check=False)
        assert second.returncode != 0 and "error: SourceUnavailable:" in second.stderr, second.stderr
        taken = d1_state(client)
        assert taken["senders"][0][1] > version and [(g[2], g[5]) for g in taken["groups"]] == [(1, 2)]

        # A's event 2 is acknowledged by the receiver now; A's acknowledgement (the next in order, so
        # the group row alone would admit it) predicates on the lease it lost: no row changes
        forwarder.allow = 1_000_000
        forwarder.let_go()
        _out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode != 0 and "error: ExecutionWriterFenced:" in err and "its lease passed" in err, err
    assert d1_state(client) == taken

    # the next exporter resumes the group from event 2 (the receiver acknowledges it again) and completes it
    done = json.loads(export_group(project).stdout)
    assert (done["resumed"], done["delivered"], done["events"]) == (True, 3, 5)
    active = receiver.active()
    assert active is not None and active["group_id"] == done["group"]
    assert [s[4] for s in d1_state(client)["senders"]] == [done["group"]]


@pytest.mark.clause("run.export.group-d1-recovery")
def test_an_empty_disk_replacement_resumes_the_group_from_d1_with_identical_identifiers(
        project: Project, receiver: ReceiverProcess, forwarder: Forwarder, d1_binding: D1Binding,
        tmp_path: Path) -> None:
    """Machine A stages group 1 and its receiver refuses the first event (staged, none acknowledged);
    a later frontier lands; A's disk is gone. Replacement B, a fresh directory holding only the
    project's files and the bindings, resumes the group and is itself cut off after two
    acknowledged events (partially acknowledged); its disk goes too. Replacement C finishes the
    group with the same identifiers, byte for byte, and only then stages the later frontier."""
    client = d1_binding.client()
    forwarder.allow = 0
    interrupted = export_group(project, check=False)
    assert interrupted.returncode != 0 and "error: SourceUnavailable:" in interrupted.stderr, interrupted.stderr
    staged = [p.encode() for _e, p in staged_events(client, 1)]
    assert forwarder.bodies == staged[:1]
    project.land("b", [4, 5])  # a later frontier, completed before the replacement runs
    project.fire("enrich")
    project.fire("build_reports")
    shutil.rmtree(project.root)

    delivered: list[bytes] = forwarder.bodies
    for name, allow, code in (("machine-b", 2, 75), ("machine-c", 1_000_000, 0)):
        forwarder.allow, forwarder.seen = allow, []
        replacement = d1_project_files(tmp_path / name, d1_binding, forwarder.url)
        assert sorted(p.name for p in replacement.root.iterdir()) == ["contextful.toml", "orders", "shop"]
        resumed = export_group(replacement, check=False)
        assert resumed.returncode == code, resumed.stderr
        # the receiver is offered the interrupted delivery's bytes again (its unacknowledged event
        # first), then the rest of the same group: no later frontier is staged before it completes
        sent = forwarder.bodies
        assert sent[0] == delivered[-1] and sent == staged[staged.index(delivered[-1]):][:len(sent)]
        delivered += sent
        if code:
            shutil.rmtree(replacement.root)
    assert json.loads(resumed.stdout)["resumed"] is True and client.query(
        "SELECT count(*) FROM cf_publication_groups")[0][0] == 1
    group_id = json.loads(staged[0])["group_id"]
    assert {json.loads(b)["group_id"] for b in delivered} == {group_id}
    assert [json.loads(b)["event_id"] for b in delivered] == [_digest({"group": group_id, "sequence": n})
                                                              for n in (0, 0, 1, 2, 2, 3, 4)]
    assert {row[0] for row in receiver.events()} == {json.loads(b)["event_id"] for b in staged}
    active = receiver.active()
    assert active is not None and (active["group_id"], active["order"]) == (group_id, 1)
    # only then the later frontier: group 2 follows group 1
    later = json.loads(export_group(replacement).stdout)
    assert (later["resumed"], later["order"]) == (False, 2)
    identity2 = json.loads(staged_events(client, 2)[0][1])["identity"]
    assert identity2["predecessor"] == group_id
    after = receiver.active()
    assert after is not None and after["group_id"] == later["group"]
    # its completing acknowledgement promoted it in D1: the active group, namespace and frontier
    assert [(s[4], s[5], json.loads(s[6])) for s in d1_state(client)["senders"]] == [
        (later["group"], "bi", identity2["next_state"])]
    assert json.loads(export_group(replacement).stdout)["group"] is None  # nothing new: nothing staged


@pytest.mark.clause("run.export.group-storage")
def test_a_d1_sender_state_over_8_mib_refuses_before_staging(tmp_path: Path, d1_binding: D1Binding,
                                                             receiver: ReceiverProcess, forwarder: Forwarder) -> None:
    """The D1 half of the clause (the postgres half: tests/engine/export/test_publication_delivery.py).
    Model ``weekly`` carries 400 kB of text per unit of the orders' id sum: orders 1, 2 and 3 stage a
    group of about 3 MB (its payloads spanning several D1 rows, delivered byte for byte); order 20
    added, the next group would take about 14 MB."""
    padded = MANIFEST.replace('sql = "SELECT sum(amount) AS total FROM orders"',
                              "sql = \"SELECT sum(amount) AS total, repeat('x', 400000 * sum(id)::INTEGER) AS pad "
                              'FROM orders"')
    project = d1_project(tmp_path / "p", d1_binding, forwarder.url, padded)
    client = d1_binding.client()
    first = json.loads(export_group(project).stdout)
    assert (first["order"], first["delivered"]) == (1, 5)
    parts = client.query("SELECT sequence, count(*) FROM cf_publication_events GROUP BY sequence ORDER BY sequence")
    assert parts[3][1] > 1  # the weekly member's payload spans several rows
    assert forwarder.bodies == [p.encode() for _e, p in staged_events(client, 1)]
    before, heard = d1_state(client), receiver.events()

    project.land("b", [20])
    project.fire("build_reports")  # enrich's completion stays the one group 1 read
    forwarder.seen.clear()
    refused = export_group(project, check=False)
    assert refused.returncode != 0
    assert refused.stderr.startswith("error: PublicationStorageUnsupported: publication 'bi' under storage profile "
                                     "'cloudflare-d1': group 2's sender state would take "), refused.stderr
    assert "over its bound of 8388608 bytes (8 MiB)" in refused.stderr and "coordinated-group-outbox" in refused.stderr
    # nothing staged, nothing delivered (the lease the call took is released: only its row's lease moved)
    after = d1_state(client)
    assert after["groups"] == before["groups"] and after["events"] == before["events"]
    assert [s[4:] for s in after["senders"]] == [s[4:] for s in before["senders"]]
    assert forwarder.seen == [] and receiver.events() == heard
