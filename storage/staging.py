"""A run's staging lease: the catalog knows a run is writing parts before its first part exists.

Collection (``storage.collect``) keeps the objects of a run holding a lease, however long it
stages: only a commit (which ends the lease in its own transaction), an abort, a lapsed lease or a
provably dead holder lets them become orphans. The lease renews while the run's process lives,
whatever the run does meanwhile (a slow source buffering its flush, a fold group taking hours):
the process's :class:`StagingKeeper` renews every held lease each half lease on a thread of its
own, and the run renews it too as it stages. So a lease lapses only when its process stopped (a
crash, a stopped process, a paused host). A run that resumes after collection ended its lease
learns it at its next renewal (StagingLeaseLost) or at its commit (``AssertStaging``, checked in
the commit transaction), and lands nothing.

Tests on an injected clock drive :meth:`StagingKeeper.tick` themselves: the keeper's thread
waits on wall time, so moving a :class:`~storage.clock.ManualClock` never renews a lease behind a
test's back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING

from contextful.storage.errors import StagingLeaseLost
from contextful.storage.holders import default_holder

if TYPE_CHECKING:
    from contextful.storage.catalog import TableHead
    from contextful.storage.store import Store

log = logging.getLogger(__name__)

STAGING_LEASE_S = 3600.0
"""How long a staging run stays known to collection after its last renewal."""

RENEWAL_RETRY_S = 60.0
"""How soon the keeper tries again after a renewal failed for a reason other than a lost lease (a
catalog unreachable for a moment): well inside the half lease still left."""


class StagingLease:
    """Taken at construction and held by the process's keeper; :meth:`renew` as the run stages;
    :meth:`end` when it gives up, :meth:`release` once its commit ended it."""

    head: TableHead | None = None
    """The table's head, read in the transaction that took a run's lease (``run=True``)."""

    def __init__(self, store: Store, table: str, run_id: str, lease_s: float = STAGING_LEASE_S, *,
                 run: bool = False) -> None:
        """Take the lease. ``run``: it opens a run on an existing table (``Catalog.open_run``, one
        round trip): the head read with it is kept as :attr:`head`; TableNotFound takes nothing."""
        self.store = store
        self.table = table
        self.run_id = run_id
        self.holder = default_holder()
        self._lease_us = int(lease_s * 1_000_000)
        self._lock = threading.Lock()  # the run's thread and the keeper's renew one lease
        self.lost = False
        """Collection ended the lease: the run may stage and commit nothing more."""
        self._released = False
        now = store.clock.now_us()
        if run:
            self.head = store.catalog.open_run(table, run_id, self.holder, now, self._lease_us)
        else:
            store.catalog.begin_staging(table, run_id, self.holder, now, self._lease_us)
        self.expires_us = now + self._lease_us
        self._keeper = staging_keeper()
        self._keeper.hold(self)

    @property
    def lease_s(self) -> float:
        return self._lease_us / 1_000_000

    @property
    def due_us(self) -> int:
        """When the next renewal is due, on the store's clock: half a lease after the last one."""
        return self.expires_us - self._lease_us // 2

    def renew(self) -> None:
        """Extend the lease once half of it has run (one catalog write per half lease). A lease
        collection ended meanwhile raises StagingLeaseLost: the run stops before it stages or commits
        more (its commit would be refused anyway, ``AssertStaging``)."""
        with self._lock:
            if self.lost:
                raise StagingLeaseLost(self.table, self.run_id)
            now = self.store.clock.now_us()
            if self._released or now < self.due_us:
                return
            if not self.store.catalog.renew_staging(self.table, self.run_id, now + self._lease_us):
                self.lost = True
                raise StagingLeaseLost(self.table, self.run_id)
            self.expires_us = now + self._lease_us

    def release(self) -> None:
        """Stop renewing: the run's commit ended the lease, or its outcome is unknown and the lease
        is left to lapse (collection then settles what the run left)."""
        with self._lock:
            self._released = True
        self._keeper.drop(self)

    def end(self) -> None:
        """Forget the run (after its objects are deleted); a failure leaves the lease to lapse."""
        self.release()
        try:
            self.store.catalog.end_staging(self.table, self.run_id)
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself; nothing of the run is left
            log.warning("run %s could not end its staging lease: %s", self.run_id, exc)


class StagingKeeper:
    """Renews every held staging lease of this process each half lease, on a daemon thread.

    Leases are held by weak reference: a run dropped without commit or abort (its process going
    on) stops being renewed, and its lease lapses as after a crash. The thread sleeps on wall time
    until the earliest lease's renewal (at most :data:`RENEWAL_RETRY_S` while it holds none), woken
    early only when a lease due before then is held, so a run's opening wakes no thread; a renewal that
    fails for a passing reason is tried again after :data:`RENEWAL_RETRY_S`, and one finding its
    lease ended marks it lost (the run's next stage or commit fails by name).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._dead: list[int] = []  # leases collected meanwhile (a weakref callback only appends)
        self._held: dict[int, tuple[weakref.ref[StagingLease], float]] = {}  # id -> (lease, wall due)
        self._thread: threading.Thread | None = None
        self._wake_at = 0.0
        """When the thread's sleep ends (monotonic; past while it is awake: it reads the held leases
        again before it sleeps)."""

    def hold(self, lease: StagingLease) -> None:
        key = id(lease)
        ref = weakref.ref(lease, lambda _ref: self._dead.append(key))
        with self._cond:
            self._purge()
            due = time.monotonic() + lease.lease_s / 2
            self._held[key] = (ref, due)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="staging-keeper", daemon=True)
                self._thread.start()
            elif due < self._wake_at:  # woken only for a lease due before it wakes anyway, not per run
                self._cond.notify()

    def drop(self, lease: StagingLease) -> None:
        self._forget(id(lease))

    def _forget(self, key: int) -> None:
        with self._cond:
            self._held.pop(key, None)
            self._purge()

    def _purge(self) -> None:
        """Forget the leases garbage collection took (under the condition's lock)."""
        while self._dead:
            key = self._dead.pop()
            entry = self._held.get(key)
            if entry is not None and entry[0]() is None:
                del self._held[key]

    def held(self) -> list[StagingLease]:
        """The leases this keeper renews now."""
        with self._cond:
            self._purge()
            refs = [ref for ref, _due in self._held.values()]
        return [lease for lease in (ref() for ref in refs) if lease is not None]

    def tick(self) -> int:
        """Renew every held lease due on its store's clock; the number renewed."""
        return self._renew(self.held())

    def _run(self) -> None:
        while True:
            with self._cond:
                self._purge()
                now = time.monotonic()
                due = [ref() for ref, at in self._held.values() if at <= now]
                if not due:
                    self._wake_at = min((at for _ref, at in self._held.values()), default=now + RENEWAL_RETRY_S)
                    self._cond.wait(self._wake_at - now)
                    continue
            self._renew([lease for lease in due if lease is not None])

    def _renew(self, leases: list[StagingLease]) -> int:
        renewed = 0
        for lease in leases:
            retry = False
            before = lease.expires_us
            try:
                lease.renew()
            except StagingLeaseLost:
                log.warning("collection ended the staging lease of run %s on %s: the run will land nothing",
                            lease.run_id, lease.table)
                self.drop(lease)
                continue
            except Exception as exc:  # noqa: BLE001 - a renewal tried again soon; the lease has half its time left
                log.warning("renewing the staging lease of run %s on %s failed (trying again): %s",
                            lease.run_id, lease.table, exc)
                retry = True
            renewed += lease.expires_us != before
            wait = RENEWAL_RETRY_S if retry else (lease.due_us - lease.store.clock.now_us()) / 1_000_000
            with self._cond:
                entry = self._held.get(id(lease))
                if entry is not None and entry[0]() is lease:
                    self._held[id(lease)] = (entry[0], time.monotonic() + max(wait, 0.0))
        return renewed


_keeper: StagingKeeper | None = None
_keeper_lock = threading.Lock()


def staging_keeper() -> StagingKeeper:
    """The keeper of this process: made, and its thread started, on first use."""
    global _keeper
    with _keeper_lock:
        if _keeper is None:
            _keeper = StagingKeeper()
        return _keeper


def _forget_after_fork() -> None:
    """A forked child has no keeper thread and holds none of its parent's leases."""
    global _keeper, _keeper_lock
    _keeper, _keeper_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
