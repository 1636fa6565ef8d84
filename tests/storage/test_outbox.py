"""The outbox port (``storage.outbox``) on the execution database: typed outboxes, acknowledged
keyed state and log checkpoints, and a replacement process that reoffers its killed predecessor's
pending event ids before its acknowledged frontier advances (``run.export.remote-state``).

The PostgreSQL adapter runs on the session's real server, a fresh schema per test; the
replacement is a real child process after a SIGKILL (``tests.storage.outbox_sender``).
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
from contextful.storage.errors import OutboxFrontierGap
from contextful.storage.outbox import OutboxStore, StreamState, open_outbox_store

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000_000_000


@pytest.fixture
def outbox(pg_dsn: str, pg_schema: str) -> Iterator[OutboxStore]:
    store = open_outbox_store("postgres", dsn=pg_dsn, schema=pg_schema)
    yield store
    store.close()


def events(*positions: int) -> list[tuple[str, str, bytes]]:
    return [(f"orders:{p}", "row-upsert", f"payload {p}".encode()) for p in positions]


@pytest.mark.clause("run.export.remote-state")
def test_staged_events_checkpoint_and_keyed_state_live_in_the_execution_database(
        outbox: OutboxStore, pg_dsn: str, pg_schema: str) -> None:
    staged = outbox.stage("orders", events(1, 2, 3), "3", T0)
    assert [(e.seq, e.event_id, e.kind) for e in staged] == [(1, "orders:1", "row-upsert"), (2, "orders:2", "row-upsert"),
                                                             (3, "orders:3", "row-upsert")]
    # Staging an id again keeps its first payload and place; the checkpoint moves only when given.
    again = outbox.stage("orders", [("orders:2", "row-upsert", b"other"), *events(4)], None, T0 + 1)
    assert [(e.seq, e.payload) for e in again] == [(2, b"payload 2"), (4, b"payload 4")]
    other = open_outbox_store("postgres", dsn=pg_dsn, schema=pg_schema)  # another connection sees it all
    try:
        assert other.stream_state("orders") == StreamState("orders", frontier=0, checkpoint="3", pending=4)
        assert other.acknowledge("orders", ["orders:1", "orders:2"], {"order 7": b"v2"}) == 2
        assert [e.event_id for e in outbox.pending("orders")] == ["orders:3", "orders:4"]
        assert outbox.acknowledged("orders", "order 7") == b"v2"
        assert outbox.acknowledged("orders", "order 8") is None
        assert outbox.stream_state("orders") == StreamState("orders", frontier=2, checkpoint="3", pending=2)
    finally:
        other.close()


@pytest.mark.clause("run.export.remote-state")
def test_the_frontier_never_advances_past_a_pending_event(outbox: OutboxStore) -> None:
    outbox.stage("orders", events(1, 2, 3), "3", T0)
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
    assert outbox.stream_state("orders") == StreamState("orders", frontier=3, checkpoint="3", pending=0)
    assert outbox.acknowledged("orders", "k") == b"payload 3"


def _sender(pg_dsn: str, pg_schema: str, sink: Path, log_end: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.storage.outbox_sender", pg_dsn, pg_schema, "orders",
                             str(sink), str(log_end), *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parents[2], env=os.environ.copy())


def _line(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(word + " ") or line.strip() == word, f"expected {word!r}, got {line!r}"
    return line[len(word):].strip()


@pytest.mark.clause("run.export.remote-state")
def test_a_replacement_reoffers_the_killed_senders_pending_ids_first(outbox: OutboxStore, pg_dsn: str,
                                                                     pg_schema: str, tmp_path: Path) -> None:
    sink = tmp_path / "destination.txt"
    first = _sender(pg_dsn, pg_schema, sink, 4, "--die-after-staging")
    try:
        assert json.loads(_line(first, "reoffered")) == []
        staged = json.loads(_line(first, "staged"))
        _line(first, "ready")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(60)
    assert staged == ["orders:1", "orders:2", "orders:3", "orders:4"]
    pending = [e.event_id for e in outbox.pending("orders")]
    assert pending == staged[1:]  # the first was delivered and acknowledged before the kill
    assert outbox.stream_state("orders") == StreamState("orders", frontier=1, checkpoint="4", pending=3)

    replacement = _sender(pg_dsn, pg_schema, sink, 6)
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
