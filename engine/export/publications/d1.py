"""Publication state of the D1 profile: producer completions, the sender's group outbox and the
publication's durable lease, in D1 through the private Worker (``storage.d1.client``); the adapters
beside ``sqlite`` that :func:`~contextful.engine.export.publications.open_completions` and
:func:`~contextful.engine.export.publications.outbox.open_outbox` pick on a ``D1Catalog``.

Implements ``run.export.group-d1-state``, ``run.export.group-d1-lease``, the D1 half of
``run.export.group-storage`` and the state ``run.export.group-d1-recovery`` resumes from (decision
"d1-coordinated-groups": the sender's state machine stays, only its persistence changes; a batch's
first statement takes a fresh write token and each later statement predicates on it, so a lost race
changes no row). The rules are the SQLite adapters' (``engine.export.publications.sqlite``):

* ``cf_publication_completions``: one immutable row per producer run (triggers refuse UPDATE and
  DELETE); recording a run again keeps the first row and answers it.
* ``cf_publication_senders``: ONE versioned row per publication. It is the publication's durable
  lease (``holder``, ``expires_us``) and holds its promoted state: the active group, the ACTIVE
  NAMESPACE and the delivered producer frontier (the active group's next state).
* ``cf_publication_groups`` (a group's identity, binding its producer frontier, and how many of its
  events were acknowledged) and ``cf_publication_events`` (the staged events, immutable: a trigger
  refuses UPDATE and DELETE; a payload spans rows of at most :data:`PART_CHARS` characters, under
  D1's 2 MB row).

Every write (stage, acknowledge, and the promotion a completing acknowledgement carries) reads the
publication's row in one batch, decides in Python, and sends ONE batch whose first statement takes
a fresh write token on that row where it is still as read — the same version and this process as
the holder of the lease — bumping its version and renewing the lease; every later statement runs
only while the row holds that token, and the last says whether it did. Every write bumps the
version, so a row still as read means the groups and events are as read too; a writer that lost
its lease (another exporter took it once it expired, or once its holder was provably dead) changes
no row and raises ``ExecutionWriterFenced``. A completing acknowledgement (the group's last event)
and its promotion — active group, active namespace, delivered frontier — are one batch: both land
or neither does.

The lease is taken at the publication's first call (``export group``'s first is :meth:`pending`) by
this process's holder id (``storage.holders``) and released when the process exits; a live holder's
unexpired lease refuses another process (``ExecutionHeld``). A staged group whose identity and
events exceed :data:`STATE_BOUND` raises ``PublicationStorageUnsupported`` before anything is written.
"""

from __future__ import annotations

import atexit
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contextful.engine.export.publications import Completion
from contextful.engine.export.publications.identity import GroupIdentity
from contextful.engine.export.publications.outbox import GroupEvent, StagedGroup
from contextful.storage.clock import Clock
from contextful.storage.d1.client import D1Client, Statement
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import ExecutionHeld, ExecutionWriterFenced, PublicationStorageUnsupported
from contextful.storage.holders import Holder, default_holder, holder_is_dead

PROFILE = "cloudflare-d1"
STATE_BOUND = 8 * 1024 * 1024
"""The most bytes one group's sender state (its identity and staged events) may take in D1."""
PART_CHARS = 1_000_000
"""The longest piece of an event's payload one row holds (D1 refuses a row over 2,000,000 bytes)."""
LEASE_US = 30_000_000
"""How long the publication's lease outlives its holder's last write or take."""

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cf_publication_completions (
        run_id TEXT PRIMARY KEY, producer TEXT NOT NULL, recorded_us INTEGER NOT NULL, body TEXT NOT NULL)""",
    ("CREATE INDEX IF NOT EXISTS cf_publication_completions_producer "
     "ON cf_publication_completions (producer, recorded_us)"),
    """CREATE TRIGGER IF NOT EXISTS cf_publication_completions_immutable BEFORE UPDATE
        ON cf_publication_completions BEGIN SELECT RAISE(ABORT, 'a producer completion is immutable'); END""",
    """CREATE TRIGGER IF NOT EXISTS cf_publication_completions_kept BEFORE DELETE
        ON cf_publication_completions BEGIN SELECT RAISE(ABORT, 'a producer completion is immutable'); END""",
    """CREATE TABLE IF NOT EXISTS cf_publication_senders (
        publication TEXT PRIMARY KEY, version INTEGER NOT NULL, holder TEXT, taken_us INTEGER,
        expires_us INTEGER NOT NULL, active_group TEXT, active_namespace TEXT, frontier TEXT, write_token TEXT)""",
    """CREATE TABLE IF NOT EXISTS cf_publication_groups (
        group_id TEXT PRIMARY KEY, publication TEXT NOT NULL, sequence INTEGER NOT NULL, identity TEXT NOT NULL,
        events INTEGER NOT NULL, acknowledged INTEGER NOT NULL DEFAULT 0, UNIQUE (publication, sequence))""",
    """CREATE TABLE IF NOT EXISTS cf_publication_events (
        group_id TEXT NOT NULL, sequence INTEGER NOT NULL, part INTEGER NOT NULL, event_id TEXT NOT NULL,
        kind TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (group_id, sequence, part), UNIQUE (event_id, part))""",
    """CREATE TRIGGER IF NOT EXISTS cf_publication_events_immutable BEFORE UPDATE
        ON cf_publication_events BEGIN SELECT RAISE(ABORT, 'a staged event is immutable'); END""",
    """CREATE TRIGGER IF NOT EXISTS cf_publication_events_kept BEFORE DELETE
        ON cf_publication_events BEGIN SELECT RAISE(ABORT, 'a staged event is immutable'); END""",
)

_RECORD = ("INSERT INTO cf_publication_completions (run_id, producer, recorded_us, body) VALUES (?, ?, ?, ?) "
           "ON CONFLICT (run_id) DO NOTHING")
_SENDER = ("SELECT version, holder, taken_us, expires_us, active_group FROM cf_publication_senders "
           "WHERE publication = ?")
_NEW_SENDER = ("INSERT INTO cf_publication_senders (publication, version, expires_us) VALUES (?, 0, 0) "
               "ON CONFLICT (publication) DO NOTHING")
_TAKE = ("UPDATE cf_publication_senders SET write_token = ?, version = version + 1, holder = ?, taken_us = ?, "
         "expires_us = ? WHERE publication = ? AND version = ? AND holder IS ?")
_HELD = "EXISTS (SELECT 1 FROM cf_publication_senders WHERE publication = ? AND write_token = ?)"
_TOKEN_HELD = "SELECT COUNT(*) AS held FROM cf_publication_senders WHERE publication = ? AND write_token = ?"
_GROUP = "SELECT group_id, publication, identity, acknowledged, events FROM cf_publication_groups"
_GROUP_ID = "SELECT group_id FROM cf_publication_groups"
_EVENTS = ("SELECT sequence, part, event_id, kind, payload FROM cf_publication_events WHERE group_id = ({}) "
           "ORDER BY sequence, part")
_INSERT_GROUP = ("INSERT INTO cf_publication_groups (group_id, publication, sequence, identity, events) "
                 f"SELECT ?, ?, ?, ?, ? WHERE {_HELD}")
_INSERT_EVENT = ("INSERT INTO cf_publication_events (group_id, sequence, part, event_id, kind, payload) "
                 f"SELECT ?, ?, ?, ?, ?, ? WHERE {_HELD}")
_ACKNOWLEDGE = (f"UPDATE cf_publication_groups SET acknowledged = ? WHERE group_id = ? AND publication = ? "
                f"AND acknowledged = ? AND {_HELD}")
_ACKNOWLEDGED = "SELECT acknowledged, events, identity FROM cf_publication_groups WHERE group_id = ? AND publication = ?"
_PROMOTE = (f"UPDATE cf_publication_senders SET active_group = ?, active_namespace = ?, frontier = ? "
            f"WHERE publication = ? AND {_HELD}")
_RELEASE = ("UPDATE cf_publication_senders SET holder = NULL, expires_us = 0, version = version + 1 "
            "WHERE publication = ? AND holder = ?")


def _ensure_schema(client: D1Client) -> None:
    client.batch([(statement, ()) for statement in SCHEMA], rerun_unheard=True)


class D1Completions:
    """:class:`~contextful.engine.export.publications.CompletionStore` in D1."""

    def __init__(self, client: D1Client) -> None:
        self.client = client
        _ensure_schema(client)

    def record(self, completion: Completion) -> Completion:
        results = self.client.batch([
            (_RECORD, (completion.run_id, completion.producer, completion.recorded_us, completion.body())),
            ("SELECT body FROM cf_publication_completions WHERE run_id = ?", (completion.run_id,))],
            rerun_unheard=True)  # the insert does nothing on conflict: sent again, it finds its own row
        return Completion.from_json(json.loads(results[1].rows[0][0]))

    def latest(self, producer: str) -> Completion | None:
        rows = self.client.query("SELECT body FROM cf_publication_completions WHERE producer = ? "
                                 "ORDER BY recorded_us DESC, rowid DESC LIMIT 1", (producer,))
        return Completion.from_json(json.loads(rows[0][0])) if rows else None

    def of_run(self, run_id: str) -> Completion | None:
        rows = self.client.query("SELECT body FROM cf_publication_completions WHERE run_id = ?", (run_id,))
        return Completion.from_json(json.loads(rows[0][0])) if rows else None


@dataclass(frozen=True)
class _Sender:
    """The publication's row as one read saw it (a publication with no row yet: version 0, no holder)."""

    version: int
    holder: str | None
    taken_us: int | None
    expires_us: int
    active_group: str | None


Decide = Callable[["_Sender", list[Any]], "list[Statement] | None"]
"""A write's decision over the publication's row and its other reads: the writes (None: nothing to write)."""

_holder: tuple[int, str] | None = None
_taken: set[tuple[str, str]] = set()
"""``(binding, publication)`` of every lease this process took and has not released."""


def process_holder() -> str:
    """This process's holder id of publication leases (a forked child gets its own)."""
    global _holder
    import os

    if _holder is None or _holder[0] != os.getpid():
        _holder = (os.getpid(), default_holder())
    return _holder[1]


class D1GroupOutbox:
    """:class:`~contextful.engine.export.publications.outbox.GroupOutbox` in D1, each write under the
    publication's lease (see the module docstring)."""

    def __init__(self, client: D1Client, clock: Clock) -> None:
        self.client = client
        self.clock = clock
        self.holder = process_holder()
        _ensure_schema(client)

    # --- the lease ------------------------------------------------------------------------------

    def _key(self, publication: str) -> tuple[str, str]:
        return (self.client.backend, publication)

    def _read_sender(self, publication: str, reads: Sequence[Statement] = ()) -> tuple[_Sender, list[Any]]:
        results = self.client.batch([(_SENDER, (publication,)), *reads], write=False)
        row = results[0].rows[0] if results[0].rows else (0, None, None, 0, None)
        return _Sender(int(row[0]), row[1], row[2], int(row[3]), row[4]), [r.rows for r in results[1:]]

    def _admit(self, publication: str, sender: _Sender, now_us: int) -> None:
        """Refuse unless this process may write under ``sender``: it holds the lease, or the lease is
        free, expired or its holder provably dead and this process never held it since (a lease lost
        to another writer is ``ExecutionWriterFenced``; another live holder's is ``ExecutionHeld``)."""
        if sender.holder == self.holder:
            return
        if self._key(publication) in _taken:
            _taken.discard(self._key(publication))  # lost: the next call may take it afresh
            raise ExecutionWriterFenced(f"export group {publication}", sender.version, "the publication's D1 "
                                        "sender state", f"its lease passed to {sender.holder or 'no holder'}")
        if sender.holder is not None and sender.expires_us > now_us and not holder_is_dead(sender.holder):
            parsed = Holder.parse(sender.holder)
            raise ExecutionHeld(f"export group {publication}", f"publication {publication}", sender.holder,
                                parsed.host if parsed else None, parsed.pid if parsed else None, sender.taken_us,
                                sender.expires_us)

    def _swap(self, publication: str, sender: _Sender, writes: Sequence[Statement], now_us: int) -> bool:
        """Send ``writes`` (each predicated on the token: its last two parameters) behind the token's
        compare-and-swap on the publication's row as ``sender`` read it; whether they landed."""
        token = uuid.uuid4().hex
        taken_us = sender.taken_us if sender.holder == self.holder else now_us
        statements: list[Statement] = [
            (_NEW_SENDER, (publication,)),
            (_TAKE, (token, self.holder, taken_us, now_us + LEASE_US, publication, sender.version, sender.holder)),
            *[(sql, (*params, publication, token)) for sql, params in writes],
            (_TOKEN_HELD, (publication, token))]
        held = bool(self.client.batch(statements)[-1].rows[0][0])
        if held and self._key(publication) not in _taken:
            _taken.add(self._key(publication))
            atexit.register(self._release, publication)
        return held

    def _write(self, publication: str, decide: Decide, reads: Sequence[Statement] = ()) -> None:
        """Read the publication's row (and ``reads``) in one batch, ``decide(sender, rows)`` the writes,
        send them under the lease; again while another writer moved the row first."""
        unheard = 0
        while True:  # loops only while another writer moves the row between our read and our batch
            sender, rows = self._read_sender(publication, reads)
            now_us = self.clock.now_us()
            self._admit(publication, sender, now_us)
            writes = decide(sender, rows)
            if writes is None:
                return
            try:
                if self._swap(publication, sender, writes, now_us):
                    return
            except CommitUnheard:
                unheard += 1  # read again: a write that landed moved the version, and decides nothing twice
                if unheard == 2:
                    raise

    def hold(self, publication: str) -> None:
        """Take (or renew) the publication's lease for this process."""
        self._write(publication, lambda sender, rows: [])

    def _release(self, publication: str) -> None:
        if self._key(publication) in _taken:
            _taken.discard(self._key(publication))
            self.client.batch([(_RELEASE, (publication, self.holder))])

    # --- reads ----------------------------------------------------------------------------------

    def _group(self, where: str, args: tuple[Any, ...]) -> StagedGroup | None:
        which = f"WHERE {where} ORDER BY sequence DESC LIMIT 1"
        results = self.client.batch([(f"{_GROUP} {which}", args), (_EVENTS.format(f"{_GROUP_ID} {which}"), args)],
                                    write=False)
        if not results[0].rows:
            return None
        _group_id, publication, identity, acknowledged, _events = results[0].rows[0]
        return StagedGroup(publication, GroupIdentity.from_json(json.loads(identity)), _joined(results[1].rows),
                           int(acknowledged))

    def pending(self, publication: str) -> StagedGroup | None:
        self.hold(publication)
        return self._group("publication = ? AND acknowledged < events", (publication,))

    def last_acknowledged(self, publication: str) -> StagedGroup | None:
        sender, _ = self._read_sender(publication)
        return None if sender.active_group is None else self._group("group_id = ?", (sender.active_group,))

    # --- writes ---------------------------------------------------------------------------------

    def stage(self, publication: str, identity: GroupIdentity, events: tuple[GroupEvent, ...]) -> StagedGroup:
        group_id = identity.group_id
        identity_text = json.dumps(identity.to_json(), sort_keys=True)
        size = len(identity_text.encode()) + sum(len(e.payload.encode()) + len(e.event_id) for e in events)
        if size > STATE_BOUND:
            raise PublicationStorageUnsupported(publication, PROFILE, f"group {identity.order}'s sender state "
                                                f"would take {size} bytes in D1, over its bound of {STATE_BOUND} "
                                                "bytes (8 MiB)")

        def decide(sender: _Sender, rows: list[Any]) -> list[Statement] | None:
            if rows[0]:
                return None  # staged before: a staged group keeps what was staged
            writes: list[Statement] = [(_INSERT_GROUP, (group_id, publication, identity.order, identity_text,
                                                        len(events)))]
            for event in events:  # bounded by the group's members, each payload by the bound above
                for part, start in enumerate(range(0, max(len(event.payload), 1), PART_CHARS)):
                    writes.append((_INSERT_EVENT, (group_id, event.sequence, part, event.event_id, event.kind,
                                                   event.payload[start:start + PART_CHARS])))
            return writes

        self._write(publication, decide, [("SELECT 1 FROM cf_publication_groups WHERE group_id = ?", (group_id,))])
        staged = self._group("group_id = ?", (group_id,))
        assert staged is not None
        return staged

    def acknowledge(self, publication: str, group_id: str, sequence: int) -> None:
        def decide(sender: _Sender, rows: list[Any]) -> list[Statement] | None:
            if not rows[0] or int(rows[0][0][0]) != sequence:
                return None  # not the next in order (acknowledged already): nothing to record
            acknowledged, events, identity = int(rows[0][0][0]) + 1, int(rows[0][0][1]), rows[0][0][2]
            writes: list[Statement] = [(_ACKNOWLEDGE, (acknowledged, group_id, publication, sequence))]
            if acknowledged == events:  # the completing acknowledgement carries the promotion
                promoted = GroupIdentity.from_json(json.loads(identity))
                writes.append((_PROMOTE, (group_id, promoted.namespace,
                                          json.dumps(promoted.next_state, sort_keys=True), publication)))
            return writes

        self._write(publication, decide, [(_ACKNOWLEDGED, (group_id, publication))])


def _joined(rows: list[tuple[Any, ...]]) -> tuple[GroupEvent, ...]:
    """The events of a group's rows (by sequence, then part), each payload's parts joined."""
    events: list[GroupEvent] = []
    for sequence, part, event_id, kind, payload in rows:  # bounded by one group's events and parts
        if int(part) == 0:
            events.append(GroupEvent(event_id, int(sequence), kind, payload))
        else:
            last = events[-1]
            events[-1] = GroupEvent(last.event_id, last.sequence, last.kind, last.payload + payload)
    return tuple(events)
