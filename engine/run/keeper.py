"""The engine keeper: one thread per engine renewing every open execution's owner lease.

Implements ``run.cancel.engine-keeper`` (decision "unclosed-execution-recovers": an unclosed
execution recovers by lease takeover, and one keeper per engine renews leases). Opening an
execution registers it with the process's keeper (:func:`engine_keeper`); closing it, or dropping
the handle (garbage collection, the process ending), deregisters it. The keeper holds each
execution by weak reference only, and a drop writes nothing: the owner stays pending and its lease
lapses, as after a crash (``run.own.unclosed-execution``).

A renewal that fails because another attempt holds the owner now marks the execution fenced
(:meth:`Execution.mark_fenced`): its next effect refuses with ExecutionWriterFenced at once
(``run.journal.current-owner``). On its own thread the keeper hands each due renewal or poll to a
small pool, so one renewal waiting on a slow or locked catalog never lets the other leases lapse;
renewals that an admitted callback's hold would block (SQLite's write lock, counted per journal
location whichever handle holds it) are deferred until the hold ends.

For each registered execution the keeper keeps two deadlines on its own clock: the renewal, half
a lease after the last one, and the cancel poll, :data:`CANCEL_POLL_S` after the last read. Both
sit in one heap, and the keeper's thread sleeps on a condition variable until the earliest of
them, woken early when an execution registers or deregisters. A renewal or a poll reads the
owner's cancel mark (``contextful run cancel``) and, once it is set, sets the execution's
cancellation token, which the landing path checks at its pull and commit boundaries
(``engine.run.cancel``). Polling stops once the token is set; renewal goes on until the execution
closes, so nobody takes its scope over while it settles.

Tests inject a :class:`~storage.clock.ManualClock` and drive :meth:`Keeper.tick` themselves
(``start=False``), or run the thread and wait on an execution's token.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import ExecutionWriterFenced, JournalConflict, TransientError

if TYPE_CHECKING:
    from contextful.engine.run.execution import Execution

log = logging.getLogger(__name__)

CANCEL_POLL_S = 1.0
"""How often the keeper reads a registered execution's cancel mark between renewals."""

RENEWAL_THREADS = 8
"""Renewals and polls the keeper's thread has in flight at once, each on a thread of its own: a
renewal that waits (a catalog's busy timeout, a slow network) holds up only its own execution."""


@dataclass(eq=False)
class _Entry:
    ref: weakref.ref[Execution]
    execution_id: str
    renew_every_us: int
    renew_due_us: int
    poll_due_us: int
    gone: bool = False

    @property
    def due_us(self) -> int:
        return min(self.renew_due_us, self.poll_due_us)


class Keeper:
    """Renews the owner lease of every registered execution and feeds its cancellation token."""

    def __init__(self, clock: Clock | None = None, *, poll_s: float = CANCEL_POLL_S, start: bool = True) -> None:
        self.clock = clock or SystemClock()
        self.poll_us = int(poll_s * 1_000_000)
        self._cond = threading.Condition(threading.RLock())  # a weakref callback may run on the keeper's thread
        self._heap: list[tuple[int, int, _Entry]] = []
        self._entries: dict[int, _Entry] = {}  # id(execution) -> its entry, while registered
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._renewers: ThreadPoolExecutor | None = None
        """Where the thread's renewals run (None: :meth:`tick` renews inline, as tests drive it)."""
        if start:
            self._renewers = ThreadPoolExecutor(RENEWAL_THREADS, thread_name_prefix="contextful-keeper-renewal")
            self._thread = threading.Thread(target=self._run, name="contextful-keeper", daemon=True)
            self._thread.start()

    # --- registration -----------------------------------------------------------------------------

    def register(self, execution: Execution) -> None:
        """Keep ``execution``'s lease from now on: renewed every half lease, its cancel mark polled."""
        now = self.clock.now_us()
        key = id(execution)
        every = max(1, execution.lease_us // 2)
        entry = _Entry(weakref.ref(execution, lambda _ref: self._forget(key)), execution.execution_id, every,
                       renew_due_us=now + every, poll_due_us=now + self.poll_us)
        with self._cond:
            old = self._entries.pop(key, None)
            if old is not None:
                old.gone = True
            self._entries[key] = entry
            self._push(entry)
            self._cond.notify_all()

    def deregister(self, execution: Execution) -> None:
        """Stop keeping ``execution`` (it closed)."""
        self._forget(id(execution))

    def _forget(self, key: int) -> None:
        with self._cond:
            entry = self._entries.pop(key, None)
            if entry is not None:
                entry.gone = True  # its heap item is dropped when it comes up
                self._cond.notify_all()

    def registered(self) -> list[str]:
        """The execution ids kept now, in registration order."""
        with self._cond:
            return [e.execution_id for e in self._entries.values()]

    def next_due_us(self) -> int | None:
        """The earliest deadline of a registered execution (what the thread sleeps until), or None."""
        with self._cond:
            self._drop_gone()
            return self._heap[0][0] if self._heap else None

    # --- the work ---------------------------------------------------------------------------------

    def tick(self) -> int | None:
        """Renew or poll every execution whose deadline has come; answer the next deadline."""
        now = self.clock.now_us()
        due: list[_Entry] = []
        with self._cond:
            self._drop_gone()
            while self._heap and self._heap[0][0] <= now:
                entry = heapq.heappop(self._heap)[2]
                if not entry.gone:
                    due.append(entry)
        for entry in due:  # journal I/O outside the lock: registering never waits on a catalog
            if self._renewers is None:
                self._finish(entry, self._keep(entry, now))
            else:  # each on a thread of its own: one slow or blocked renewal never delays the others
                self._renewers.submit(self._keep_then_finish, entry, now)
        return self.next_due_us()

    def _keep_then_finish(self, entry: _Entry, now: int) -> None:
        self._finish(entry, self._keep(entry, now))

    def _finish(self, entry: _Entry, kept: bool) -> None:
        """Put ``entry`` back on the heap for its next deadline, or forget it; wake the thread."""
        if not kept:
            self._forget_entry(entry)
            return
        with self._cond:
            if not entry.gone:
                self._push(entry)
            self._cond.notify_all()

    def _keep(self, entry: _Entry, now: int) -> bool:
        """One renewal or poll of ``entry``; False once its execution is gone, closed or lost."""
        execution = entry.ref()
        if execution is None or execution.closed:
            return False
        try:
            if entry.renew_due_us <= now and _held(execution):  # it would wait behind an admitted callback
                entry.renew_due_us = now + self.poll_us
                execution.poll_cancel()
            elif entry.renew_due_us <= now:
                execution.renew()
                entry.renew_due_us = now + entry.renew_every_us
            else:
                execution.poll_cancel()
            entry.poll_due_us = now + self.poll_us
        except (JournalConflict, ExecutionWriterFenced) as exc:  # the lease was lost, or it closed meanwhile
            if not execution.closed:
                # its next effect refuses at once (run.journal.current-owner), not at the next commit
                execution.mark_fenced(f"the keeper's renewal found the owner lost: {exc.detail}")
                log.warning("keeper: execution %s lost its owner; it is fenced: %s", entry.execution_id, exc.detail)
            return False
        except TransientError as exc:  # a catalog hiccup: tried again after a poll interval
            if entry.renew_due_us <= now:
                log.warning("keeper: renewing execution %s failed, retrying in %s s: %s", entry.execution_id,
                            self.poll_us / 1_000_000, exc)
                entry.renew_due_us = now + self.poll_us
            entry.poll_due_us = now + self.poll_us
        except Exception as exc:  # noqa: BLE001 - e.g. its journal store was closed: retrying cannot help
            log.warning("keeper: no longer keeping execution %s (its lease will lapse): %s", entry.execution_id, exc)
            return False
        if execution.cancel_token.is_set():
            entry.poll_due_us = entry.renew_due_us  # the mark is seen: only renewals remain
        return True

    def _forget_entry(self, entry: _Entry) -> None:
        with self._cond:
            for key, held in list(self._entries.items()):
                if held is entry:
                    del self._entries[key]
            entry.gone = True

    def _push(self, entry: _Entry) -> None:
        heapq.heappush(self._heap, (entry.due_us, next(self._order), entry))

    def _drop_gone(self) -> None:
        while self._heap and self._heap[0][2].gone:
            heapq.heappop(self._heap)

    def _run(self) -> None:
        while True:
            pause_s: float | None = None
            try:
                self.tick()
            except Exception:
                log.exception("keeper pass failed; the next pass is in %s s", self.poll_us / 1_000_000)
                pause_s = self.poll_us / 1_000_000  # never a busy loop over a failing pass
            with self._cond:
                due = self.next_due_us()
                if pause_s is None and due is not None:
                    pause_s = (due - self.clock.now_us()) / 1_000_000
                if pause_s is None or pause_s > 0:
                    self._cond.wait(pause_s)  # until the earliest deadline, or a (de)registration


def _held(execution: Execution) -> bool:
    """Whether renewing ``execution`` now would wait behind an admitted callback's hold: its own, or
    any on its journal (whichever handle of this process opened it) where a hold blocks every owner
    write (SQLite)."""
    from contextful.engine.run.dispatch import holds_at

    journal = execution.journal
    return bool(execution.admissions or (journal.hold_blocks_every_owner_write and holds_at(journal.location)))


_engine_keeper: Keeper | None = None
_engine_lock = threading.Lock()


def engine_keeper() -> Keeper:
    """The keeper of this engine (process): made, and its thread started, on first use."""
    global _engine_keeper
    with _engine_lock:
        if _engine_keeper is None:
            _engine_keeper = Keeper()
        return _engine_keeper


def _forget_after_fork() -> None:
    """A forked child has no keeper thread and keeps none of its parent's executions."""
    global _engine_keeper, _engine_lock
    _engine_keeper, _engine_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
