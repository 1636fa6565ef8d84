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

Every write (stage, restore, acknowledge, and the promotion a completing acknowledgement carries)
reads the publication's row in one batch, decides in Python, and sends ONE batch whose first statement takes
a fresh write token on that row where it is still as read — the same version and this process as
the holder of the lease — bumping its version and renewing the lease; every later statement runs
only while the row holds that token, and the last says whether it did. Every write bumps the
version, so a row still as read means the groups and events are as read too; a writer that lost
its lease (another exporter took it once it expired, or once its holder was provably dead) changes
no row and raises ``ExecutionWriterFenced``. A completing acknowledgement (the group's last event)
and its promotion — active group, active namespace, delivered frontier — are one batch: both land
or neither does.

The lease IS the publication's exclusive hold (:class:`D1Holds`, the D1 adapter of
``engine.export.publications.holds``): the outbox of the process that took the hold writes as its
holder. Where none was taken, the outbox takes the lease itself at the publication's first call
(``export group``'s first is :meth:`pending`) under this process's holder id (``storage.holders``)
and releases it when the process exits; a live holder's unexpired lease refuses another process
(``ExecutionHeld``). Serve units' shared claims are rows of ``cf_publication_claims``.

A group whose identity and events exceed :data:`STATE_BOUND` raises ``PublicationStorageUnsupported``
before anything is written. ``stage`` and ``restore`` place a group at the publication's next
staging position; ``restore`` raises a held group's acknowledged count to the larger one.
"""

from __future__ import annotations

import atexit
import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contextful.engine.export.publications import Completion
from contextful.engine.export.publications.holds import EXCLUSIVE, SHARED, Hold, holder_dead
from contextful.engine.export.publications.identity import GroupIdentity
from contextful.engine.export.publications.outbox import GroupEvent, StagedGroup
from contextful.storage.clock import Clock
from contextful.storage.d1.client import D1Client, Statement
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import (
    CatalogUnavailable,
    ExecutionHeld,
    ExecutionWriterFenced,
    PublicationStorageUnsupported,
)
from contextful.storage.holders import Holder, default_holder

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
    """CREATE TABLE IF NOT EXISTS cf_publication_claims (
        publication TEXT NOT NULL, holder TEXT NOT NULL, version INTEGER NOT NULL, expires_us INTEGER NOT NULL,
        PRIMARY KEY (publication, holder))""",
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
_INSERT_GROUP = ("INSERT INTO cf_publication_groups (group_id, publication, sequence, identity, events, acknowledged) "
                 f"SELECT ?, ?, ?, ?, ?, ? WHERE {_HELD}")
_PUBLICATION_EVENTS = ("SELECT e.group_id, e.sequence, e.part, e.event_id, e.kind, e.payload FROM cf_publication_events e "
                       "JOIN cf_publication_groups g ON g.group_id = e.group_id WHERE g.publication = ? "
                       "ORDER BY g.sequence, e.sequence, e.part")
_POSITIONS = ("SELECT (SELECT COALESCE(MAX(sequence), 0) FROM cf_publication_groups WHERE publication = ?) AS last, "
              "(SELECT g.sequence FROM cf_publication_groups g JOIN cf_publication_senders s "
              "ON s.active_group = g.group_id WHERE s.publication = ?) AS active")
_RESTORE_ACKNOWLEDGED = ("UPDATE cf_publication_groups SET acknowledged = ? WHERE group_id = ? AND publication = ? "
                         f"AND {_HELD}")
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
_leases: dict[tuple[str, str], str] = {}
"""``(binding, publication)`` -> the holder under which this process took that publication's lease
(its exclusive hold, :class:`D1Holds`, or the outbox's own take) and has not released it: every
outbox write of this process is that holder's."""


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

    def _writer(self, publication: str) -> str:
        """Who this process writes the publication as: the holder of the lease it took (its
        exclusive hold), else its own holder id."""
        return _leases.get(self._key(publication), self.holder)

    def _admit(self, publication: str, sender: _Sender, now_us: int) -> None:
        """Refuse unless this process may write under ``sender``: it holds the lease, or the lease is
        free, expired or its holder provably dead and this process never held it since (a lease lost
        to another writer is ``ExecutionWriterFenced``; another live holder's is ``ExecutionHeld``)."""
        if sender.holder == self._writer(publication):
            return
        if _leases.pop(self._key(publication), None) is not None:  # lost: the next call may take it afresh
            raise ExecutionWriterFenced(f"export group {publication}", sender.version, "the publication's D1 "
                                        "sender state", f"its lease passed to {sender.holder or 'no holder'}")
        if sender.holder is not None and sender.expires_us > now_us and not holder_dead(sender.holder):
            parsed = Holder.parse(sender.holder)
            raise ExecutionHeld(f"export group {publication}", f"publication {publication}", sender.holder,
                                parsed.host if parsed else None, parsed.pid if parsed else None, sender.taken_us,
                                sender.expires_us)

    def _swap(self, publication: str, sender: _Sender, writes: Sequence[Statement], now_us: int) -> bool:
        """Send ``writes`` (each predicated on the token: its last two parameters) behind the token's
        compare-and-swap on the publication's row as ``sender`` read it; whether they landed."""
        token, writer = uuid.uuid4().hex, self._writer(publication)
        taken_us = sender.taken_us if sender.holder == writer else now_us
        statements: list[Statement] = [
            (_NEW_SENDER, (publication,)),
            (_TAKE, (token, writer, taken_us, now_us + LEASE_US, publication, sender.version, sender.holder)),
            *[(sql, (*params, publication, token)) for sql, params in writes],
            (_TOKEN_HELD, (publication, token))]
        held = bool(self.client.batch(statements)[-1].rows[0][0])
        if held and self._key(publication) not in _leases:  # its own take: released when the process exits
            _leases[self._key(publication)] = writer
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
        """Take (or renew) the publication's lease for this process (under its exclusive hold's
        holder when it took one)."""
        self._write(publication, lambda sender, rows: [])

    def _release(self, publication: str) -> None:
        if _leases.get(self._key(publication)) == self.holder:
            del _leases[self._key(publication)]
            try:
                self.client.batch([(_RELEASE, (publication, self.holder))])
            except (CatalogUnavailable, CommitUnheard):
                pass  # at exit, with the Worker gone: the lease lapses by itself after LEASE_US

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
        return self._put(publication, identity, events, 0)

    def restore(self, publication: str, group: StagedGroup) -> StagedGroup:
        return self._put(publication, group.identity, group.events, group.acknowledged)

    def _put(self, publication: str, identity: GroupIdentity, events: tuple[GroupEvent, ...],
             acknowledged: int) -> StagedGroup:
        """Stage a group at the publication's next staging position, ``acknowledged`` of its events
        acknowledged; a group held already keeps its events and takes the larger acknowledged count.
        A group wholly acknowledged here and staged after the active group is promoted in the same batch."""
        group_id = identity.group_id
        identity_text = json.dumps(identity.to_json(), sort_keys=True)
        size = len(identity_text.encode()) + sum(len(e.payload.encode()) + len(e.event_id) for e in events)
        if size > STATE_BOUND:
            raise PublicationStorageUnsupported(publication, PROFILE, f"group {identity.order}'s sender state "
                                                f"would take {size} bytes in D1, over its bound of {STATE_BOUND} "
                                                "bytes (8 MiB)")

        def decide(sender: _Sender, rows: list[Any]) -> list[Statement] | None:
            held, ((last, active),) = rows[0][0] if rows[0] else None, rows[1]
            writes: list[Statement] = []
            if held is None:
                position = int(last) + 1
                writes.append((_INSERT_GROUP, (group_id, publication, position, identity_text, len(events),
                                               acknowledged)))
                for event in events:  # bounded by the group's members, each payload by the bound above
                    for part, start in enumerate(range(0, max(len(event.payload), 1), PART_CHARS)):
                        writes.append((_INSERT_EVENT, (group_id, event.sequence, part, event.event_id, event.kind,
                                                       event.payload[start:start + PART_CHARS])))
            else:
                position = int(held[0])
                if acknowledged <= int(held[1]):
                    return None  # staged before, acknowledged as far: a staged group keeps what was staged
                writes.append((_RESTORE_ACKNOWLEDGED, (acknowledged, group_id, publication)))
            if acknowledged == len(events) and (active is None or position > int(active)):
                writes.append(_promotion(publication, group_id, identity))
            return writes

        self._write(publication, decide, [
            ("SELECT sequence, acknowledged FROM cf_publication_groups WHERE group_id = ?", (group_id,)),
            (_POSITIONS, (publication, publication))])
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
                writes.append(_promotion(publication, group_id, GroupIdentity.from_json(json.loads(identity))))
            return writes

        self._write(publication, decide, [(_ACKNOWLEDGED, (group_id, publication))])

    def groups(self, publication: str) -> tuple[StagedGroup, ...]:
        results = self.client.batch([
            (f"{_GROUP} WHERE publication = ? ORDER BY sequence", (publication,)),
            (_PUBLICATION_EVENTS, (publication,))], write=False)
        events: dict[str, list[tuple[Any, ...]]] = {}
        for row in results[1].rows:  # bounded by the publication's staged events
            events.setdefault(row[0], []).append(row[1:])
        return tuple(StagedGroup(publication, GroupIdentity.from_json(json.loads(identity)),
                                 _joined(events.get(group_id, [])), int(acknowledged))
                     for group_id, _publication, identity, acknowledged, _events in results[0].rows)


def _promotion(publication: str, group_id: str, identity: GroupIdentity) -> Statement:
    """The statement promoting a wholly acknowledged group: active group, namespace and delivered frontier."""
    return (_PROMOTE, (group_id, identity.namespace, json.dumps(identity.next_state, sort_keys=True), publication))


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


class D1Holds:
    """:class:`~contextful.engine.export.publications.holds.PublicationHolds` in D1. The exclusive
    hold IS the publication's lease on its ``cf_publication_senders`` row (taken where the row is
    still as read: its version and holder), so every outbox write of the holding process predicates
    on it; shared claims are rows of ``cf_publication_claims``, taken all or none in one batch while
    every claimed publication's row is still as read (no unexpired exclusive hold of another holder)."""

    def __init__(self, client: D1Client, clock: Clock) -> None:
        self.client = client
        self.clock = clock
        _ensure_schema(client)

    def _standing(self, publications: Sequence[str], holder: str, now_us: int) -> tuple[
            tuple[Hold, ...], list[tuple[Any, ...]]]:
        """The unexpired exclusive holds of other live holders on ``publications``, and the rows read."""
        marks = ", ".join("?" for _ in publications)
        rows = self.client.query(f"SELECT publication, version, holder, expires_us FROM cf_publication_senders "
                                 f"WHERE publication IN ({marks}) ORDER BY publication", tuple(publications))
        return tuple(Hold(p, h, EXCLUSIVE, int(v), int(e)) for p, v, h, e in rows
                     if h is not None and h != holder and int(e) > now_us and not holder_dead(h)), rows

    def hold_exclusive(self, publication: str, holder: str, lease_s: float) -> Hold | None:
        while True:  # loops only while another writer moves the row between our read and our batch
            now_us = self.clock.now_us()
            refused, rows = self._standing((publication,), holder, now_us)
            if refused:
                return None
            version, was, taken_us = (int(rows[0][1]), rows[0][2], None) if rows else (0, None, None)
            if was == holder:
                taken_us = self.client.query("SELECT taken_us FROM cf_publication_senders WHERE publication = ?",
                                             (publication,))[0][0]
            expires_us = now_us + int(lease_s * 1_000_000)
            results = self.client.batch([
                (_NEW_SENDER, (publication,)),
                (("UPDATE cf_publication_senders SET version = version + 1, holder = ?, taken_us = ?, expires_us = ? "
                 "WHERE publication = ? AND version = ? AND holder IS ?"),
                 (holder, taken_us if taken_us is not None else now_us, expires_us, publication, version, was))])
            if results[1].changes:
                _leases[(self.client.backend, publication)] = holder
                return Hold(publication, holder, EXCLUSIVE, version + 1, expires_us)

    def claim_shared(self, publications: Sequence[str], holder: str, lease_s: float) -> tuple[Hold, ...]:
        names = sorted(set(publications))
        if not names:
            return ()
        while True:  # loops only while an exclusive take moves a row between our read and our batch
            now_us = self.clock.now_us()
            refused, rows = self._standing(names, holder, now_us)
            if refused:
                return refused
            read = {row[0]: int(row[1]) for row in rows}
            conditions, params = [], []
            for name in names:  # bounded by the publications one unit writes
                conditions.append("(SELECT version FROM cf_publication_senders WHERE publication = ?) IS ?")
                params += [name, read.get(name)]
            unchanged = " AND ".join(conditions)
            expires_us = now_us + int(lease_s * 1_000_000)
            results = self.client.batch([
                ("DELETE FROM cf_publication_claims WHERE expires_us <= ?", (now_us,)),
                *[(("INSERT INTO cf_publication_claims (publication, holder, version, expires_us) "
                   f"SELECT ?, ?, 1, ? WHERE {unchanged} ON CONFLICT (publication, holder) DO UPDATE SET "
                   "version = version + 1, expires_us = excluded.expires_us"),
                   (name, holder, expires_us, *params)) for name in names],
                (f"SELECT {unchanged} AS unchanged", tuple(params))])
            if results[-1].rows[0][0]:
                return ()

    def shared_holders(self, publication: str) -> tuple[Hold, ...]:
        rows = self.client.query("SELECT publication, holder, version, expires_us FROM cf_publication_claims "
                                 "WHERE publication = ? AND expires_us > ? ORDER BY holder",
                                 (publication, self.clock.now_us()))
        return tuple(Hold(p, h, SHARED, int(v), int(e)) for p, h, v, e in rows)

    def renew(self, holder: str, lease_s: float) -> tuple[Hold, ...]:
        now_us = self.clock.now_us()
        expires_us = now_us + int(lease_s * 1_000_000)
        results = self.client.batch([
            (("UPDATE cf_publication_senders SET version = version + 1, expires_us = ? WHERE holder = ? "
             "AND expires_us > ?"), (expires_us, holder, now_us)),
            (("UPDATE cf_publication_claims SET version = version + 1, expires_us = ? WHERE holder = ? "
             "AND expires_us > ?"), (expires_us, holder, now_us)),
            (("SELECT publication, version, expires_us FROM cf_publication_senders WHERE holder = ? AND "
             "expires_us = ?"), (holder, expires_us)),
            (("SELECT publication, version, expires_us FROM cf_publication_claims WHERE holder = ? AND "
             "expires_us = ?"), (holder, expires_us))])
        return tuple(sorted((Hold(p, holder, mode, int(v), int(e)) for mode, result in
                             ((EXCLUSIVE, results[2]), (SHARED, results[3])) for p, v, e in result.rows),
                            key=lambda hold: (hold.publication, hold.mode)))

    def release(self, holder: str) -> None:
        self.client.batch([
            (("UPDATE cf_publication_senders SET holder = NULL, expires_us = 0, version = version + 1 "
             "WHERE holder = ?"), (holder,)),
            ("DELETE FROM cf_publication_claims WHERE holder = ?", (holder,))])
        for key in [key for key, held in _leases.items() if key[0] == self.client.backend and held == holder]:
            del _leases[key]
