"""Journal store adapter of the D1 profile: ``cf_journal_owners`` and ``cf_journal_steps`` in D1.

Implements the journal part of ``run.journal.storage-ports`` over D1 (decisions "run-substrate-storage"
and "d1-execution-state"), reached through the private Worker (``storage.d1.client``). D1's
transaction is one batch and ends with its request: nothing can be read, decided in Python and
written under a lock held in between, as the SQL adapters' ``BEGIN IMMEDIATE`` / ``FOR UPDATE`` do
(``storage.journal.sql``). So every write here is a compare-and-swap expressed in the batch:

* An owner verb reads the row, applies the port's transition (``JournalStore._swap_owner``) and
  writes the result with ``UPDATE … WHERE <every column IS what was read>`` (or, for a scope with no
  row, ``INSERT … ON CONFLICT (scope) DO NOTHING``). A change count of 0 means another writer got
  there first: read again and decide again. D1 serializes writes, so the swap is linearizable.
* A step is ``INSERT … ON CONFLICT DO NOTHING`` with the read of the stored row in the same batch;
  under a writer fence the insert is ``INSERT … SELECT … WHERE EXISTS (<the attempt still owns its
  execution>)`` and the batch reads the owner row too, so the refusal and the write see one state.
* :meth:`D1JournalStore.hold_owners` cannot hold rows across a callback (no lock outlives the
  request): it reads the rows in one batch and commits a durable callback guard binding them
  exactly as read (``storage.d1.guards``, ``run.journal.d1-guard``). While the guard exists an
  owner write that would transfer a row it protects (another execution, holder, attempt, status,
  plan or pins) refuses with CallbackGuardHeld; the owner's own renewals and cursor caches pass.
  A step recorded inside the hold first releases the guard (``run.callback-guard.release``: the
  callback returned) and lands only while the row read still admits the attempt; a crash leaves
  the guard in place until replay or ``contextful storage reconcile-guard``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from contextful.storage.clock import SystemClock
from contextful.storage.d1.client import BatchResult, D1Client, Statement
from contextful.storage.d1.guards import CallbackGuards, Guard
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import CallbackGuardHeld, CommitOutcomeUnknown
from contextful.storage.fence import OWNER_FENCE_COLUMNS, WriterFence
from contextful.storage.journal import PENDING, CallbackIdentity, HeldOwners, JournalStore, OwnerRow, StepRow
from contextful.storage.journal.sql import DDL, OWNER_COLUMNS

_SELECT_OWNER = f"SELECT {', '.join(OWNER_COLUMNS)} FROM cf_journal_owners"
_INSERT_OWNER = (f"INSERT INTO cf_journal_owners ({', '.join(OWNER_COLUMNS)})"
                 f" VALUES ({', '.join('?' for _ in OWNER_COLUMNS)}) ON CONFLICT (scope) DO NOTHING")
_SWAP_OWNER = ("UPDATE cf_journal_owners SET " + ", ".join(f"{c} = ?" for c in OWNER_COLUMNS[1:])
               + " WHERE " + " AND ".join(f"{c} IS ?" for c in OWNER_COLUMNS))
_SELECT_STEP = "SELECT execution_id, seq, label, value, recorded_us FROM cf_journal_steps"
_STEP_COLUMNS = "(execution_id, seq, label, value, recorded_us)"
_INSERT_STEP = (f"INSERT INTO cf_journal_steps {_STEP_COLUMNS} VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (execution_id, seq) DO NOTHING")
_FENCE_HOLDS = ("EXISTS (SELECT 1 FROM cf_journal_owners WHERE execution_id = ? AND status = 'pending'"
                " AND holder = ? AND attempts = ?)")
"""The fence's :meth:`~contextful.storage.fence.WriterFence.refusal_of` finding nothing, as a predicate."""
_INSERT_FENCED_STEP = (f"INSERT INTO cf_journal_steps {_STEP_COLUMNS} SELECT ?, ?, ?, ?, ? WHERE {_FENCE_HOLDS}"
                       " ON CONFLICT (execution_id, seq) DO NOTHING")


_TRANSFER_COLUMNS = ("execution_id", "plan_ref", "status", "holder", "attempts", "pins")
"""The columns whose change transfers an owner row (what a callback guard blocks)."""
_UNGUARDED = "NOT EXISTS (SELECT 1 FROM cf_callback_guards g, json_each(g.scopes) j WHERE j.value = ?)"


def _values(row: OwnerRow) -> tuple[Any, ...]:
    return tuple(getattr(row, c) for c in OWNER_COLUMNS)


def transfers(row: OwnerRow, new: OwnerRow) -> bool:
    """Whether writing ``new`` over ``row`` transfers it (``run.journal.d1-guard``)."""
    return any(getattr(row, c) != getattr(new, c) for c in _TRANSFER_COLUMNS)


def swap_statement(row: OwnerRow, new: OwnerRow, predicate: Statement | None = None) -> Statement:
    """``UPDATE`` the owner row from exactly ``row`` to ``new``, also only where ``predicate`` holds."""
    sql, params = _SWAP_OWNER, _values(new)[1:] + _values(row)
    if predicate is not None:
        sql, params = f"{sql} AND {predicate[0]}", (*params, *predicate[1])
    return sql, params


def _step(row: tuple[Any, ...]) -> StepRow:
    return StepRow(row[0], int(row[1]), row[2], bytes(row[3]), int(row[4]))


def _fence_params(fence: WriterFence) -> tuple[Any, ...]:
    return (fence.execution_id, fence.holder, fence.attempt)


class D1JournalStore(JournalStore):
    hold_excludes_holds = True
    def __init__(self, client: D1Client) -> None:
        self.client = client
        client.batch([(statement.format(blob="BLOB"), ()) for statement in DDL])
        self.guards = CallbackGuards(client)

    @property
    def location(self) -> str:
        return self.client.backend

    def _batch_again(self, statements: Sequence[Statement]) -> list[BatchResult]:
        return self.client.batch(statements, rerun_unheard=True)

    # --- owners ---------------------------------------------------------------------------------

    def _swap_owner(self, change: Callable[[OwnerRow | None], OwnerRow], *, scope: str | None = None,
                    execution_id: str | None = None) -> OwnerRow:
        while True:  # loops only while other writers keep moving the row between our read and our swap
            row = self.owner(scope) if scope is not None else self._owner_of(str(execution_id))
            new = change(row)
            guarded = row is not None and transfers(row, new)
            if row is None:
                statement: Statement = (_INSERT_OWNER, _values(new))
            else:  # a transfer lands only while no callback guard protects the row
                statement = swap_statement(row, new, (_UNGUARDED, (row.scope,)) if guarded else None)
            try:  # an owner transition is not repeatable blindly: a lost answer is an unknown outcome
                changed = self.client.batch([statement])[0].changes
            except CommitUnheard as exc:
                raise CommitOutcomeUnknown(f"journal owner {scope or execution_id}", str(execution_id or scope),
                                           str(exc)) from exc
            if changed == 1:
                return new
            if row is not None and guarded and (held := self.guards.protecting([row.scope])):
                raise CallbackGuardHeld(row.scope, held[row.scope], "its admitted callback has not released it, "
                                        "been replayed or been reconciled (contextful storage reconcile-guard)")

    def _owner_of(self, execution_id: str) -> OwnerRow | None:
        rows = self.client.query(f"{_SELECT_OWNER} WHERE execution_id = ?", (execution_id,))
        return OwnerRow(*rows[0]) if rows else None

    def owner(self, scope: str) -> OwnerRow | None:
        rows = self.client.query(f"{_SELECT_OWNER} WHERE scope = ?", (scope,))
        return OwnerRow(*rows[0]) if rows else None

    def owners(self) -> list[OwnerRow]:
        return [OwnerRow(*row) for row in self.client.query(f"{_SELECT_OWNER} ORDER BY scope")]

    @contextmanager
    def hold_owners(self, execution_id: str, scopes: Sequence[str] = (), fence: WriterFence | None = None,
                    callback: CallbackIdentity | None = None) -> Iterator[HeldOwners]:
        """Read the rows in one batch and guard them durably through the block (module docstring);
        a row another callback's guard protects raises CallbackGuardHeld before the block runs.
        Only a row that admits the hold is guarded: the execution's, pending, held (by ``fence``'s
        holder at its attempt, when given); of the other scopes, only the pending ones."""
        while True:  # loops only while a guarded row moves (a renewal) between the read and the guard
            own, others = self._read_held(execution_id, scopes)
            if own is None or own.execution_id != execution_id or own.status != PENDING or own.holder is None or (
                    fence is not None and (own.holder, own.attempts) != (fence.holder, fence.attempt)):
                guard = None  # nothing to guard: the admission refuses on the rows as read
                break
            identity = callback or CallbackIdentity(f"{execution_id}/admission/{own.attempts}",
                                                    f"{execution_id}:{own.attempts}")
            pending = [others[s] for s in dict.fromkeys(scopes) if s in others and others[s].status == PENDING]
            guard = self.guards.acquire(own, pending, identity, SystemClock().now_us())
            if guard is not None:
                break
        released: list[Guard] = []

        def release() -> None:
            if guard is not None and not released:
                released.append(guard)
                self.guards.release(guard)

        def record(step: StepRow) -> StepRow:
            release()  # the callback returned: its guard goes before its value is journaled
            if own is None:
                return self._insert_step(step)
            return self._insert_step(step, fence or WriterFence(execution_id, own.holder or "", own.attempts,
                                                                self.location))

        try:
            yield HeldOwners(own, others, record)
        finally:
            release()

    def _read_held(self, execution_id: str, scopes: Sequence[str]) -> tuple[OwnerRow | None, dict[str, OwnerRow]]:
        reads: list[Statement] = [(f"{_SELECT_OWNER} WHERE execution_id = ?", (execution_id,))]
        if scopes:
            reads.append((f"{_SELECT_OWNER} WHERE scope IN ({', '.join('?' for _ in scopes)}) ORDER BY scope",
                          tuple(scopes)))
        results = self.client.batch(reads, write=False)  # one batch: every row read at one point
        own = OwnerRow(*results[0].rows[0]) if results[0].rows else None
        return own, ({row.scope: row for row in (OwnerRow(*r) for r in results[1].rows)} if scopes else {})

    # --- steps ----------------------------------------------------------------------------------

    def _insert_step(self, row: StepRow, fence: WriterFence | None = None) -> StepRow:
        values = (row.execution_id, row.seq, row.label, row.value, row.recorded_us)
        read_back: Statement = (f"{_SELECT_STEP} WHERE execution_id = ? AND seq = ?", (row.execution_id, row.seq))
        if fence is None:
            return _step(self._batch_again([(_INSERT_STEP, values), read_back])[1].rows[0])
        insert: Statement = (_INSERT_FENCED_STEP, values + _fence_params(fence))
        owner: Statement = (f"SELECT {OWNER_FENCE_COLUMNS} FROM cf_journal_owners WHERE execution_id = ?",
                            (fence.execution_id,))
        _, found, stored = self._batch_again([insert, owner, read_back])
        reason = fence.refusal_of(found.rows[0] if found.rows else None)
        if reason is not None:  # the insert saw the same owner row: it wrote nothing
            raise fence.refuse(reason)
        return _step(stored.rows[0])

    def steps(self, execution_id: str) -> list[StepRow]:
        return [_step(r) for r in self.client.query(f"{_SELECT_STEP} WHERE execution_id = ? ORDER BY seq",
                                                    (execution_id,))]

    def collect(self, execution_id: str, below: int | None = None, fence: WriterFence | None = None) -> int:
        where = "execution_id = ?"
        params: list[Any] = [execution_id]
        if below is not None:
            where += " AND seq < ?"
            params.append(below)
        if fence is None:
            return int(self._batch_again([(f"DELETE FROM cf_journal_steps WHERE {where}", params)])[0].changes)
        owner: Statement = (f"SELECT {OWNER_FENCE_COLUMNS} FROM cf_journal_owners WHERE execution_id = ?",
                            (fence.execution_id,))
        found, deleted = self._batch_again([
            owner,
            (f"DELETE FROM cf_journal_steps WHERE {where} AND {_FENCE_HOLDS}", [*params, *_fence_params(fence)])])
        reason = fence.refusal_of(found.rows[0] if found.rows else None)
        if reason is not None:
            raise fence.refuse(reason)
        return int(deleted.changes)
