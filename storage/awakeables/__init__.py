"""The awakeable store port: tokens an execution suspends on, and the one value each resolves to.

Implements the awakeable part of ``run.journal.storage-ports`` (decision "run-substrate-storage":
the run substrate is three storage ports, and the file tree is one adapter), the store side of
``run.suspend.awakeable`` (decision "awakeable-resumes-credentialed": the engine mints an opaque
single-use token and persists a pending row), ``run.suspend.conflicting-resolution`` and
``run.suspend.expired-token`` (decision "external-signals-single": a signal's value is fixed once
observed, and deadlines evaluate lazily, so no target owes a durable timer). Adapters beside this
module: ``files`` (a file tree under a local store root), ``sqlite`` and ``postgres`` — in the same
database as the journal; :func:`open_awakeable_store` picks one by profile.

A row is keyed twice: by its token (what the resuming party posts back) and by the journal step it
suspends, ``(execution_id, seq)``. The rules live here once; each adapter supplies two conditional
writes:

* :meth:`AwakeableStore._insert_pending` inserts a pending row unless the step already has one, and
  returns the stored row: minting is idempotent per step, so a replaying execution gets its token
  back instead of a second one.
* :meth:`AwakeableStore._settle` turns a pending row resolved unless it already is: the first
  resolution's payload, subject and instant are the ones every later reader sees.

Timed out is not a stored state: a row is ``pending`` until resolved, and a pending row whose
``deadline_us`` is at or before the reader's now has timed out. :meth:`AwakeableStore.resolve`
checks the deadline against its caller's instant before it writes.

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

PENDING, RESOLVED = "pending", "resolved"

PROFILES = ("files", "sqlite", "postgres")

RESOLUTIONS = threading.Condition()
"""Notified (under its lock) each time this process resolves an awakeable, so a waiter in the same
process wakes at once instead of at its next poll; :func:`resolutions_seen` reads the count."""
_resolved_count = 0


def resolutions_seen() -> int:
    """How many resolutions this process has made: a waiter reads it before looking at a row and
    waits on :data:`RESOLUTIONS` only while it is unchanged, so no resolution slips between."""
    with RESOLUTIONS:
        return _resolved_count


def _announce_resolution() -> None:
    global _resolved_count
    with RESOLUTIONS:
        _resolved_count += 1
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
    """``pending`` or ``resolved``; timed out is ``pending`` with ``deadline_us <= now`` (lazy)."""
    created_us: int
    deadline_us: int
    payload: bytes | None
    resolved_us: int | None
    subject: str | None
    """The verified caller subject that resolved it."""

    def timed_out(self, now_us: int) -> bool:
        """Pending past its deadline at ``now_us``."""
        return self.state == PENDING and self.deadline_us <= now_us


class AwakeableStore(ABC):
    """Pending and resolved awakeables behind conditional writes; adapters supply storage, this
    class the rules."""

    # --- adapter primitives ---------------------------------------------------------------------

    @abstractmethod
    def _insert_pending(self, row: AwakeableRow) -> AwakeableRow:
        """Insert ``row`` unless its ``(execution_id, seq)`` holds one; return the stored row."""

    @abstractmethod
    def _settle(self, token: str, payload: bytes, subject: str | None, resolved_us: int) -> None:
        """Resolve the row of ``token`` with these values unless it is resolved already (the first
        resolution stays); a racing settle of one token leaves exactly one resolution."""

    @abstractmethod
    def get(self, token: str) -> AwakeableRow | None:
        """The row minted under ``token``, or None."""

    @abstractmethod
    def rows_of(self, execution_id: str) -> list[AwakeableRow]:
        """Every row minted by ``execution_id``, ordered by step."""

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

        Unknown token: AwakeableUnknown. Pending with its deadline at or before ``now_us``:
        AwakeableTimedOut. Already resolved with the same payload: the row as first resolved (no
        error, nothing written). Resolved with another payload, first or in a race:
        AwakeableAlreadyResolved, the recorded value untouched.
        """
        payload = bytes(payload)
        row = self.get(token)
        if row is None:
            raise AwakeableUnknown(token)
        if row.timed_out(now_us):
            raise AwakeableTimedOut(token, row.execution_id, row.label, row.deadline_us)
        if row.state == PENDING:
            self._settle(token, payload, subject, now_us)
            _announce_resolution()
            settled = self.get(token)
            assert settled is not None and settled.state == RESOLVED, "a settled awakeable reads resolved"
            row = settled
        if row.payload != payload:
            raise AwakeableAlreadyResolved(token, row.execution_id, row.label)
        return row

    def pending_for(self, execution_id: str, now_us: int) -> list[AwakeableRow]:
        """The execution's awakeables still pending with their deadline after ``now_us``."""
        return [row for row in self.rows_of(execution_id) if row.state == PENDING and row.deadline_us > now_us]


def open_awakeable_store(profile: str, **kwargs: object) -> AwakeableStore:
    """``files`` (root=…, a local path), ``sqlite`` (path=…) or ``postgres`` (dsn=…, schema=…), the
    same arguments :func:`~contextful.storage.journal.open_journal_store` takes for the journal beside it."""
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
    from contextful.storage.errors import StorageProfileUnknown

    raise StorageProfileUnknown(profile, PROFILES)


def awakeable_store_beside(journal: JournalStore) -> AwakeableStore:
    """The awakeable store in the same place as ``journal``: its local root, its SQLite file or its
    PostgreSQL schema (one home for an execution's replay state)."""
    from contextful.storage.journal.files import FileJournalStore
    from contextful.storage.journal.postgres import PostgresJournalStore
    from contextful.storage.journal.sqlite import SqliteJournalStore

    if isinstance(journal, FileJournalStore):
        return open_awakeable_store("files", root=journal.objects.root)
    if isinstance(journal, SqliteJournalStore):
        return open_awakeable_store("sqlite", path=journal.path)
    if isinstance(journal, PostgresJournalStore):
        return open_awakeable_store("postgres", dsn=journal.dsn, schema=journal.schema)
    raise ValueError(f"no awakeable store beside a {type(journal).__name__}")
