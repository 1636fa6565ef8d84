"""The execution handle: one interface a derive step or host job runs through.

Implements ``run.journal.substrate-port`` (decision "host-opens-execution": a host opens an
execution through one handle keyed on a declared scope): open or resume under a scope and a
content-hashed plan reference, record step output, commit a cursor, suspend on an awakeable with a
timeout (:meth:`Execution.suspend`, ``run.suspend.awakeable``: see :mod:`engine.run.awakeable`),
attach a retry schedule, describe capabilities.

Also ``run.own.unclosed-execution`` (decision "unclosed-execution-recovers"): only :meth:`close`
writes a status. A handle dropped without it, or a process killed under it, leaves the owner
pending, and the next :func:`open_execution` under its scope resumes the same execution once the
owner lease lapses, replaying the recorded steps instead of computing them again.

Opening registers the handle with the engine keeper (``run.cancel.engine-keeper``,
``engine.run.keeper``), which renews its lease and feeds its cancellation token from the owner's
cancel mark; :meth:`Execution.raise_if_canceled` turns a set token into the Canceled tag and
:meth:`Execution.close_canceled` settles the owner ``closed-canceled`` (``engine.run.cancel``).

    >>> from storage.clock import ManualClock
    >>> from storage.journal import open_journal_store
    >>> import tempfile
    >>> journal = open_journal_store("sqlite", path=tempfile.mkdtemp() + "/journal.sqlite")
    >>> clock, plan = ManualClock(), plan_reference({"pipeline": "orders", "v": 1})
    >>> first = open_execution(journal, "orders", plan, holder="a", lease_s=30, clock=clock)
    >>> first.step("pull page 1", lambda: {"rows": 10})
    {'rows': 10}
    >>> del first                      # dropped without close: the owner stays pending
    >>> clock.advance(30)              # the lease lapses
    >>> again = open_execution(journal, "orders", plan, holder="b", lease_s=30, clock=clock)
    >>> again.resumed, again.step("pull page 1", lambda: {"rows": 99})
    (True, {'rows': 10})
    >>> again.close(ok=True)
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from contextful.engine.run.awakeable import POLL_S, await_resolution, decode_suspension
from contextful.storage.awakeables import AwakeableStore, awakeable_store_beside, wake_waiters
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import ExecutionWriterFenced, JournalConflict, RunCanceled
from contextful.storage.fence import DISPATCH, PUBLICATION, WriterFence, writing_as
from contextful.storage.holders import default_holder, holder_is_dead
from contextful.storage.journal import (
    CLOSED_CANCELED,
    CLOSED_FAILED,
    CLOSED_OK,
    CallbackIdentity,
    JournalStore,
    OwnerRow,
    StepRow,
    canonical_pins,
)

if TYPE_CHECKING:
    from contextful.engine.run.keeper import Keeper
    from contextful.engine.run.owners import Scope
    from contextful.engine.run.retry import RetrySchedule

StepValue = bytes | dict[str, Any]

# A recorded step value starts with one tag byte saying how to read the rest.
_TAG_BYTES = b"b"
_TAG_JSON = b"j"


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def plan_reference(plan: dict[str, Any]) -> str:
    """The content hash pinning an execution: SHA-256 hex of the plan's canonical JSON.

    >>> plan_reference({"b": 1, "a": [1, 2]}) == plan_reference({"a": [1, 2], "b": 1})
    True
    """
    return hashlib.sha256(_canonical_json(plan).encode()).hexdigest()


def _encode(value: StepValue) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return _TAG_BYTES + bytes(value)
    return _TAG_JSON + _canonical_json(value).encode()


def _decode(stored: bytes) -> StepValue:
    tag, body = stored[:1], stored[1:]
    if tag == _TAG_BYTES:
        return body
    if tag == _TAG_JSON:
        decoded: dict[str, Any] = json.loads(body)
        return decoded
    raise ValueError(f"a recorded step value starts with tag {tag!r}, neither {_TAG_BYTES!r} nor {_TAG_JSON!r}")


def recorded_value(row: StepRow) -> StepValue:
    """A recorded step's value as it was recorded (bytes, or the JSON object): what a reader of an
    execution's record (``contextful job history``) reads without opening the execution."""
    return _decode(row.value)


def _never_computed() -> StepValue:
    raise AssertionError("a replayed step is never computed")


class Execution:
    """A claimed execution: record-or-replay steps, cache a cursor, close once.

    Opened by :func:`open_execution`. Nothing happens on drop: there is no ``__del__``, because a
    killed process runs no destructor either, and one event must read one way.
    """

    def __init__(self, journal: JournalStore, scope: str, plan_ref: str, holder: str, lease_us: int,
                 clock: Clock, claim_at_us: int | None = None, *, pins: Mapping[str, str] | None = None) -> None:
        self.journal = journal
        self.scope = scope
        self.plan_ref = plan_ref
        self.pins = canonical_pins(pins)
        """The identities the host supplied beside the plan (canonical JSON), pinned on the owner."""
        self.holder = holder
        self.lease_us = lease_us
        self.clock = clock
        self.retry: RetrySchedule | None = None
        self.closed = False
        self.keeper: Keeper | None = None
        self.cancel_token = threading.Event()
        """Set once the owner carries a cancel mark (``contextful run cancel``); the keeper feeds it."""
        self.admissions = 0
        """Admitted blocks in progress (:meth:`admit`): while one holds the owner row, the keeper
        defers this execution's renewal, which would wait behind the hold (and stall every other)."""
        self.fenced: str | None = None
        """Why this attempt no longer owns its execution, once it learned so (a renewal the keeper
        lost, an effect refused): every later effect refuses at once, before any I/O."""
        row = journal.claim(scope, plan_ref, holder, max(clock.now_us(), claim_at_us or 0), lease_us, pins)
        self.execution_id = row.execution_id
        self._observe_mark(row)  # a resumption of an execution marked canceled stops at its first boundary
        self.attempt = row.attempts
        self.resumed = row.attempts > 1
        self.cached_cursor: dict[str, Any] | None = None if row.cursor is None else json.loads(row.cursor)
        self.lease_expires_us = row.lease_expires_us
        self._replay_from = row.replay_from
        self._next_seq = row.replay_from
        # Steps below the replay point belong before the last cached cursor: never replayed.
        self._recorded: dict[int, StepRow] = {
            step.seq: step for step in journal.steps(row.execution_id) if step.seq >= row.replay_from}

    def __repr__(self) -> str:
        return (f"Execution({self.execution_id}, scope={self.scope!r}, attempt={self.attempt}, "
                f"{'closed' if self.closed else 'open'})")

    def _check_open(self, seq: int) -> None:
        if self.closed:
            raise JournalConflict(self.execution_id, seq, "the execution is closed")
        self.raise_if_fenced()

    # --- fencing (run.journal.current-owner, storage.fence) ---------------------------------------

    @property
    def fence(self) -> WriterFence:
        """This attempt as a writer: every journal write and store commit it makes carries it."""
        return WriterFence(self.execution_id, self.holder, self.attempt, self.journal.location)

    def writing(self) -> AbstractContextManager[WriterFence | None]:
        """A block whose store commits (landing, checkpoints, derive rows, item rows, a build or an
        export run under this execution) and outbox stagings carry this attempt's fence, checked in
        the commit's own transaction: once another attempt holds the execution they refuse with
        ExecutionWriterFenced and nothing of them is visible."""
        return writing_as(self.fence, self.verify_owner)

    def verify_owner(self, boundary: str = PUBLICATION) -> None:
        """Read the owner row now and raise ExecutionWriterFenced unless it still admits this
        attempt (marking it fenced): the check a write that cannot carry the fence makes first."""
        self.raise_if_fenced(boundary)
        reason = self.fence.refusal(self.journal.owner(self.scope))
        if reason is not None:
            self.mark_fenced(reason)
            raise ExecutionWriterFenced(self.execution_id, self.attempt, boundary, reason)

    def mark_fenced(self, reason: str) -> None:
        """Record that this attempt lost its execution (the keeper calls it when a renewal fails)."""
        if self.fenced is None:
            self.fenced = reason

    def raise_if_fenced(self, boundary: str = PUBLICATION) -> None:
        """ExecutionWriterFenced at once if this attempt is known to have lost its execution."""
        if self.fenced is not None:
            raise ExecutionWriterFenced(self.execution_id, self.attempt, boundary, self.fenced)

    def _fenced_write(self, write: Callable[[], Any]) -> Any:
        """Run a fenced journal write; a refusal marks this attempt fenced and propagates."""
        try:
            return write()
        except ExecutionWriterFenced as exc:
            self.mark_fenced(str(exc.fields.get("reason") or exc.detail))
            raise

    # --- steps ------------------------------------------------------------------------------------

    def step(self, label: str, compute: Callable[[], StepValue]) -> StepValue:
        """Record-or-replay the next step.

        A step this execution recorded before (an earlier attempt) returns its recorded value and
        ``compute`` is not called; one recorded under another label raises JournalConflict. A new
        step calls ``compute`` and records its value (bytes, or a JSON object); if another writer
        recorded the step first, its value is returned instead.
        """
        seq = self._next_seq
        stored = self._replayed(seq, label)
        if stored is None:
            stored = self.record_at(seq, label, _encode(compute()))
        self._next_seq = seq + 1
        return _decode(stored)

    def record_at(self, seq: int, label: str, value: bytes) -> bytes:
        """Record the encoded ``value`` as step ``seq`` under this attempt's fence (first writer
        wins; ExecutionWriterFenced, nothing recorded, once another attempt holds the execution)."""
        stored: bytes = self._fenced_write(lambda: self.journal.record(self.execution_id, seq, label, value,
                                                                      self.clock.now_us(), fence=self.fence))
        return stored

    def dispatch(self, label: str, call: Callable[[], StepValue], *, deadline_s: float,
                 fences: Sequence[str | Scope] = ()) -> StepValue:
        """Record-or-replay the next step as an admitted callback (``run.journal.durable-dispatch``):
        a paid provider call or a destination delivery, made at most once per recorded step.

        A step recorded before returns its value and ``call`` is not made. Otherwise the owner lease
        is renewed first to outlive ``deadline_s`` (the callback's bound), the attempt is admitted
        to effect dispatch (:meth:`admit`: still the current writer, its lease running past the
        deadline, each of ``fences`` pending under a lease), ``call`` runs under the hold, and its
        value is recorded before the hold is released: a takeover waits for the hold (PostgreSQL,
        SQLite) and then reads the recorded value instead of calling again.
        """
        seq = self._next_seq
        stored = self._replayed(seq, label)
        if stored is None:
            from contextful.engine.run.dispatch import admitted

            with admitted(self, DISPATCH, [f if isinstance(f, str) else f.key for f in fences],
                          deadline_s=deadline_s) as held:
                stored_row = held.record(StepRow(self.execution_id, seq, label, _encode(call()), self.clock.now_us()))
            if stored_row.label != label:
                raise JournalConflict(self.execution_id, seq, f"step {seq} was recorded as {stored_row.label!r}; "
                                      f"this attempt offers {label!r}")
            stored = stored_row.value
        self._next_seq = seq + 1
        return _decode(stored)

    def _replayed(self, seq: int, label: str) -> bytes | None:
        """The value an earlier attempt recorded at step ``seq`` (None: not recorded); a step
        recorded under another label means the replay diverged: JournalConflict."""
        self._check_open(seq)
        recorded = self._recorded.get(seq)
        if recorded is None:
            return None
        if recorded.label != label:
            raise JournalConflict(self.execution_id, seq,
                                  f"step {seq} was recorded as {recorded.label!r}; this attempt offers {label!r}")
        return recorded.value

    def replay_recorded(self) -> list[tuple[str, StepValue]]:
        """Replay, in order, every step an earlier attempt recorded from the next one on, and return
        each label with its value: a resumption whose steps are keyed by label (a derive run's
        units, answered in whatever order their engines finished) reads back what was answered
        instead of asking again. New steps record after them."""
        replayed: list[tuple[str, StepValue]] = []
        while (recorded := self._recorded.get(self._next_seq)) is not None:
            replayed.append((recorded.label, self.step(recorded.label, _never_computed)))
        return replayed

    @property
    def next_seq(self) -> int:
        """The sequence number the next :meth:`step` records or replays."""
        return self._next_seq

    def cache_cursor(self, value: dict[str, Any]) -> None:
        """Cache a checkpoint's position and marker on the pending owner.

        With it the owner records that a resumption replays from the next step on: the steps
        before it are the pulls the checkpoint committed, which :meth:`collect_steps` removes.
        """
        self._check_open(self._next_seq)
        self._fenced_write(lambda: self.journal.cache_cursor(self.execution_id, self.holder, _canonical_json(value),
                                                             replay_from=self._next_seq, fence=self.fence))
        self.cached_cursor = value
        self._replay_from = self._next_seq

    def discard_recorded(self) -> int:
        """Delete every step still recorded: a resumption that pulls afresh from its cached
        position replays none of the pulls made after it."""
        self._recorded = {}
        collected: int = self._fenced_write(lambda: self.journal.collect(self.execution_id, fence=self.fence))
        return collected

    def collect_steps(self) -> int:
        """Delete the recorded steps the last cached cursor covers; return how many."""
        collected: int = self._fenced_write(
            lambda: self.journal.collect(self.execution_id, below=self._replay_from, fence=self.fence))
        return collected

    # --- lease, retry, capabilities -----------------------------------------------------------------

    def renew(self, min_lease_us: int = 0) -> None:
        """Extend the owner lease by ``lease_s`` (or ``min_lease_us``, when longer) from now. A lost
        owner raises ExecutionWriterFenced (or JournalConflict once closed) and marks this attempt
        fenced, so its next effect refuses at once."""
        self._check_open(self._next_seq)
        row = self._fenced_write(lambda: self.journal.renew(self.execution_id, self.holder, self.clock.now_us(),
                                                            max(self.lease_us, min_lease_us), fence=self.fence))
        self.lease_expires_us = row.lease_expires_us
        self._observe_mark(row)

    def attach_retry(self, schedule: RetrySchedule) -> None:
        """The retry schedule this execution's steps run under (kept on ``.retry``)."""
        self.retry = schedule

    def capabilities(self) -> dict[str, bool]:
        """What this execution can do over its journal store's profile."""
        return self.journal.capabilities()

    # --- awakeables -------------------------------------------------------------------------------

    awakeables: AwakeableStore | None = None
    """The awakeable store :meth:`suspend` mints in (e.g. ``Store.awakeables``); None opens the one
    beside the journal (the same root, SQLite file or PostgreSQL schema) for each suspension that
    is not a replay, and closes it after."""

    def suspend(self, label: str, timeout_s: float, *, on_token: Callable[[str], None] | None = None,
                wait_s: float | None = None, poll_s: float = POLL_S) -> bytes:
        """Suspend on an awakeable as the next step; return the payload it was resolved with.

        The step mints an opaque single-use token (the same token on every attempt of this
        execution: minting is idempotent per step), calls ``on_token(token)`` while it is pending,
        and blocks until someone resolves the token (``AwakeableStore.resolve``, ``POST
        /awake/<token>``) or ``timeout_s`` from the first mint passes. The payload is then recorded
        as the step, so a resumed execution replays it without minting or waiting. Past the
        deadline, AwakeableTimedOut (recorded too: a replay raises it again).

        ``wait_s`` bounds how long this call blocks: once it runs out with the token pending,
        ExecutionSuspended carries the token and nothing is recorded; the owner stays pending, and
        whoever opens the execution next (this holder at once, another once the lease lapses)
        replays to this step and resumes waiting on the same token. A process that dies while
        waiting leaves the same state behind.

        Once the execution is canceled (its cancellation token, fed by the keeper; the mark is read
        durably before an outcome is recorded) the wait ends at once with RunCanceled and nothing
        is recorded as the step; the caller closes it canceled (:meth:`close_canceled`).
        """
        seq = self._next_seq
        stored = self._replayed(seq, label)
        if stored is None:
            awakeables = self.awakeables or awakeable_store_beside(self.journal)
            try:
                stored = await_resolution(self, awakeables, seq, label, timeout_s, on_token=on_token,
                                          wait_s=wait_s, poll_s=poll_s)
            finally:
                if awakeables is not self.awakeables:
                    awakeables.close_store()
        self._next_seq = seq + 1
        return decode_suspension(self.execution_id, seq, label, stored)

    # --- close ------------------------------------------------------------------------------------

    def close(self, ok: bool) -> None:
        """Settle the owner as ``closed-ok`` or ``closed-failed``: the scope's next open starts a new
        execution. The only write of a status (with :meth:`close_canceled`)."""
        self._settle(CLOSED_OK if ok else CLOSED_FAILED)

    def release(self) -> None:
        """Stop this attempt without a status, as a kill would, but at once: the owner stays
        pending, its lease ends now and the keeper stops renewing it, so the next open under its
        scope (any holder, this process's included) resumes the same execution and replays its
        recorded steps. What a transient failure leaves (docs/journal.md)."""
        self._check_open(self._next_seq)
        try:
            self._fenced_write(lambda: self.journal.release(self.execution_id, self.holder, self.clock.now_us(),
                                                            fence=self.fence))
        finally:  # unwritten (the journal is away): nobody renews it, so the lease lapses instead
            self.closed = True  # this handle is done; the execution is not
            if self.keeper is not None:
                self.keeper.deregister(self)

    def _settle(self, status: str) -> None:
        self._check_open(self._next_seq)
        self._fenced_write(lambda: self.journal.close(self.execution_id, self.holder, status, self.clock.now_us(),
                                                      fence=self.fence))
        self.closed = True
        if self.keeper is not None:
            self.keeper.deregister(self)

    # --- cancel (run.cancel.*, engine.run.cancel) ---------------------------------------------------

    def _observe_mark(self, row: OwnerRow) -> None:
        if (row.execution_id == self.execution_id and row.cancel_requested_us is not None
                and not self.cancel_token.is_set()):
            self.cancel_token.set()
            wake_waiters()  # a suspension waiting on an awakeable ends at once (engine.run.awakeable)

    def poll_cancel(self) -> bool:
        """Read the owner's cancel mark (one catalog read); set :attr:`cancel_token` when it is set."""
        row = self.journal.owner(self.scope)
        if row is not None:
            self._observe_mark(row)
        return self.cancel_token.is_set()

    def raise_if_canceled(self, *, durable: bool = False) -> None:
        """Raise :class:`RunCanceled` (the Canceled tag) once the token is set. ``durable``: read the
        mark first, so a boundary that publishes (a commit) sees a cancel the keeper has not yet fed.
        A boundary also stops an attempt known to be fenced (ExecutionWriterFenced)."""
        self.raise_if_fenced()
        if durable and not self.cancel_token.is_set():
            self.poll_cancel()
        if self.cancel_token.is_set():
            raise RunCanceled(self.execution_id, self.scope)

    def close_canceled(self) -> None:
        """Settle the owner as ``closed-canceled``: a terminal status apart from ``closed-failed``."""
        self._settle(CLOSED_CANCELED)

    # --- admission (run.journal.current-owner, run.journal.durable-dispatch) ------------------------

    def admit(self, boundary: str = "effect dispatch", *, fences: Sequence[str | Scope] = (),
              deadline_s: float | None = None,
              callback: CallbackIdentity | None = None) -> AbstractContextManager[OwnerRow]:
        """Admit this attempt to ``boundary`` (``"effect dispatch"`` or ``"state publication"``)
        for the block: immediately before it, the durable owner row must still be this execution's,
        pending, under this plan and pins, leased to this holder's active attempt, and each scope of
        ``fences`` (an item's ancestors, its entity fences) pending under an unexpired lease, or
        ExecutionWriterFenced is raised and the block never runs. With ``deadline_s`` (the bound of
        the admitted callback) the lease is renewed first and must run past that deadline, so no
        takeover can come due while the callback runs. The rows stay held through the
        block (:func:`contextful.engine.run.dispatch.admit` says what each adapter holds); on D1
        the hold is a durable guard recording ``callback`` (``run.callback-guard.identity``)::

            with execution.admit():
                answer = provider.call(request)      # the bounded callback
            execution.step("answer", lambda: answer)  # journal its value after the block
        """
        from contextful.engine.run.dispatch import admit

        return admit(self, boundary, [fence if isinstance(fence, str) else fence.key for fence in fences],
                     deadline_s=deadline_s, callback=callback)


def open_execution(journal: JournalStore, scope: str | Scope, plan_ref: str, *, holder: str | None = None,
                   lease_s: float = 60.0, clock: Clock | None = None, take_over_dead: bool = False,
                   pins: Mapping[str, str] | None = None, keeper: Keeper | None = None) -> Execution:
    """Open a new execution under ``scope``, or resume its pending one.

    ``scope`` is a :class:`~contextful.engine.run.owners.Scope` (a live table, a backfill chunk, a
    host-declared id) or a table's stored key as text; ``pins`` are the identities the host
    supplies beside the plan (a registered body's digests, an input identity), pinned on the owner.

    Resumes when the pending owner is pinned to ``plan_ref`` and its lease lapsed (or ``holder``
    holds it). Raises OwnerPlanMismatch when the pending owner is pinned to another plan, and
    JournalConflict naming the holder and expiry while another holder's lease runs. With
    ``take_over_dead``, a lease whose holder is provably dead (a process of this boot and PID
    namespace that died, SIGKILL or a crash: ``storage.holders``) is taken over at once instead of
    after it lapses; any other holder's lease is waited out.

    The opened execution is registered with ``keeper`` (default: the engine's,
    :func:`~engine.run.keeper.engine_keeper`), which renews its lease and feeds its cancellation
    token until it closes or the handle is dropped (``run.cancel.engine-keeper``).
    """
    from contextful.engine.run.keeper import engine_keeper

    clock = clock or SystemClock()
    holder = holder or default_holder()
    lease_us = int(lease_s * 1_000_000)
    key = scope if isinstance(scope, str) else scope.key
    try:
        execution = Execution(journal, key, plan_ref, holder, lease_us, clock, pins=pins)
    except JournalConflict:
        owner = journal.owner(key)
        if not take_over_dead or owner is None or not holder_is_dead(owner.holder):
            raise
        execution = Execution(journal, key, plan_ref, holder, lease_us, clock, claim_at_us=owner.lease_expires_us,
                              pins=pins)
        execution.renew()
    execution.keeper = keeper or engine_keeper()
    execution.keeper.register(execution)
    return execution
