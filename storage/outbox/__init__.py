"""The outbox port: typed outboxes, acknowledged keyed state and log checkpoints of an exporter.

Implements ``run.export.remote-state`` (decision "disposable-execution-state": a disposable disk
loses pending exports, so they live in the one remote execution database) and the outbox side of
``run.export.writer-fenced``. An exporter reads a log (a table's commits, a run's rows), turns
what it read into events for a destination and stages them here before it delivers anything:

* **Typed outbox**: per stream, events ``(position, event_id, kind, payload)`` in staging order.
  ``position`` is the log position the event was read from (an integer: a commit_seq, an offset, a
  group's sequence); ``event_id`` is the exporter's stable name for the event (derived from that
  position and the key it came from, so one id names one position). Staging a pending id again
  keeps its first payload and place.
* **Log checkpoint**: the log position the stream has staged through, an integer advanced in the
  same transaction as the events staged from it, so a replacement resumes reading the log after
  it and never stages what was staged before. It only moves forward: a stage whose checkpoint is
  at or behind the stored one leaves it where it is (positions compare as integers).
* **Acknowledged frontier and keyed state**: :meth:`OutboxStore.acknowledge` takes delivered events
  only as the oldest pending ones, in order, and with them, atomically, the keyed state the
  destination acknowledged (its version of each key). The frontier is the newest acknowledged
  event's staging number. A replacement process therefore reoffers exactly the pending event ids
  (:meth:`OutboxStore.pending`, same ids, same payloads) before its frontier can advance:
  acknowledging anything past a pending event raises ``OutboxFrontierGap``.

**Nothing delivered becomes pending again.** Acknowledged events are deleted with their
acknowledgement, and no tombstone of their ids is kept: the checkpoint is the staging frontier.
Every event of a stage comes from a position at or below that stage's checkpoint (``ValueError``
otherwise, before anything is written), and the checkpoint moves with the events in one
transaction, so every event from a position at or below the stored checkpoint has been staged
already: it is either still pending (it keeps its payload and place) or was acknowledged, and then
it is staged no more. A stale stager (it read an older checkpoint) or a stage rerun after its
``COMMIT`` went unheard while a drain acknowledged what it had staged therefore stages nothing for
what was delivered, and what it read beyond the stored checkpoint is staged as new. The outbox
thus holds only what is still owed, plus one row per stream; nothing grows with history. The
price is the contract above: a stage covers whole positions (a position's events are staged
together, with a checkpoint at or past it), and an event id is never reused at another position.

:meth:`OutboxStore.stage` returns the events now pending for what it was given, in the order
given; an event already acknowledged is omitted (nothing is owed for it), so a rerun that finds
its events delivered returns fewer, or none.

**Fencing.** Staging and acknowledging are state publications of the execution that exports: each
takes the writer's :class:`~contextful.storage.fence.WriterFence` (default
:func:`~contextful.storage.fence.current_fence`, the one :func:`~contextful.storage.fence.writing_as`
names) and, when there is one, reads its owner row in ``cf_journal_owners`` (the same schema) in
the staging or acknowledging transaction itself, shared-locked, so a takeover's write of that row
waits for the transaction; an attempt whose lease another holder took over writes nothing and
raises ``ExecutionWriterFenced``.

Adapters: ``postgres`` (the container profile's execution database) and ``d1`` (the D1 profile's
database, through its Worker: ``run.export.d1-state``). A profile without an adapter
has no supported outbox: :func:`open_outbox_store` raises ``StorageCapabilityMissing``
(``run.journal.storage-incomplete``). The coordinated publication groups of a later issue attach
here (a group stages its members' events in one stream and acknowledges them together).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from contextful.storage.fence import WriterFence, current_fence

PROFILES = ("postgres", "d1")

Staged = tuple[int, str, str, bytes]
"""What an exporter stages: ``(position, event_id, kind, payload)``."""


@dataclass(frozen=True)
class OutboxEvent:
    stream: str
    seq: int
    """Staging order within the stream (1, 2, …), assigned when the event is first staged."""
    position: int
    """The log position the event was read from (at or below the checkpoint it was staged with)."""
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
    checkpoint: int | None
    """The log position staged through (None: nothing staged yet)."""
    pending: int
    """Events staged and not yet acknowledged."""


class OutboxStore(ABC):
    def stage(self, stream: str, events: Sequence[Staged], checkpoint: int, now_us: int, *,
              fence: WriterFence | None = None) -> list[OutboxEvent]:
        """Stage ``(position, event_id, kind, payload)`` events read from the log through
        ``checkpoint`` and advance the stream's checkpoint to it unless it is already at or past
        it, all in one transaction, fenced by ``fence`` (default :func:`current_fence`); return the
        events now pending for those given, in the order given (an acknowledged one is omitted).

        An id already pending keeps its first payload, position and seq; an event from a position
        at or below the stored checkpoint that is no longer pending was acknowledged and is not
        staged again. Raises ``ValueError`` for an event past ``checkpoint`` (nothing written) and
        ``ExecutionWriterFenced`` when ``fence``'s attempt no longer owns its execution (nothing
        written)."""
        beyond = [event_id for position, event_id, _, _ in events if position > checkpoint]
        if beyond:
            raise ValueError(f"outbox stream {stream!r}: {', '.join(beyond)} come from past the stage's"
                             f" checkpoint {checkpoint}")
        return self._stage(stream, list(events), checkpoint, now_us, fence if fence is not None else current_fence())

    @abstractmethod
    def _stage(self, stream: str, events: list[Staged], checkpoint: int, now_us: int,
               fence: WriterFence | None) -> list[OutboxEvent]:
        """:meth:`stage`, its arguments checked and its fence resolved."""

    @abstractmethod
    def pending(self, stream: str) -> list[OutboxEvent]:
        """The stream's staged, unacknowledged events, oldest first: what a (replacement) sender offers."""

    def acknowledge(self, stream: str, event_ids: Sequence[str], state: Mapping[str, bytes], *,
                    fence: WriterFence | None = None) -> int:
        """Acknowledge ``event_ids`` — which must be the oldest pending events, in order
        (``OutboxFrontierGap`` otherwise, nothing changed) — and record ``state`` (key → the
        destination's acknowledged value) with them in one transaction, fenced by ``fence``
        (default :func:`current_fence`; ``ExecutionWriterFenced``, nothing changed); return the
        new frontier."""
        return self._acknowledge(stream, list(event_ids), state, fence if fence is not None else current_fence())

    @abstractmethod
    def _acknowledge(self, stream: str, event_ids: list[str], state: Mapping[str, bytes],
                     fence: WriterFence | None) -> int:
        """:meth:`acknowledge`, its fence resolved."""

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
              publish: Callable[[], AbstractContextManager[object]] | None = None,
              fence: WriterFence | None = None) -> list[OutboxEvent]:
        """Offer every pending event to ``send``, oldest first, acknowledging each (with the keyed
        state ``send`` returns) once it returned: what a sender runs first, and what a replacement
        runs before it stages anything new, so it reoffers exactly the ids its predecessor left
        pending. An exception from ``send`` leaves that event and the later ones pending.

        ``dispatch`` and ``publish`` are the sender's admission (``engine.run.dispatch``): each
        ``send`` runs inside ``dispatch()`` and each acknowledgement inside ``publish()``, so a
        writer whose lease transferred is fenced before either (``run.export.writer-fenced``).
        Each acknowledgement is also fenced by ``fence`` (default :func:`current_fence`) in its
        own transaction.
        """
        delivered = []
        for event in self.pending(stream):  # bounded by what is owed
            with dispatch() if dispatch is not None else nullcontext():
                state = send(event)
            with publish() if publish is not None else nullcontext():
                self.acknowledge(stream, [event.event_id], state, fence=fence)
            delivered.append(event)
        return delivered


def open_outbox_store(profile: str, **kwargs: object) -> OutboxStore:
    """``postgres`` (dsn=…, schema=…) or ``d1`` (url=…, token=…, namespace=…); any other profile has no
    supported outbox."""
    if profile == "postgres":
        from contextful.storage.outbox.postgres import PostgresOutboxStore

        return PostgresOutboxStore(str(kwargs.get("dsn", "")), str(kwargs.get("schema", "contextful")))
    if profile == "d1":
        from contextful.storage.d1.client import D1Client
        from contextful.storage.d1.outbox import D1OutboxStore

        return D1OutboxStore(D1Client.from_arguments(kwargs))
    from contextful.storage.errors import StorageCapabilityMissing

    raise StorageCapabilityMissing(profile, (f"a supported outbox (adapters: {', '.join(PROFILES)})",))
