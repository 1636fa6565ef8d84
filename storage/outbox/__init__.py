"""The outbox port: typed outboxes, acknowledged keyed state and log checkpoints of an exporter.

Implements ``run.export.remote-state`` (decision "disposable-execution-state": a disposable disk
loses pending exports, so they live in the one remote execution database). An exporter reads a
log (a table's commits, a run's rows), turns what it read into events for a destination and stages
them here before it delivers anything:

* **Typed outbox**: per stream, events ``(event_id, kind, payload)`` in staging order. An
  ``event_id`` is the exporter's stable name for an event (derived from the log position and key it
  came from), so staging it again keeps the first payload and its place.
* **Log checkpoint**: the log position the stream has staged through, advanced in the same
  transaction as the events staged from it, so a replacement resumes reading the log after it and
  never stages what was staged before.
* **Acknowledged frontier and keyed state**: :meth:`OutboxStore.acknowledge` takes delivered events
  only as the oldest pending ones, in order, and with them, atomically, the keyed state the
  destination acknowledged (its version of each key). The frontier is the newest acknowledged
  event's staging number. A replacement process therefore reoffers exactly the pending event ids
  (:meth:`OutboxStore.pending`, same ids, same payloads) before its frontier can advance:
  acknowledging anything past a pending event raises ``OutboxFrontierGap``.

Acknowledged events are deleted with their acknowledgement (the frontier and keyed state keep what
a replacement needs), so the outbox holds only what is still owed. Adapters: ``postgres`` (the
container profile's execution database). A profile without an adapter has no supported outbox:
:func:`open_outbox_store` raises ``StorageCapabilityMissing`` (``run.journal.storage-incomplete``).
The coordinated publication groups of a later issue attach here (a group stages its members'
events in one stream and acknowledges them together).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

PROFILES = ("postgres",)


@dataclass(frozen=True)
class OutboxEvent:
    stream: str
    seq: int
    """Staging order within the stream (1, 2, …), assigned when the event is first staged."""
    event_id: str
    kind: str
    """The event's type (``iceberg-commit``, ``webhook``, …): what its payload is and who reads it."""
    payload: bytes
    staged_us: int


@dataclass(frozen=True)
class StreamState:
    stream: str
    frontier: int
    """The newest acknowledged event's ``seq`` (0: none); every event at or below it was delivered."""
    checkpoint: str | None
    """The log position staged through (the exporter's own text: a commit_seq, an offset…)."""
    pending: int
    """Events staged and not yet acknowledged."""


class OutboxStore(ABC):
    @abstractmethod
    def stage(self, stream: str, events: Sequence[tuple[str, str, bytes]], checkpoint: str | None,
              now_us: int) -> list[OutboxEvent]:
        """Stage ``(event_id, kind, payload)`` events and advance the stream's log checkpoint to
        ``checkpoint`` (unchanged when None), all in one transaction; return the stored events in
        the order given. An id already pending keeps its first payload and seq."""

    @abstractmethod
    def pending(self, stream: str) -> list[OutboxEvent]:
        """The stream's staged, unacknowledged events, oldest first: what a (replacement) sender offers."""

    @abstractmethod
    def acknowledge(self, stream: str, event_ids: Sequence[str], state: Mapping[str, bytes]) -> int:
        """Acknowledge ``event_ids`` — which must be the oldest pending events, in order
        (``OutboxFrontierGap`` otherwise, nothing changed) — and record ``state`` (key → the
        destination's acknowledged value) with them in one transaction; return the new frontier."""

    @abstractmethod
    def stream_state(self, stream: str) -> StreamState:
        """The stream's frontier, log checkpoint and pending count."""

    @abstractmethod
    def acknowledged(self, stream: str, key: str) -> bytes | None:
        """The acknowledged state of ``key`` (None: never acknowledged)."""

    def close(self) -> None:
        """Release connections (an adapter with none keeps this no-op)."""

    def drain(self, stream: str, send: Callable[[OutboxEvent], Mapping[str, bytes]], *,
              dispatch: Callable[[], AbstractContextManager[object]] | None = None,
              publish: Callable[[], AbstractContextManager[object]] | None = None) -> list[OutboxEvent]:
        """Offer every pending event to ``send``, oldest first, acknowledging each (with the keyed
        state ``send`` returns) once it returned: what a sender runs first, and what a replacement
        runs before it stages anything new, so it reoffers exactly the ids its predecessor left
        pending. An exception from ``send`` leaves that event and the later ones pending.

        ``dispatch`` and ``publish`` are the sender's admission (``engine.run.dispatch``): each
        ``send`` runs inside ``dispatch()`` and each acknowledgement inside ``publish()``, so a
        writer whose lease transferred is fenced before either (``run.export.writer-fenced``).
        """
        delivered = []
        for event in self.pending(stream):  # bounded by what is owed
            with dispatch() if dispatch is not None else nullcontext():
                state = send(event)
            with publish() if publish is not None else nullcontext():
                self.acknowledge(stream, [event.event_id], state)
            delivered.append(event)
        return delivered


def open_outbox_store(profile: str, **kwargs: object) -> OutboxStore:
    """``postgres`` (dsn=…, schema=…); any other profile has no supported outbox."""
    if profile == "postgres":
        from contextful.storage.outbox.postgres import PostgresOutboxStore

        return PostgresOutboxStore(str(kwargs.get("dsn", "")), str(kwargs.get("schema", "contextful")))
    from contextful.storage.errors import StorageCapabilityMissing

    raise StorageCapabilityMissing(profile, (f"a supported outbox (adapters: {', '.join(PROFILES)})",))
