"""The awakeable store port: tokens an execution suspends on, and the one value each resolves to.

Implements the awakeable part of ``run.journal.storage-ports`` (decision "run-substrate-storage":
the run substrate is three storage ports, and the file tree is one adapter), the store side of
``run.suspend.awakeable`` (decision "awakeable-resumes-credentialed": the engine mints an opaque
single-use token and persists a pending row), ``run.suspend.conflicting-resolution`` and
``run.suspend.expired-token`` (decision "external-signals-single": a signal's value is fixed once
observed, and deadlines evaluate lazily, so no target owes a durable timer). Adapters beside this
module: ``files`` (a file tree under a local store root), ``sqlite``, ``postgres`` and ``d1`` — in the
same database as the journal; :func:`open_awakeable_store` picks one by profile.

A row is keyed twice: by its token (what the resuming party posts back) and by the journal step it
suspends, ``(execution_id, seq)``. The rules live here once; each adapter supplies two conditional
writes:

* :meth:`AwakeableStore._insert_pending` inserts a pending row unless the step already has one, and
  returns the stored row: minting is idempotent per step, so a replaying execution gets its token
  back instead of a second one.
* :meth:`AwakeableStore._settle` turns a pending row ``resolved`` or ``timed-out`` unless it is
  settled already: the first settlement (a resolution's payload, subject and instant, or the
  timeout) is the one every later reader sees.

A row has one outcome, decided by that one write. A resolution settles it only while it is pending
and the resolver's instant is before the deadline; a timeout only while it is pending and the
instant is at or past it. The deadline is written once at mint and never changes, so comparing the
caller's instant with it needs no read the write could race; what races is the two settlements,
and the conditional write lets exactly one land. Deadlines still evaluate lazily (decision
"external-signals-single": no target owes a durable timer): nothing settles a row when its deadline
passes, the first party to look past it does — the waiting execution (:meth:`AwakeableStore.expire`)
or a late resolver (:meth:`AwakeableStore.resolve`, answered AwakeableTimedOut). Whoever lost reads
the winner's outcome: a resolver answered 200 is never beside a waiter that recorded a timeout, and
a resolver answered AwakeableTimedOut is never beside a waiter that recorded its payload.

    >>> import tempfile
    >>> store = open_awakeable_store("sqlite", path=tempfile.mkdtemp() + "/catalog.sqlite")
    >>> row = store.mint("e1", 3, "approve", deadline_us=2_000, now_us=1_000)
    >>> row.state, store.mint("e1", 3, "approve", deadline_us=9_000, now_us=1_500).token == row.token
    ('pending', True)
    >>> store.resolve(row.token, b"yes", "alice", now_us=1_200).payload
    b'yes'
    >>> store.resolve(row.token, b"no", "bob", now_us=1_300)
    Traceback (most recent call last):
    ...
    contextful.storage.errors.AwakeableAlreadyResolved: ...
    >>> late = store.mint("e1", 4, "countersign", deadline_us=2_000, now_us=1_000)
    >>> store.expire(late.token, now_us=2_000).state   # the waiter looks at the deadline: settled
    'timed-out'
    >>> store.resolve(late.token, b"yes", "alice", now_us=1_999)
    Traceback (most recent call last):
    ...
    contextful.storage.errors.AwakeableTimedOut: ...
"""

from __future__ import annotations

import secrets
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.storage.errors import (
    AwakeableAlreadyResolved,
    AwakeableTimedOut,
    AwakeableUnknown,
    JournalConflict,
)

if TYPE_CHECKING:
    from contextful.storage.journal import JournalStore

PENDING, RESOLVED, TIMED_OUT = "pending", "resolved", "timed-out"

PROFILES = ("files", "sqlite", "postgres", "d1")

RESOLUTIONS = threading.Condition()
"""Notified (under its lock) each time :func:`wake_waiters` runs — this process settled an
awakeable, or set an execution's cancellation token — so a waiter in the same process looks again
at once instead of at its next poll; :func:`resolutions_seen` reads the count."""
_wake_count = 0


def resolutions_seen() -> int:
    """How many wakes this process has made: a waiter reads it before looking at its row and its
    cancellation token and waits on :data:`RESOLUTIONS` only while it is unchanged, so no
    resolution or cancel slips between the look and the wait."""
    with RESOLUTIONS:
        return _wake_count


def wake_waiters() -> None:
    """Wake every waiter of this process to look again (at its row and its cancellation token)."""
    global _wake_count
    with RESOLUTIONS:
        _wake_count += 1
        RESOLUTIONS.notify_all()


@dataclass(frozen=True)
class AwakeableRow:
    token: str
    """Opaque, unguessable (``secrets.token_urlsafe(32)``), single-use."""
    execution_id: str
    seq: int
    """The journal step the suspension sits at."""
    label: str
    state: str
    """``pending``, ``resolved`` or ``timed-out`` (settled by whoever looked first at or past the
    deadline while it was pending)."""
    created_us: int
    deadline_us: int
    payload: bytes | None
    resolved_us: int | None
    """When it was resolved (None while pending and once timed out)."""
    subject: str | None
    """The verified caller subject that resolved it."""

    def timed_out(self, now_us: int) -> bool:
        """Settled timed-out, or pending with its deadline at or before ``now_us`` (the next look
        settles it so)."""
        return self.state == TIMED_OUT or (self.state == PENDING and self.deadline_us <= now_us)


class AwakeableStore(ABC):
    """Pending and resolved awakeables behind conditional writes; adapters supply storage, this
    class the rules."""

    # --- adapter primitives ---------------------------------------------------------------------

    @abstractmethod
    def _insert_pending(self, row: AwakeableRow) -> AwakeableRow:
        """Insert ``row`` unless its ``(execution_id, seq)`` holds one; return the stored row."""

    @abstractmethod
    def _settle(self, token: str, state: str, payload: bytes | None, subject: str | None,
                resolved_us: int | None) -> None:
        """Settle the row of ``token`` as ``state`` (``resolved`` with these values, or
        ``timed-out`` with none) unless it is settled already: the first settlement stays, and
        racing settlements of one token leave exactly one. The caller has checked its instant
        against the row's deadline, which never changes."""

    @abstractmethod
    def get(self, token: str) -> AwakeableRow | None:
        """The row minted under ``token``, or None."""

    @abstractmethod
    def rows_of(self, execution_id: str) -> list[AwakeableRow]:
        """Every row minted by ``execution_id``, ordered by step."""

    @abstractmethod
    def pending_under(self, prefix: str) -> list[AwakeableRow]:
        """Every row still pending (its deadline not looked at) whose execution id is ``prefix``
        followed by ``/`` and more, ordered by execution id and step: how a restarted owner of a
        family of executions (serve's relay: ``engine.control.attempts``) finds what it left open."""

    def close_store(self) -> None:
        """Release connections and handles (an adapter with none keeps this no-op)."""

    # --- the rules --------------------------------------------------------------------------------

    def mint(self, execution_id: str, seq: int, label: str, deadline_us: int, now_us: int) -> AwakeableRow:
        """A pending awakeable for step ``seq`` of ``execution_id``, or the one minted there before
        (its token, label and deadline as first minted: a replay gets the same token back). A step
        minted under another label means the replay diverged: JournalConflict."""
        offered = AwakeableRow(token=secrets.token_urlsafe(32), execution_id=execution_id, seq=seq, label=label,
                               state=PENDING, created_us=now_us, deadline_us=deadline_us, payload=None,
                               resolved_us=None, subject=None)
        stored = self._insert_pending(offered)
        if stored.label != label:
            raise JournalConflict(execution_id, seq, f"step {seq} suspended on awakeable {stored.label!r}; this "
                                                     f"attempt offers {label!r}")
        return stored

    def resolve(self, token: str, payload: bytes, subject: str | None, now_us: int) -> AwakeableRow:
        """Resolve ``token`` with ``payload`` on behalf of ``subject``; return the resolved row.

        Unknown token: AwakeableUnknown. Pending with its deadline at or before ``now_us``: the row
        is settled timed-out (unless a settlement landed first) and AwakeableTimedOut raised, so
        what this caller is told is what the waiter and every replay read. Pending in time: one
        conditional write resolves it, unless the waiter settled it timed-out first
        (AwakeableTimedOut) or another resolver resolved it first (its row, or
        AwakeableAlreadyResolved for another payload). Already resolved with the same payload: the
        row as first resolved (no error, nothing written). Resolved with another payload:
        AwakeableAlreadyResolved, the recorded value untouched.
        """
        payload = bytes(payload)
        row = self.get(token)
        if row is None:
            raise AwakeableUnknown(token)
        if row.state == PENDING:
            if now_us < row.deadline_us:
                self._settle(token, RESOLVED, payload, subject, now_us)
            else:
                self._settle(token, TIMED_OUT, None, None, None)
            row = self._settled(token)
        if row.state == TIMED_OUT:
            raise AwakeableTimedOut(token, row.execution_id, row.label, row.deadline_us)
        if row.payload != payload:
            raise AwakeableAlreadyResolved(token, row.execution_id, row.label)
        return row

    def expire(self, token: str, now_us: int) -> AwakeableRow:
        """The waiter's look past the deadline: settle ``token`` timed-out if it is pending and its
        deadline is at or before ``now_us``; return the row as stored — ``timed-out``, or
        ``resolved`` if a resolution landed first (or still ``pending`` before the deadline)."""
        row = self.get(token)
        if row is None:
            raise AwakeableUnknown(token)
        if row.state != PENDING or now_us < row.deadline_us:
            return row
        self._settle(token, TIMED_OUT, None, None, None)
        return self._settled(token)

    def _settled(self, token: str) -> AwakeableRow:
        """The row of ``token`` after this process attempted a settlement: whichever landed."""
        wake_waiters()
        settled = self.get(token)
        assert settled is not None and settled.state != PENDING, "a settled awakeable reads settled"
        return settled

    def pending_for(self, execution_id: str, now_us: int) -> list[AwakeableRow]:
        """The execution's awakeables still pending with their deadline after ``now_us``."""
        return [row for row in self.rows_of(execution_id) if row.state == PENDING and row.deadline_us > now_us]


def open_awakeable_store(profile: str, **kwargs: object) -> AwakeableStore:
    """``files`` (root=…, a local path), ``sqlite`` (path=…), ``postgres`` (dsn=…, schema=…) or ``d1``
    (url=…, token=…, namespace=…), the same arguments :func:`~contextful.storage.journal.open_journal_store`
    takes for the journal beside it."""
    if profile == "files":
        from contextful.storage.awakeables.files import FileAwakeableStore
        from contextful.storage.objects import ObjectStore

        return FileAwakeableStore(ObjectStore(str(kwargs["root"])))
    if profile == "sqlite":
        from contextful.storage.awakeables.sqlite import SqliteAwakeableStore

        return SqliteAwakeableStore(str(kwargs["path"]))
    if profile == "postgres":
        from contextful.storage.awakeables.postgres import PostgresAwakeableStore

        return PostgresAwakeableStore(str(kwargs.get("dsn", "")), str(kwargs.get("schema", "contextful")))
    if profile == "d1":
        from contextful.storage.d1.awakeables import D1AwakeableStore
        from contextful.storage.d1.client import D1Client

        return D1AwakeableStore(D1Client.from_arguments(kwargs))
    from contextful.storage.errors import StorageProfileUnknown

    raise StorageProfileUnknown(profile, PROFILES)


def awakeable_store_beside(journal: JournalStore) -> AwakeableStore:
    """The awakeable store in the same place as ``journal``: its local root, its SQLite file or its
    PostgreSQL schema or its D1 binding (one home for an execution's replay state)."""
    from contextful.storage.d1.journal import D1JournalStore
    from contextful.storage.journal.files import FileJournalStore
    from contextful.storage.journal.postgres import PostgresJournalStore
    from contextful.storage.journal.sqlite import SqliteJournalStore

    if isinstance(journal, FileJournalStore):
        return open_awakeable_store("files", root=journal.objects.root)
    if isinstance(journal, SqliteJournalStore):
        return open_awakeable_store("sqlite", path=journal.path)
    if isinstance(journal, PostgresJournalStore):
        return open_awakeable_store("postgres", dsn=journal.dsn, schema=journal.schema)
    if isinstance(journal, D1JournalStore):
        from contextful.storage.d1.awakeables import D1AwakeableStore

        return D1AwakeableStore(journal.client)
    raise ValueError(f"no awakeable store beside a {type(journal).__name__}")
