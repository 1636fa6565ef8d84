"""The outbox port (``storage.outbox``) on the execution database: typed outboxes, acknowledged
keyed state and log checkpoints, and a replacement process that reoffers its killed predecessor's
pending event ids before its acknowledged frontier advances (``run.export.remote-state``); nothing
delivered becomes pending again (an acknowledged id staged again, a checkpoint staged behind the
stored one, a stale stager fenced off, a stage rerun after its unheard ``COMMIT`` raced a drain).

Each adapter runs the suite: PostgreSQL on the session's real server (a fresh schema per test) and
D1 through the D1 profile's Worker under miniflare (a fresh namespace per test). The replacement
is a real child process after a SIGKILL (``tests.storage.outbox_sender``); the stale stager is an
execution whose lease another holder took over on the journal in the same schema or namespace
(``run.export.writer-fenced``). PostgreSQL alone: the unheard ``COMMIT`` is a real one, cut by a
wire-protocol proxy (``tests.support.pg_proxy``), and the upgrade of tables an older version made.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from contextful.engine.run.execution import Execution, open_execution
from contextful.engine.run.keeper import Keeper
from contextful.storage.clock import ManualClock
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import ExecutionWriterFenced, OutboxFrontierGap
from contextful.storage.fence import PUBLICATION, WriterFence, writing_as
from contextful.storage.journal import JournalStore
from contextful.storage.outbox import OutboxStore, Staged, StreamState, open_outbox_store

from tests.storage.test_journal_conformance import JournalSite, journal_site
from tests.support.pg_proxy import PgProxy

T0 = 1_700_000_000_000_000


def open_outbox(site: JournalSite) -> OutboxStore:
    """The outbox at ``site``: beside the journal, in its PostgreSQL schema or D1 namespace."""
    if site.kind == "d1":
        return open_outbox_store("d1", url=site.location, token=site.token, namespace=site.schema)
    return open_outbox_store("postgres", dsn=site.location, schema=site.schema)


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("d1", marks=pytest.mark.d1)])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> JournalSite:
    return journal_site(request.param, request, tmp_path)


@pytest.fixture
def outbox(site: JournalSite) -> Iterator[OutboxStore]:
    store = open_outbox(site)
    yield store
    store.close()


def events(*positions: int) -> list[Staged]:
    """Event ``p`` read from log position ``p``."""
    return [(p, f"orders:{p}", "row-upsert", f"payload {p}".encode()) for p in positions]


@pytest.mark.clause("run.export.remote-state")
def test_staged_events_checkpoint_and_keyed_state_live_in_the_execution_database(
        outbox: OutboxStore, site: JournalSite) -> None:
    staged = outbox.stage("orders", events(1, 2, 3), 3, T0)
    assert [(e.seq, e.position, e.event_id, e.kind) for e in staged] == [
        (1, 1, "orders:1", "row-upsert"), (2, 2, "orders:2", "row-upsert"), (3, 3, "orders:3", "row-upsert")]
    # Staging a pending id again keeps its first payload and place.
    again = outbox.stage("orders", [(2, "orders:2", "row-upsert", b"other"), *events(4)], 4, T0 + 1)
    assert [(e.seq, e.payload) for e in again] == [(2, b"payload 2"), (4, b"payload 4")]
    other = open_outbox(site)  # another connection sees it all
    try:
        assert other.stream_state("orders") == StreamState("orders", frontier=0, checkpoint=4, pending=4)
        assert other.acknowledge("orders", ["orders:1", "orders:2"], {"order 7": b"v2"}) == 2
        assert [e.event_id for e in outbox.pending("orders")] == ["orders:3", "orders:4"]
        assert outbox.acknowledged("orders", "order 7") == b"v2"
        assert outbox.acknowledged("orders", "order 8") is None
        assert outbox.stream_state("orders") == StreamState("orders", frontier=2, checkpoint=4, pending=2)
    finally:
        other.close()


@pytest.mark.clause("run.export.remote-state")
def test_the_frontier_never_advances_past_a_pending_event(outbox: OutboxStore) -> None:
    outbox.stage("orders", events(1, 2, 3), 3, T0)
    with pytest.raises(OutboxFrontierGap) as info:
        outbox.acknowledge("orders", ["orders:2"], {"k": b"skipped"})
    assert (info.value.stream, info.value.pending, info.value.offered) == ("orders", ("orders:1",), ("orders:2",))
    with pytest.raises(OutboxFrontierGap):
        outbox.acknowledge("orders", ["orders:1", "orders:3"], {})
    assert outbox.stream_state("orders").frontier == 0
    assert outbox.acknowledged("orders", "k") is None  # state acknowledged with a refused batch is not kept
    assert [e.event_id for e in outbox.pending("orders")] == ["orders:1", "orders:2", "orders:3"]
    sent = []
    outbox.drain("orders", lambda e: sent.append(e.event_id) or {"k": e.payload})
    assert sent == ["orders:1", "orders:2", "orders:3"]
    assert outbox.stream_state("orders") == StreamState("orders", frontier=3, checkpoint=3, pending=0)
    assert outbox.acknowledged("orders", "k") == b"payload 3"


def _sender(site: JournalSite, sink: Path, log_end: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.storage.outbox_sender", site.kind, site.location, site.schema,
                             site.token, "orders", str(sink), str(log_end), *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[2], env=os.environ.copy())


def _line(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(word + " ") or line.strip() == word, f"expected {word!r}, got {line!r}"
    return line[len(word):].strip()


def killed_sender(site: JournalSite, sink: Path, log_end: int, flag: str) -> list[str]:
    """Run a sender on a fresh stream until it stops at ``flag``'s point, SIGKILL it there; the ids it staged."""
    first = _sender(site, sink, log_end, flag)
    try:
        assert json.loads(_line(first, "reoffered")) == []
        staged: list[str] = json.loads(_line(first, "staged"))
        _line(first, "ready")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(60)
    return staged


@pytest.mark.clause("run.export.remote-state")
def test_a_replacement_reoffers_the_killed_senders_pending_ids_first(outbox: OutboxStore, site: JournalSite,
                                                                     tmp_path: Path) -> None:
    sink = tmp_path / "destination.txt"
    staged = killed_sender(site, sink, 4, "--die-after-staging")
    assert staged == ["orders:1", "orders:2", "orders:3", "orders:4"]
    pending = [e.event_id for e in outbox.pending("orders")]
    assert pending == staged[1:]  # the first was delivered and acknowledged before the kill
    assert outbox.stream_state("orders") == StreamState("orders", frontier=1, checkpoint=4, pending=3)

    replacement = _sender(site, sink, 6)
    try:
        reoffered = json.loads(_line(replacement, "reoffered"))
        restaged = json.loads(_line(replacement, "staged"))
        frontier = json.loads(_line(replacement, "done"))
    finally:
        replacement.wait(120)
    assert replacement.returncode == 0
    assert reoffered == pending  # identical ids, before anything new
    assert restaged == ["orders:5", "orders:6"]  # read on from the log checkpoint: nothing staged twice
    assert frontier == 6
    delivered = sink.read_text().splitlines()
    assert delivered == [f"orders:{p} payload {p}" for p in (1, 2, 3, 4, 5, 6)]
    assert outbox.acknowledged("orders", "k0") == b"payload 6"
    assert outbox.acknowledged("orders", "k1") == b"payload 5"


@pytest.mark.clause("run.export.remote-state")
def test_an_acknowledged_id_staged_again_stays_acknowledged(outbox: OutboxStore, site: JournalSite) -> None:
    outbox.stage("orders", events(1, 2, 3), 3, T0)
    outbox.acknowledge("orders", ["orders:1"], {"k": b"payload 1"})
    # The same read staged again: the delivered id is omitted, the pending ones keep their place.
    again = outbox.stage("orders", events(1, 2, 3), 3, T0 + 1)
    assert [(e.seq, e.event_id, e.staged_us) for e in again] == [(2, "orders:2", T0), (3, "orders:3", T0)]
    outbox.drain("orders", lambda e: {"k": e.payload})
    assert outbox.stage("orders", events(1, 2, 3), 3, T0 + 2) == []
    # A stager that read the log from the start up to 5: only what lies past the checkpoint is new.
    later = outbox.stage("orders", events(1, 2, 3, 4, 5), 5, T0 + 3)
    assert [(e.seq, e.event_id) for e in later] == [(4, "orders:4"), (5, "orders:5")]
    assert outbox.stream_state("orders") == StreamState("orders", frontier=3, checkpoint=5, pending=2)
    assert outbox.acknowledged("orders", "k") == b"payload 3"
    replacement = open_outbox(site)
    try:
        reoffered = replacement.drain("orders", lambda e: {"k": e.payload})
    finally:
        replacement.close()
    assert [e.event_id for e in reoffered] == ["orders:4", "orders:5"]  # identical pending ids, nothing delivered
    assert outbox.stream_state("orders") == StreamState("orders", frontier=5, checkpoint=5, pending=0)


def test_the_checkpoint_only_moves_forward(outbox: OutboxStore) -> None:
    outbox.stage("orders", events(1, 2, 9), 9, T0)
    outbox.stage("orders", events(10), 10, T0 + 1)
    # A stager behind: its checkpoint does not move the stored one back, as integers (10 > 9).
    behind = outbox.stage("orders", events(2, 9), 9, T0 + 2)
    assert [(e.seq, e.event_id) for e in behind] == [(2, "orders:2"), (3, "orders:9")]
    assert outbox.stream_state("orders") == StreamState("orders", frontier=0, checkpoint=10, pending=4)
    outbox.drain("orders", lambda e: {})
    assert outbox.stage("orders", [], 4, T0 + 3) == []
    assert outbox.stream_state("orders") == StreamState("orders", frontier=4, checkpoint=10, pending=0)
    with pytest.raises(ValueError, match="orders:12"):  # an event past its stage's checkpoint
        outbox.stage("orders", events(11, 12), 11, T0 + 4)
    assert outbox.stream_state("orders") == StreamState("orders", frontier=4, checkpoint=10, pending=0)


def _fence(execution: Execution) -> WriterFence:
    return execution.fence


def _open_exporter(journal: JournalStore, clock: ManualClock, holder: str) -> Execution:
    return open_execution(journal, "export:orders", "a" * 64, holder=holder, lease_s=30, clock=clock,
                          keeper=Keeper(clock, start=False))  # nothing renews behind the test's back


@pytest.mark.clause("run.export.writer-fenced")
def test_a_stale_stager_whose_lease_was_taken_over_stages_and_acknowledges_nothing(
        outbox: OutboxStore, site: JournalSite) -> None:
    mine, theirs = site.open(), site.open()
    try:
        clock = ManualClock()
        stale = _open_exporter(mine, clock, "exporter-1")
        with writing_as(_fence(stale)):  # the current writer stages
            outbox.stage("orders", events(1, 2), 2, T0)
        clock.advance(31)
        replacement = _open_exporter(theirs, clock, "exporter-2")  # the lease lapsed and was taken over
        refusals = []
        with pytest.raises(ExecutionWriterFenced) as staged, writing_as(_fence(stale)):
            outbox.stage("orders", events(1, 2, 3), 3, T0 + 1)
        refusals.append(staged.value)
        with pytest.raises(ExecutionWriterFenced) as acknowledged:
            outbox.acknowledge("orders", ["orders:1"], {"k": b"stale"}, fence=_fence(stale))
        refusals.append(acknowledged.value)
        for refusal in refusals:
            assert (refusal.execution, refusal.attempt, refusal.boundary) == (stale.execution_id, 1, PUBLICATION)
            assert "attempt 2 of exporter-2" in refusal.reason
        assert outbox.stream_state("orders") == StreamState("orders", frontier=0, checkpoint=2, pending=2)
        assert outbox.acknowledged("orders", "k") is None
        with writing_as(_fence(replacement)):  # the new holder carries the work on
            assert [e.event_id for e in outbox.drain("orders", lambda e: {"k": e.payload})] == ["orders:1", "orders:2"]
            assert [e.event_id for e in outbox.stage("orders", events(1, 2, 3), 3, T0 + 2)] == ["orders:3"]
        assert outbox.stream_state("orders") == StreamState("orders", frontier=2, checkpoint=3, pending=1)
    finally:
        mine.close_store()
        theirs.close_store()


@pytest.mark.postgres
def test_a_stage_rerun_after_its_commit_went_unheard_and_a_drain_delivered_it_stages_nothing(
        pg_dsn: str, pg_schema: str) -> None:
    outbox = open_outbox_store("postgres", dsn=pg_dsn, schema=pg_schema)
    with PgProxy(pg_dsn) as proxy:
        stager = open_outbox_store("postgres", dsn=proxy.dsn(), schema=pg_schema)
        try:
            # The stage commits on the server; its connection drops before the answer, and no
            # new one can learn the outcome.
            proxy.cut_after_commit(b"cf_outbox_events", then_refuse=True)
            with pytest.raises(CommitUnheard):
                stager.stage("orders", events(1, 2), 2, T0)
            assert proxy.fired.is_set()
            assert [e.event_id for e in outbox.drain("orders", lambda e: {})] == ["orders:1", "orders:2"]
            proxy.heal()
            assert stager.stage("orders", events(1, 2), 2, T0 + 1) == []  # the same request again
        finally:
            stager.close()
    try:
        assert outbox.pending("orders") == []
        assert outbox.stream_state("orders") == StreamState("orders", frontier=2, checkpoint=2, pending=0)
    finally:
        outbox.close()


@pytest.mark.postgres
def test_an_outbox_made_before_integer_checkpoints_is_brought_up_to_date(pg_dsn: str, pg_schema: str) -> None:
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the tables as they first shipped
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(f'SET search_path TO "{pg_schema}"')
        conn.execute("CREATE TABLE cf_outbox_streams (stream TEXT PRIMARY KEY, frontier BIGINT NOT NULL,"
                     " next_seq BIGINT NOT NULL, checkpoint TEXT)")
        conn.execute("CREATE TABLE cf_outbox_events (stream TEXT NOT NULL, seq BIGINT NOT NULL, event_id TEXT NOT NULL,"
                     " kind TEXT NOT NULL, payload BYTEA NOT NULL, staged_us BIGINT NOT NULL,"
                     " PRIMARY KEY (stream, event_id), UNIQUE (stream, seq))")
        conn.execute("INSERT INTO cf_outbox_streams VALUES ('orders', 1, 3, '10')")
        conn.execute("INSERT INTO cf_outbox_events VALUES ('orders', 2, 'orders:2', 'row-upsert', 'payload 2', %s)",
                     (T0,))
    outbox = open_outbox_store("postgres", dsn=pg_dsn, schema=pg_schema)
    try:
        assert outbox.stream_state("orders") == StreamState("orders", frontier=1, checkpoint=10, pending=1)
        assert [(e.seq, e.position, e.event_id) for e in outbox.pending("orders")] == [(2, 10, "orders:2")]
        outbox.stage("orders", events(9), 9, T0 + 1)  # compared as integers now: 9 is behind 10
        assert outbox.stream_state("orders").checkpoint == 10
    finally:
        outbox.close()
