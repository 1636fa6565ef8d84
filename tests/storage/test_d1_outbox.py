"""Export state under the D1 profile: outboxes, acknowledged keyed state and log checkpoints in D1.

The port's suite runs its d1 cases in tests/storage/test_outbox.py; this is ``run.export.d1-state``'s
own claim: what an exporter stages, acknowledges and checkpoints is committed in D1 (read back
here straight from D1 through the Worker), and a sink commit whose D1 acknowledgement never landed
— the sender killed between delivering and acknowledging — is offered again under the same
delivery identity by the replacement, before anything new.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.storage.d1.client import D1Binding
from contextful.storage.outbox import StreamState, open_outbox_store

from tests.storage.test_journal_conformance import JournalSite
from tests.storage.test_outbox import _line, _sender, killed_sender

pytestmark = pytest.mark.d1


@pytest.mark.clause("run.export.d1-state")
def test_a_sink_commit_without_its_d1_acknowledgement_is_reoffered_under_the_same_identity(
        d1_binding: D1Binding, tmp_path: Path) -> None:
    site = JournalSite("d1", d1_binding.url, d1_binding.namespace, d1_binding.token)
    sink = tmp_path / "destination.txt"
    staged = killed_sender(site, sink, 3, "--die-after-delivery")
    assert staged == ["orders:1", "orders:2", "orders:3"]
    assert sink.read_text().splitlines() == ["orders:1 payload 1"]  # the sink committed it

    client = d1_binding.client()  # what D1 holds: all three owed, the log staged through 3, nothing acknowledged
    assert client.query("SELECT event_id, position FROM cf_outbox_events WHERE stream = 'orders' ORDER BY seq") == [
        ("orders:1", 1), ("orders:2", 2), ("orders:3", 3)]
    assert client.query("SELECT frontier, checkpoint FROM cf_outbox_streams WHERE stream = 'orders'") == [(0, 3)]
    assert client.query("SELECT key FROM cf_outbox_state") == []

    replacement = _sender(site, sink, 4)
    try:
        reoffered = json.loads(_line(replacement, "reoffered"))
        restaged = json.loads(_line(replacement, "staged"))
        assert json.loads(_line(replacement, "done")) == 4
    finally:
        replacement.wait(120)
    assert replacement.returncode == 0
    assert reoffered == staged  # the delivered one first, under its identity, then the rest
    assert restaged == ["orders:4"]
    assert sink.read_text().splitlines() == ["orders:1 payload 1", "orders:1 payload 1", "orders:2 payload 2",
                                             "orders:3 payload 3", "orders:4 payload 4"]
    assert client.query("SELECT key, value, frontier FROM cf_outbox_state ORDER BY key") == [
        ("k0", b"payload 4", 4), ("k1", b"payload 3", 3)]
    outbox = open_outbox_store("d1", url=d1_binding.url, token=d1_binding.token, namespace=d1_binding.namespace)
    assert outbox.stream_state("orders") == StreamState("orders", frontier=4, checkpoint=4, pending=0)
