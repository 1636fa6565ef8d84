"""Writer fences: the attempt a write is made for, checked inside the write's own atomic step.

Implements the storage side of ``run.journal.current-owner`` and ``run.export.writer-fenced``
(decision "run-substrate-storage": an execution checks its durable owner and active attempt
immediately before effect dispatch and publication). A check made on one step and a write made on
the next leave a window in which another holder takes the lease over; so the check is part of the
write, as pyiceberg checks a commit's requirements in the transaction that moves the head:

* a table commit carries :class:`~contextful.storage.commits.AssertWriter` among its requirements,
  and the catalog reads the owner row in the commit transaction (``storage.catalog.sql``);
* a journal step, a cached cursor and a close carry the attempt, and the journal store checks it
  in the transaction (or under the owner lock) that writes the row (``storage.journal``);
* an outbox staging and an outbox acknowledgement carry it too, and the outbox checks it in the
  staging or acknowledging transaction (``storage.outbox``).

Every one of them refuses with :class:`~contextful.storage.errors.ExecutionWriterFenced` and
leaves nothing visible. The owner rows live in the catalog's own database (the SQLite file or the
PostgreSQL schema, ``storage.store.Store.journal``), so one transaction reads the owner and moves
the head.

A run names its fence once, for a block, with :func:`writing_as`; every commit a
:class:`~contextful.storage.transaction.RunTransaction` makes inside the block carries it, so a
stage added later (a build, an export the control plane dispatches under an execution) is fenced
without knowing about executions::

    >>> fence = WriterFence("e1", "host:1:ab", 2, "sqlite:/srv/store/catalog.sqlite")
    >>> with writing_as(fence):
    ...     current_fence() == fence
    True
    >>> current_fence() is None
    True
    >>> fence.refusal(None)
    'no owner holds execution e1 any more'

A fence names the journal its owner row lives in (:attr:`WriterFence.journal`). A commit to a
store whose catalog is that journal's database checks it in the commit transaction. An execution
over another journal (the file-tree adapter, a journal of another store) cannot be checked in that
transaction: its commits are checked against the journal immediately before (``verify``, given to
:func:`writing_as`), check-then-act, which is what the file-tree journal offers everywhere.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import ExecutionWriterFenced

if TYPE_CHECKING:
    from contextful.storage.journal import OwnerRow

PENDING = "pending"
PUBLICATION = "state publication"
DISPATCH = "effect dispatch"

OWNER_FENCE_COLUMNS = "execution_id, status, holder, attempts, scope"
"""What a fence reads of ``cf_journal_owners`` (in this order: :meth:`WriterFence.refusal_of`)."""


@dataclass(frozen=True)
class WriterFence:
    """The attempt a write is made for: execution, holder and attempt number."""

    execution_id: str
    holder: str
    attempt: int
    journal: str
    """The location of the journal holding the owner row (``JournalStore.location``)."""

    def refusal(self, row: OwnerRow | None) -> str | None:
        """Why the owner ``row`` no longer admits this attempt's writes (None: it does)."""
        if row is None:
            return self.refusal_of(None)
        return self.refusal_of((row.execution_id, row.status, row.holder, row.attempts, row.scope))

    def refusal_of(self, row: tuple[Any, ...] | None) -> str | None:
        """:meth:`refusal` over a raw ``(execution_id, status, holder, attempts, scope)`` row."""
        if row is None or row[0] != self.execution_id:
            return f"no owner holds execution {self.execution_id} any more"
        _, status, holder, attempts, scope = row
        if status != PENDING:
            return f"its owner on {scope} is {status}"
        if holder != self.holder or int(attempts) != self.attempt:
            return (f"the owner lease transferred: attempt {attempts} of {holder} holds it, not attempt "
                    f"{self.attempt} of {self.holder}")
        return None

    def refuse(self, reason: str, boundary: str = PUBLICATION) -> ExecutionWriterFenced:
        """The error a write refused for ``reason`` raises."""
        return ExecutionWriterFenced(self.execution_id, self.attempt, boundary, reason)

    def check_sql(self, cur: Any, sql: Any, lock: str = "", boundary: str = PUBLICATION) -> None:
        """Inside an open write transaction on ``cur``: read the owner row (``lock`` appended, e.g.
        `` FOR SHARE`` so a takeover's ``FOR UPDATE`` waits for this transaction) and raise
        :class:`ExecutionWriterFenced` unless it still admits this attempt. ``sql`` rewrites ``?``
        placeholders for the driver."""
        cur.execute(sql(f"SELECT {OWNER_FENCE_COLUMNS} FROM cf_journal_owners WHERE execution_id = ?{lock}"),
                    (self.execution_id,))
        found = cur.fetchone()
        reason = self.refusal_of(None if found is None else tuple(found))
        if reason is not None:
            raise self.refuse(reason, boundary)


@dataclass(frozen=True)
class _Writing:
    fence: WriterFence
    verify: Callable[[], None] | None


_current: contextvars.ContextVar[_Writing | None] = contextvars.ContextVar("contextful_writer_fence", default=None)


def current_fence() -> WriterFence | None:
    """The fence the writes of this thread (or task) carry now, if any."""
    writing = _current.get()
    return None if writing is None else writing.fence


def verify_current() -> None:
    """Check the current fence against its own journal now (ExecutionWriterFenced if it refuses):
    what a write that cannot carry the fence in its own transaction does immediately before it."""
    writing = _current.get()
    if writing is not None and writing.verify is not None:
        writing.verify()


@contextmanager
def writing_as(fence: WriterFence | None, verify: Callable[[], None] | None = None) -> Iterator[WriterFence | None]:
    """Carry ``fence`` on every store commit, outbox staging and acknowledgement made inside the
    block (None: none).
    ``verify`` checks it against its journal, for a write that cannot check it atomically."""
    token = _current.set(None if fence is None else _Writing(fence, verify))
    try:
        yield fence
    finally:
        _current.reset(token)
