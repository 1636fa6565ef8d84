"""The bounded fire pool: the cadence lease, admission, exclusion keys and the child processes.

Implements, from the control-plane spec's "dispatch" section:

- ``surface.dispatch.lease-gated``: a serve process dispatches only while it holds its deployment's
  cadence lease (:class:`CadenceLease`, a row in the catalog: the SQLite file locally, PostgreSQL
  when shared). Every dispatch is recorded in the catalog in one transaction with a check that the
  lease is still this process's and unexpired (``Catalog.record_dispatch``), so a process that lost
  the lease while it was deciding starts nothing.
- ``surface.dispatch.pool-bound``: at most ``pool`` units run at once (4 by default, ``[control]
  pool``); a due unit past the bound stays armed and reports pending.
- ``surface.dispatch.admission-order``: due units are admitted in the armed set's order
  (``engine.control.arm``), each recorded (``surface.arm.next-fire-from-history``: the catalog
  records the dispatch before the unit starts).
- ``surface.dispatch.exclusion-key``: a unit's exclusion key is its head pipeline's id; a unit due
  while its key is in flight starts no second instance, and its next fire is recomputed from its
  history once the first ends.
- ``surface.dispatch.children-reaped``: each unit runs in a child process of its own process group
  (:class:`ChildLauncher`); :meth:`Pool.reap_all` signals each live group SIGTERM, SIGKILLs what is
  left after 10 s, and returns once every child has exited.

What runs a unit is a :class:`Launcher`: serve's is :class:`ChildLauncher` (``python -m
contextful.engine.control.child``, which runs the unit of the applied version through
``engine.run.units``); the pool knows nothing of what a unit does.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from contextful.storage.holders import default_holder

if TYPE_CHECKING:
    from contextful.storage.catalog import CadenceHolder, Catalog
    from contextful.storage.clock import Clock

log = logging.getLogger(__name__)

POOL = 4
"""The fire pool's bound when ``[control] pool`` names none."""
LEASE_S = 30.0
"""How long a taken cadence lease lasts without a renewal."""
RENEW_S = 10.0
"""A holder renews its lease once this long has passed since the last renewal (ticks come every 500 ms)."""
REAP_GRACE_S = 10.0
"""How long a SIGTERMed child group has before SIGKILL."""


class CadenceLease:
    """This process's hold on its deployment's cadence lease (``surface.dispatch.lease-gated``)."""

    def __init__(self, catalog: Catalog, deployment: str, clock: Clock, *, holder: str | None = None,
                 lease_s: float = LEASE_S, renew_s: float = RENEW_S) -> None:
        self.catalog = catalog
        self.deployment = deployment
        self.clock = clock
        self.holder = holder or default_holder()
        self.lease_us = int(lease_s * 1_000_000)
        self.renew_us = int(renew_s * 1_000_000)
        self.row: CadenceHolder | None = None
        """The lease as last read: this process's, or the other holder's."""

    @property
    def held(self) -> bool:
        row = self.row
        return row is not None and row.holder == self.holder and row.expires_us > self.clock.now_us()

    @property
    def held_by(self) -> str | None:
        """The other process holding the lease when this one does not (None: this one holds it, or nobody)."""
        row = self.row
        return row.holder if row is not None and row.holder != self.holder else None

    def hold(self) -> bool:
        """Take the lease, or renew it when a renewal is due; whether this process holds it now."""
        now = self.clock.now_us()
        row = self.row
        if row is not None and row.holder == self.holder and row.expires_us - now > self.lease_us - self.renew_us:
            return True
        was_held = self.held
        self.row = self.catalog.take_cadence(self.deployment, self.holder, now, self.lease_us)
        if was_held and not self.held:
            log.warning("cadence lease of %s lost to %s: dispatching nothing until it is free",
                        self.deployment, self.row.holder)
        return self.held

    def record_dispatch(self, entry: str) -> bool:
        """Record ``entry``'s dispatch under the lease (False, nothing recorded: the lease is not ours)."""
        recorded = self.catalog.record_dispatch(self.deployment, entry, self.holder, self.clock.now_us())
        if not recorded:
            self.row = self.catalog.cadence_holder(self.deployment)
        return recorded

    def release(self) -> None:
        if self.row is not None and self.row.holder == self.holder:
            self.catalog.release_cadence(self.deployment, self.holder)
        self.row = None


@dataclass(frozen=True)
class Outcome:
    """How one dispatched unit ended."""

    head: str
    ok: bool
    failures: tuple[str, ...] = ()
    """One line per failed member (``pipeline: Error: detail``), or why the child itself failed."""
    canceled: tuple[str, ...] = ()
    """The members whose run was canceled at its boundary (serve stopping it, its connection paused)."""


class Launched(Protocol):
    head: str

    def poll(self) -> Outcome | None:
        """The unit's outcome once it ended (None: still running)."""

    def terminate(self) -> None:
        """Ask the unit to stop (SIGTERM to its process group)."""

    def kill(self) -> None:
        """Stop it now (SIGKILL to its process group)."""

    def wait(self, timeout_s: float | None) -> Outcome | None:
        """Wait up to ``timeout_s`` for the unit to end; its outcome, or None when it still runs."""


class Launcher(Protocol):
    def launch(self, head: str) -> Launched: ...


@dataclass
class _Child:
    head: str
    process: subprocess.Popen[bytes]
    result: Path
    outcome: Outcome | None = None

    def poll(self) -> Outcome | None:
        if self.outcome is None and self.process.poll() is not None:
            self.outcome = self._read()
        return self.outcome

    def wait(self, timeout_s: float | None) -> Outcome | None:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)  # the child leads its own group: its pid is the group's id
            except ProcessLookupError:
                pass

    def _read(self) -> Outcome:
        code = self.process.returncode
        try:
            doc = json.loads(self.result.read_text())
        except (OSError, ValueError):
            why = f"signal {-code}" if code < 0 else f"exit status {code}"
            return Outcome(self.head, False, ((f"{self.head}: the unit's child process ended by {why} "
                                              "before it reported an outcome"),))
        finally:
            self.result.unlink(missing_ok=True)
        return Outcome(self.head, bool(doc.get("ok")) and code == 0, tuple(doc.get("failures", ())),
                       tuple(doc.get("canceled", ())))


class ChildLauncher:
    """Runs each unit as ``python -m contextful.engine.control.child`` in a process group of its own,
    against the applied version ``version`` of the project at ``root``; a job entry (``job:<name>``)
    as ``contextful job fire <name> --version <version>``, in a process group of its own too; a
    connection entry (``connection:<id>``) as the unit child, which runs the connection's instance
    (``engine.control.connection_run``). The child's stdout joins serve's stderr (its log), so serve's
    own stdout stays its answers.
    ``environment(head)`` is the child's environment (``engine.control.fire_credentials.unit_environment``;
    None: serve's own)."""

    def __init__(self, root: Path, store_url: str | None, version: int, results: Path,
                 environment: Callable[[str], dict[str, str] | None] | None = None) -> None:
        self.root = root
        self.store_url = store_url
        self.version = version
        self.results = results
        """Where each child writes its outcome (its caller's directory: it outlives versions)."""
        self.environment = environment

    def launch(self, head: str, extra: Sequence[str] = ()) -> Launched:
        """Start ``head``'s child; ``extra`` arguments go to a unit's child (``engine.control.child``)."""
        from contextful.engine.control.history import JOB_PREFIX

        result = self.results / f"{head.replace(':', '_')}.{os.urandom(4).hex()}.json"
        if head.startswith(JOB_PREFIX):  # surface.fire.scheduled-maintenance: the job's own command
            argv = [sys.executable, "-m", "contextful.engine.cli", "--project", str(self.root)]
            argv += ["--store", self.store_url] if self.store_url else []
            argv += ["job", "fire", head[len(JOB_PREFIX):], "--version", str(self.version), "--result", str(result)]
        else:
            argv = [sys.executable, "-m", "contextful.engine.control.child", "--project", str(self.root),
                    "--version", str(self.version), "--unit", head, "--result", str(result)]
            if self.store_url:
                argv += ["--store", self.store_url]
            argv += extra
        env = self.environment(head) if self.environment is not None else None
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), env=env,
                                   start_new_session=True)  # its own session: its own process group
        return _Child(head, process, result)


@dataclass
class Admission:
    """What one evaluation of due units did."""

    started: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    """Due and not started: past the pool's bound, or its key in flight (in admission order)."""
    lease_held_by: str | None = None
    """The other process holding the cadence lease (then nothing was admitted)."""


class Pool:
    """The running units, at most ``bound`` at once, one per exclusion key."""

    def __init__(self, launcher: Launcher, bound: int = POOL) -> None:
        self.launcher = launcher
        self.bound = bound
        self.running: dict[str, Launched] = {}
        self._lock = threading.Lock()

    def admit(self, due: Sequence[str], lease: CadenceLease,
              started: Callable[[str, int], None] | None = None) -> Admission:
        """Start each of ``due`` (in admission order) that its key and the bound allow, recording each
        dispatch under ``lease`` first; ``started(head, at_us)`` is told of each start."""
        admission = Admission()
        with self._lock:
            for head in due:
                if head in self.running or len(self.running) >= self.bound or admission.lease_held_by:
                    admission.pending.append(head)
                    continue
                if not lease.record_dispatch(head):
                    admission.lease_held_by = lease.held_by or "nobody (the lease lapsed)"
                    admission.pending.append(head)
                    continue
                at = lease.clock.now_us()
                self.running[head] = self.launcher.launch(head)
                admission.started.append(head)
                if started is not None:
                    started(head, at)
        return admission

    def reap(self) -> list[Outcome]:
        """The outcomes of the units that ended since the last reap (their slots and keys freed)."""
        ended: list[Outcome] = []
        with self._lock:
            for head, unit in list(self.running.items()):
                outcome = unit.poll()
                if outcome is not None:
                    del self.running[head]
                    ended.append(outcome)
        return ended

    def in_flight(self) -> list[str]:
        with self._lock:
            return sorted(self.running)

    def stop(self, head: str) -> bool:
        """Ask ``head``'s unit in flight to stop (SIGTERM to its group: its run reaches its cancellation
        boundary); its outcome is reaped as any other's. Whether one was in flight."""
        with self._lock:
            unit = self.running.get(head)
        if unit is None:
            return False
        unit.terminate()
        return True

    def reap_all(self, grace_s: float = REAP_GRACE_S) -> list[Outcome]:
        """``surface.dispatch.children-reaped``: SIGTERM each live unit's group, SIGKILL what is left
        after ``grace_s``, and return once every child has exited (their outcomes)."""
        with self._lock:
            units = list(self.running.values())
            self.running.clear()
        for unit in units:
            unit.terminate()
        deadline = threading.Event()
        timer = threading.Timer(grace_s, deadline.set)
        timer.start()
        try:
            outcomes: list[Outcome] = []
            for unit in units:
                outcome = None
                while outcome is None and not deadline.is_set():
                    outcome = unit.wait(0.1)
                if outcome is None:
                    unit.kill()
                    outcome = unit.wait(None)
                if outcome is not None:
                    outcomes.append(outcome)
            return outcomes
        finally:
            timer.cancel()
