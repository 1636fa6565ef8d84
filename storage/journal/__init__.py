"""The journal store port: execution owners keyed on their scope, and the steps they recorded.

Implements the journal part of ``run.journal.storage-ports`` (decision "run-substrate-storage":
the run substrate is three storage ports, and the file tree is one adapter) and the owner rules of
``run.own.host-scope`` and ``run.own.unclosed-execution`` (decision
"unclosed-execution-recovers"). Adapters beside this module: ``files`` (a file tree under a local
store root), ``sqlite``, ``postgres`` and ``d1`` (the D1 profile's, through its Worker);
:func:`open_journal_store` picks one by profile.

Two kinds of rows:

* **Owners**, one per scope. Every owner verb (:meth:`JournalStore.claim`, ``renew``,
  ``cache_cursor``, ``close``, ``retire``) is a pure transition of the current row, applied through
  one atomic read-modify-write primitive each adapter provides (:meth:`JournalStore._swap_owner`),
  so the rules live here once and every adapter serializes them the same way.
* **Steps**, ``(execution_id, seq)`` → ``(label, value)``. :meth:`JournalStore.record` is a
  conditional insert: the first value recorded at a sequence number is the one every later writer
  and every replay reads.

An owner row never records a status on its own: a handle dropped without ``close`` leaves its
owner ``pending`` until the lease lapses and the next claim under the scope resumes it.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from contextful.storage.clock import SystemClock, from_us
from contextful.storage.errors import (
    CancelTargetNotInFlight,
    ExecutionHeld,
    ExecutionRewindUnsafe,
    JournalConflict,
    OwnerPinsMismatch,
    OwnerPlanMismatch,
)
from contextful.storage.fence import WriterFence

PENDING = "pending"
CLOSED_OK = "closed-ok"
CLOSED_FAILED = "closed-failed"
RETIRED = "retired"
CLOSED_CANCELED = "closed-canceled"
STATUSES = (PENDING, CLOSED_OK, CLOSED_FAILED, RETIRED, CLOSED_CANCELED)

PROFILES = ("files", "sqlite", "postgres", "d1")


@dataclass(frozen=True)
class OwnerRow:
    """The owner of one scope: the execution pending (or last settled) under it."""

    scope: str
    """The key: a live table, a backfill chunk or a host-declared id, byte for byte as supplied."""
    execution_id: str
    plan_ref: str
    """SHA-256 hex of the canonical plan the execution is pinned to."""
    status: str
    """``pending``, ``closed-ok``, ``closed-failed``, ``retired`` or ``closed-canceled``."""
    holder: str | None
    """Opaque id of the process or handle holding the lease."""
    lease_expires_us: int
    opened_us: int
    closed_us: int | None
    cursor: str | None
    """JSON text a checkpoint caches while the owner is pending (position and marker), or None."""
    attempts: int
    """How many claims opened this execution: 1 when created, +1 on every resumption."""
    replay_from: int = 0
    """The step sequence number a resumption replays from; steps below it are collectable."""
    pins: str = "{}"
    """Canonical JSON object of the identities the host supplied beside the plan reference (its
    registered body's implementation and dependency digests, an input identity), name → value;
    a claim under other pins refuses with OwnerPinsMismatch. Read it with :meth:`pin_map`."""
    cancel_requested_us: int | None = None
    """When ``contextful run cancel`` marked the pending execution (``run.cancel.not-in-flight``):
    single-valued, the first mark kept; None while nobody asked it to stop."""
    held_since_us: int | None = None
    """When ``holder`` took the lease (its claim); None while nobody holds it, and in a row written
    before this was recorded."""

    def pin_map(self) -> dict[str, str]:
        """The owner's pins as a mapping."""
        decoded: dict[str, str] = json.loads(self.pins)
        return decoded


@dataclass(frozen=True)
class StepRow:
    execution_id: str
    seq: int
    label: str
    value: bytes
    recorded_us: int


@dataclass(frozen=True)
class HeldOwners:
    """What :meth:`JournalStore.hold_owners` read and holds."""

    own: OwnerRow | None
    """The row holding the execution; None when a claim replaced its execution or none holds it."""
    others: dict[str, OwnerRow]
    """The rows of the other scopes asked for, by scope (a scope with no owner row is absent)."""
    record: Callable[[StepRow], StepRow]
    """Record a step inside the hold (``run.journal.durable-dispatch``: an admitted callback's value
    is durable before the hold is released): first writer wins, as :meth:`JournalStore.record`.
    The SQL adapters write it in the held transaction, so it lands with the hold's end; the file
    tree writes it under its owner lock, conditional on the row the hold read."""


@dataclass(frozen=True)
class CallbackIdentity:
    """What an admitted callback is (``run.callback-guard.identity``): what a hold that outlives its
    holder (D1's durable callback guard, ``storage.d1.guards``) records of it, so a replay or an
    operator can tell what was in flight."""

    journal_entry: str
    """The journal entry key its value is recorded under."""
    idempotency_key: str
    """The key its request's ``Idempotency-Key`` sends (a replay sends it again)."""
    dedup_window_secs: int | None = None
    """The whole seconds the destination deduplicates that key; None when it declares none."""
    publication: bool = False
    """Whether the callback is a publication's (its evidence class without a window: receipt-required)."""


def canonical_pins(pins: Mapping[str, str] | None) -> str:
    """The text an owner row stores for ``pins``: canonical JSON, keys sorted, values as text."""
    return json.dumps({str(k): str(v) for k, v in (pins or {}).items()}, sort_keys=True, separators=(",", ":"))


def held_by(row: OwnerRow) -> ExecutionHeld:
    """The refusal of a claim on ``row``'s scope while its holder's lease runs: who holds it, since when."""
    from contextful.storage.holders import Holder

    parsed = Holder.parse(row.holder) if row.holder is not None else None
    return ExecutionHeld(row.execution_id, row.scope, row.holder, parsed.host if parsed else None,
                         parsed.pid if parsed else None, row.held_since_us, row.lease_expires_us)


def _held_reason(row: OwnerRow) -> str:
    return f"held by {row.holder} until {from_us(row.lease_expires_us).isoformat()}"


def _require_held(row: OwnerRow | None, execution_id: str, holder: str | None,
                  fence: WriterFence | None = None) -> OwnerRow:
    """The row, if ``execution_id`` is its pending execution and (unless None) ``holder`` holds it;
    with ``fence``, the row must still admit that attempt (ExecutionWriterFenced otherwise)."""
    if fence is not None:
        reason = fence.refusal(row)
        if reason is not None:
            raise fence.refuse(reason)
    if row is None or row.execution_id != execution_id:
        raise JournalConflict(execution_id, 0, "no owner holds this execution any more")
    if row.status != PENDING:
        raise JournalConflict(execution_id, 0, f"the owner of scope {row.scope} is {row.status}, not pending")
    if holder is not None and row.holder != holder:
        raise JournalConflict(execution_id, 0, f"lease lost: {_held_reason(row)}")
    return row


class JournalStore(ABC):
    """Owners and steps behind conditional writes; adapters supply storage, this class the rules."""

    hold_blocks_every_owner_write = False
    """Whether :meth:`hold_owners` holds every owner write of the store, other scopes' too (SQLite's
    database write lock), not only the rows it names (PostgreSQL's row locks)."""
    hold_excludes_holds = False
    """Whether a hold admits no second hold of its rows until it ends, the same execution's
    included (D1's callback guard: ``run.callback-guard.acquire``), so one execution's admitted
    callbacks take turns; PostgreSQL's ``FOR SHARE`` holds share."""
    @property
    @abstractmethod
    def location(self) -> str:
        """Where the journal lives (a SQLite file's absolute path, a PostgreSQL DSN and schema, a
        file tree's root): two handles on one journal answer the same location."""

    # --- adapter primitives ---------------------------------------------------------------------

    @abstractmethod
    def _swap_owner(self, change: Callable[[OwnerRow | None], OwnerRow], *, scope: str | None = None,
                    execution_id: str | None = None) -> OwnerRow:
        """Atomically read the owner row of ``scope`` (or of the scope ``execution_id`` was opened
        under, which may since hold a newer execution; None when absent), compute ``change(row)``
        and write its result in its scope's place. An exception from ``change`` writes nothing and
        propagates."""

    @abstractmethod
    def _insert_step(self, row: StepRow, fence: WriterFence | None = None) -> StepRow:
        """Insert ``row`` unless its ``(execution_id, seq)`` is present; return the stored row. With
        ``fence``, check it in the same atomic step and raise ExecutionWriterFenced if it refuses."""

    @abstractmethod
    def owner(self, scope: str) -> OwnerRow | None: ...

    @abstractmethod
    def owners(self) -> list[OwnerRow]:
        """Every owner row, ordered by scope."""

    @abstractmethod
    def steps(self, execution_id: str) -> list[StepRow]:
        """The execution's recorded steps, ordered by sequence number."""

    @abstractmethod
    def collect(self, execution_id: str, below: int | None = None, fence: WriterFence | None = None) -> int:
        """Delete the execution's steps (those with ``seq < below`` when given); return how many.
        With ``fence``, only while that attempt owns the execution (ExecutionWriterFenced otherwise)."""

    @abstractmethod
    def hold_owners(self, execution_id: str, scopes: Sequence[str] = (), fence: WriterFence | None = None,
                    callback: CallbackIdentity | None = None) -> AbstractContextManager[HeldOwners]:
        """Read the owner row ``execution_id`` was opened under and the owner rows of ``scopes``
        (an item's ancestors, entity fences), and hold them against owner writes until the context
        exits, so a takeover, retirement or replacement of any serializes after the held block.
        ``fence`` names the attempt the hold is for: D1, which holds by writing a durable callback
        guard (``storage.d1.guards``), guards the rows only for that attempt and records ``callback``
        (what the admitted callback is) in the guard; the other adapters hold nothing that outlives
        the block and ignore it. PostgreSQL holds the rows ``FOR SHARE``; SQLite holds the database's write lock; the file
        tree reads them under its owner lock and holds nothing after (check-then-act: the next
        conditional owner write of a superseded holder fails instead)."""

    def close_store(self) -> None:
        """Release connections and handles (an adapter with none keeps this no-op)."""

    # --- capabilities -----------------------------------------------------------------------------

    def capabilities(self) -> dict[str, bool]:
        """What an execution over this store can do. Every profile pairs the journal with a blob
        store and an awakeable store beside it (``storage.awakeables``) and writes conditionally (an
        adapter that cannot refuses to open)."""
        return {"journal": True, "blobs": True, "awakeables": True, "conditional_writes": True}

    # --- owner verbs ------------------------------------------------------------------------------

    def claim(self, scope: str, plan_ref: str, holder: str, now_us: int, lease_us: int,
              pins: Mapping[str, str] | None = None) -> OwnerRow:
        """Open or resume the execution under ``scope``.

        No pending owner: a new execution, pending, leased to ``holder``, pinned to ``plan_ref`` and
        ``pins``. A pending owner under the same plan and pins whose lease lapsed
        (``lease_expires_us <= now_us``) or that ``holder`` already holds: the same execution,
        ``attempts + 1``. Pending under another plan: OwnerPlanMismatch; under other pins:
        OwnerPinsMismatch. Pending and leased to another holder: JournalConflict naming the holder
        and the expiry.
        """
        offered = canonical_pins(pins)

        def change(row: OwnerRow | None) -> OwnerRow:
            if row is None or row.status != PENDING:
                return OwnerRow(scope=scope, execution_id=uuid.uuid4().hex, plan_ref=plan_ref, status=PENDING,
                                holder=holder, lease_expires_us=now_us + lease_us, opened_us=now_us,
                                closed_us=None, cursor=None, attempts=1, pins=offered, held_since_us=now_us)
            if row.plan_ref != plan_ref:
                raise OwnerPlanMismatch(scope, row.execution_id, row.plan_ref, plan_ref)
            if row.pins != offered:
                raise OwnerPinsMismatch(scope, row.execution_id, row.pin_map(), json.loads(offered))
            if row.holder != holder and row.lease_expires_us > now_us:
                raise held_by(row)
            since = row.held_since_us if row.holder == holder and row.held_since_us is not None else now_us
            return replace(row, holder=holder, lease_expires_us=now_us + lease_us, attempts=row.attempts + 1,
                           held_since_us=since)

        return self._swap_owner(change, scope=scope)

    def renew(self, execution_id: str, holder: str, now_us: int, lease_us: int,
              fence: WriterFence | None = None) -> OwnerRow:
        """Extend ``holder``'s lease to ``now_us + lease_us``; JournalConflict if it lost the owner
        (ExecutionWriterFenced when ``fence``, its attempt, no longer holds it)."""

        def change(row: OwnerRow | None) -> OwnerRow:
            return replace(_require_held(row, execution_id, holder, fence), lease_expires_us=now_us + lease_us)

        return self._swap_owner(change, execution_id=execution_id)

    def cache_cursor(self, execution_id: str, holder: str, value: str | None,
                     replay_from: int | None = None, fence: WriterFence | None = None) -> OwnerRow:
        """Cache a checkpoint's cursor (JSON text) on the pending owner, and with it, atomically,
        the step a resumption replays from (unchanged when None)."""

        def change(row: OwnerRow | None) -> OwnerRow:
            held = _require_held(row, execution_id, holder, fence)
            return replace(held, cursor=value,
                           replay_from=held.replay_from if replay_from is None else replay_from)

        return self._swap_owner(change, execution_id=execution_id)

    def release(self, execution_id: str, holder: str, now_us: int, fence: WriterFence | None = None) -> OwnerRow:
        """End ``holder``'s lease on its pending owner now, writing no status: the owner stays
        pending and held by nobody, so the next claim under its scope, by any holder, resumes it at
        once; a renewal by the releasing holder after this finds the lease lost."""
        return self._swap_owner(
            lambda row: replace(_require_held(row, execution_id, holder, fence), holder=None, lease_expires_us=now_us,
                                held_since_us=None),
            execution_id=execution_id)

    def close(self, execution_id: str, holder: str, status: str, now_us: int,
              fence: WriterFence | None = None) -> OwnerRow:
        """Settle ``holder``'s pending owner as ``closed-ok``, ``closed-failed`` or ``closed-canceled``."""
        if status not in (CLOSED_OK, CLOSED_FAILED, CLOSED_CANCELED):
            raise ValueError(f"close takes {CLOSED_OK!r}, {CLOSED_FAILED!r} or {CLOSED_CANCELED!r}, not {status!r}")
        return self._swap_owner(
            lambda row: replace(_require_held(row, execution_id, holder, fence), status=status, closed_us=now_us),
            execution_id=execution_id)

    def retire(self, execution_id: str, now_us: int, *, expect: OwnerRow | None = None,
               holder_dead: Callable[[str | None], bool] | None = None) -> OwnerRow:
        """Retire a pending owner whoever holds it (an operator's rewind or an applied declaration);
        the scope's next claim opens a fresh execution.

        ``expect`` is the row the caller's safety check read (``run.own.rewind-unsafe``): the retiring
        write is conditional on it, in the same atomic step — the same holder at the same attempt
        under the same lease, and that lease lapsed at ``now_us`` unless ``holder_dead`` proves its
        holder dead — so a claim or renewal landing between the check and the write makes the
        retirement refuse with ExecutionRewindUnsafe instead of retiring a running attempt."""

        def change(row: OwnerRow | None) -> OwnerRow:
            held = _require_held(row, execution_id, None)
            if expect is not None:
                if (held.holder, held.attempts, held.lease_expires_us) != (
                        expect.holder, expect.attempts, expect.lease_expires_us):
                    raise ExecutionRewindUnsafe(execution_id, f"attempt {held.attempts} of {held.holder} claimed or "
                                                f"renewed it after the check, leased until "
                                                f"{from_us(held.lease_expires_us).isoformat()}")
                if held.lease_expires_us > now_us and not (holder_dead is not None and holder_dead(held.holder)):
                    raise ExecutionRewindUnsafe(execution_id, f"attempt {held.attempts} of {held.holder} holds the "
                                                f"owner lease on {held.scope} until "
                                                f"{from_us(held.lease_expires_us).isoformat()}")
            return replace(held, status=RETIRED, closed_us=now_us)

        return self._swap_owner(change, execution_id=execution_id)

    def request_cancel(self, execution_id: str, now_us: int) -> OwnerRow:
        """Mark ``execution_id``'s pending owner canceled (``run.cancel.not-in-flight``, decision
        "external-signals-single": a single-valued catalog write). A second mark keeps the first
        one's instant; an execution no pending owner holds raises CancelTargetNotInFlight."""

        def change(row: OwnerRow | None) -> OwnerRow:
            if row is None or row.execution_id != execution_id:
                raise CancelTargetNotInFlight(execution_id, "no execution or scope of that name is pending")
            if row.status != PENDING:
                raise CancelTargetNotInFlight(execution_id, f"its owner on {row.scope} is {row.status}")
            return row if row.cancel_requested_us is not None else replace(row, cancel_requested_us=now_us)

        return self._swap_owner(change, execution_id=execution_id)

    # --- steps ------------------------------------------------------------------------------------

    def record(self, execution_id: str, seq: int, label: str, value: bytes, now_us: int | None = None,
               fence: WriterFence | None = None) -> bytes:
        """Record ``value`` as step ``seq`` unless a value is there; return the stored value.

        A second writer of the step (a retry, a resumed attempt, a racing process) gets the first
        recorded value back and no error: replay reads what the first attempt saw. A step recorded
        under another label means the replay diverged from the recording: JournalConflict.

        With ``fence`` the insert is conditional on that attempt still owning the execution, checked
        in the same atomic step (ExecutionWriterFenced otherwise, nothing recorded): an attempt
        whose lease another holder took over records nothing into the execution it lost.
        """
        recorded_us = SystemClock().now_us() if now_us is None else now_us
        stored = self._insert_step(StepRow(execution_id, seq, label, bytes(value), recorded_us), fence)
        if stored.label != label:
            raise JournalConflict(execution_id, seq,
                                  f"step {seq} was recorded as {stored.label!r}; this attempt offers {label!r}")
        return stored.value


def open_journal_store(profile: str, **kwargs: object) -> JournalStore:
    """``files`` (root=…, a local path), ``sqlite`` (path=…), ``postgres`` (dsn=…, schema=…) or ``d1``
    (url=…, token=…, namespace=…: the Worker's binding, ``storage.d1.client``)."""
    if profile == "files":
        from contextful.storage.journal.files import FileJournalStore
        from contextful.storage.objects import ObjectStore

        return FileJournalStore(ObjectStore(str(kwargs["root"])))
    if profile == "sqlite":
        from contextful.storage.journal.sqlite import SqliteJournalStore

        return SqliteJournalStore(str(kwargs["path"]))
    if profile == "postgres":
        from contextful.storage.journal.postgres import PostgresJournalStore

        return PostgresJournalStore(str(kwargs.get("dsn", "")), str(kwargs.get("schema", "contextful")))
    if profile == "d1":
        from contextful.storage.d1.client import D1Client
        from contextful.storage.d1.journal import D1JournalStore

        return D1JournalStore(D1Client.from_arguments(kwargs))
    from contextful.storage.errors import StorageProfileUnknown

    raise StorageProfileUnknown(profile, PROFILES)
