"""Firing the applied version: arm it, evaluate due-ness, dispatch units, answer what happened.

Implements, from the control-plane spec:

- ``surface.arm.*`` as serve meets them: the armed set is built from the APPLIED version of the
  manifest (``engine.control.apply``), never the working file, and rebuilt when the applied
  pointer moves (read on each tick and each wake; a node pulling from a control URL polls it
  first, on its cadence and on each wake: ``engine.control.reconcile``). Each head pipeline of a unit
  (``engine.run.units``) with a readable schedule arms one entry; a pipeline with none, one whose
  schedule is unreadable (``ScheduleUnreadable``) and a step or tier declaring a schedule of its own
  (``DispatchUnitNotAHead``: its cadence rides its head) arm nothing and are named once per applied
  version (``surface.arm.unarmed-named``). Next fire from history: the later of the head's last
  journaled run start (its ``pipeline:<id>`` execution, and pulled run states: ``latest_start``) and
  its last dispatch, which the catalog records before the unit starts.
- ``surface.arm.wake-answer``, ``wake-pending-steps``, ``surface.dispatch.refill``: :meth:`ControlPlane.wake`.
- ``surface.fire.cycle``, ``cycle-exit``, ``cycle-drain``, ``cycle-drain-exit``: :meth:`ControlPlane.cycle`.
- ``surface.dispatch.lease-gated``: a process that does not hold the cadence lease arms nothing.
- ``surface.connection.pause``, ``delete`` and ``schedule-scale`` (serve's side): each active connection
  arms one entry ``connection:<id>`` beside the version's (``engine.control.connection_run``), sharing
  the pool and next-fire-from-history; each beat reads the catalog's connection mark (one aggregate
  row) and re-reads the records only when it moved, arming what became active and disarming what
  did not stay so, a fire in flight for it asked to stop (SIGTERM: its run reaches its cancellation
  boundary, as when serve stops).
- ``surface.dispatch.fire-credential-missing`` and ``-zone`` for versions applied while serve runs:
  a version whose store-driven or synthesize fires serve cannot credential arms nothing, and the
  one armed before stays armed (``engine.control.fire_credentials``).

The daemon loop and its drain (``surface.arm.tick-interval``, ``surface.fire.daemon-drain*``) live
in ``engine.control.daemon``; the pool, the lease and the children in ``engine.control.dispatch``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.control.dispatch import CadenceLease, ChildLauncher, Launcher, Outcome, Pool
from contextful.engine.control.fire_credentials import FireIssuer, check_fire_credentials, unit_environment
from contextful.storage.clock import SystemClock, from_us

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.control.arm import ArmedSet, Unarmed
    from contextful.engine.control.drain import DrainResult
    from contextful.engine.control.reconcile import Reconciler
    from contextful.engine.run.units import Unit
    from contextful.storage import Store
    from contextful.storage.clock import Clock

log = logging.getLogger(__name__)

WAKE_BUDGET_S = 24.0
"""How long a wake waits for what it fired before it answers (``surface.arm.wake-answer``: within 25 s)."""
WAIT_STEP_S = 0.1
"""How often a wake or a cycle looks at its running children."""
RUN_STATE_EVERY_US = 5_000_000
"""This node's run state is rewritten at most this often while fires start (and when it stops)."""


@dataclass
class Fire:
    """One dispatched unit: when it started and, once it ended, how."""

    head: str
    members: tuple[str, ...]
    started_us: int
    outcome: Outcome | None = None


@dataclass
class Answer:
    """What a wake or a cycle did: the spec's wake answer, plus what a cycle's drain settled."""

    fired: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    armed: int = 0
    next_due_us: int | None = None
    unarmed: list[dict[str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lease_held_by: str | None = None
    version: int | None = None
    drained: DrainResult | None = None

    @property
    def ok(self) -> bool:
        """No fired unit failed and the drain (if any) failed nothing (``surface.fire.cycle-exit``)."""
        return not self.failed and (self.drained is None or self.drained.ok)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "fired": self.fired, "failed": self.failed, "pending": self.pending, "armed": self.armed,
            "next_due": rfc3339(self.next_due_us),
        }
        doc["unarmed"] = self.unarmed
        if self.failures:
            doc["failures"] = self.failures
        if self.lease_held_by is not None:
            doc["lease_held_by"] = self.lease_held_by
        doc["version"] = self.version
        if self.drained is not None:
            doc["drained"] = self.drained.to_json()
        return doc


def rfc3339(at_us: int | None) -> str | None:
    if at_us is None:
        return None
    return from_us(at_us).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class ControlPlane:
    """The applied version of one project, armed and dispatched under its deployment's cadence lease."""

    def __init__(self, root: Path, open_store: Callable[[], Store], store_url: str | None = None, *,
                 clock: Clock | None = None,
                 launcher: Callable[[int], Launcher] | None = None, holder: str | None = None,
                 say: Callable[[str], None] | None = None, fire_issuer: FireIssuer | None = None,
                 reconciler: Reconciler | None = None) -> None:
        self.root = root
        self.open_store = open_store
        """Opens a handle on the store (the drain takes its own, beside the beat's)."""
        self.store = open_store()
        self.store_url = store_url
        self.clock = clock or SystemClock()
        self.say = say or log.info
        self._results = Path(tempfile.mkdtemp(prefix="contextful-units-"))
        """Where unit children write their outcomes (removed when the plane closes)."""
        self.fire_issuer = fire_issuer
        """Serve's minting of fire credentials (``--issuer-key``; None: children inherit its token)."""
        self.reconciler = reconciler
        """Polls the node's control URL into its snapshot directory (None: it reads its own directory)."""
        self._launcher = launcher or self.child_launcher
        from contextful.engine.control.apply import snapshot_dir

        self.snapshots = snapshot_dir(root)
        """The applied versions (the working file's [control] snapshot_dir, read once at start)."""
        self.deployment = self.snapshots.project
        self.lease = CadenceLease(self.store.catalog, self.deployment, self.clock, holder=holder)
        self.version: int | None = None
        self.manifest: Manifest | None = None
        self.units: dict[str, Unit] = {}
        self.armed: ArmedSet | None = None
        self.unarmed: list[Unarmed] = []
        self.pool: Pool | None = None
        self.fires: dict[str, Fire] = {}
        """The unit in flight under each exclusion key."""
        self.starts: dict[str, int] = {}
        """This node's latest dispatch of each head (its run state)."""
        from contextful.engine.control.history import node_id

        self._node = node_id(root)
        self._pulled: dict[str, list[int]] = {}
        self._state_dirty = False
        self._state_written_us = -RUN_STATE_EVERY_US
        self._lock = threading.RLock()
        self._closed = False
        self._named: int | None = None
        self._unreadable: str | None = None
        self._connections_mark: tuple[int, int] | None = None
        """The catalog's connection mark when the armed connection entries were last read."""

    def child_launcher(self, version: int) -> ChildLauncher:
        """What runs a unit of ``version`` by default: a child process of serve's (``engine.control.child``)."""
        return ChildLauncher(self.root, self.store_url, version, self._results,
                             environment=lambda head: unit_environment(self.manifest, head, self.fire_issuer))

    # --- arming ---------------------------------------------------------------------------------

    def refresh(self, *, poll: bool = False) -> bool:
        """Poll the control source when due (``poll``: now), read the applied pointer; (re)arm when it
        names another version. Whether anything is armed."""
        from contextful.storage.errors import (
            ControlSnapshotUnreadable,
            FireCredentialMissing,
            FireCredentialZoneUnset,
        )

        if self.reconciler is not None and poll:
            self.reconciler.poll()
        elif self.reconciler is not None:
            self.reconciler.poll_if_due()
        try:
            version = self.snapshots.applied()
        except ControlSnapshotUnreadable as exc:
            return self._keep_armed(exc)
        if version is None:
            if self.version is None and self.armed is None:
                return False
            self.say("no applied version any more: nothing armed")
            self.version, self.manifest, self.armed, self.units, self.unarmed = None, None, None, {}, []
            return False
        if version != self.version or self.armed is None:
            try:
                self._arm(version)
            except (ControlSnapshotUnreadable, FireCredentialMissing, FireCredentialZoneUnset) as exc:
                return self._keep_armed(exc)
        self._unreadable = None
        if self.armed is not None:
            self._sync_connections()
        return self.armed is not None

    def _sync_connections(self) -> None:
        """Arm the connections that became active and disarm the ones that stopped being so (a fire in
        flight for one is asked to stop), when the catalog's connection mark moved since last read."""
        from contextful.engine.control.connection_run import PREFIX, armable_connections
        from contextful.engine.control.history import histories

        assert self.armed is not None and self.manifest is not None
        project = self.manifest.project.name
        mark = self.store.catalog.connections_mark(project)
        if mark == self._connections_mark:
            return
        self._connections_mark = mark
        armable, unarmed = armable_connections(self.manifest, self.store.catalog.connections(project))
        wanted = {entry.id for entry in armable}
        gone = [e for e in self.armed.ids() if e.startswith(PREFIX) and e not in wanted]
        for entry in gone:
            self.armed.remove(entry)
            if self.pool is not None and self.pool.stop(entry):
                self.say(f"{entry}: disarmed; its fire in flight is asked to stop")
            else:
                self.say(f"{entry}: disarmed")
        entries = [entry for entry in armable if entry.id not in self.armed]
        found = histories(self.store, self.deployment, [e.id for e in entries], self.clock.now_us(), self._pulled)
        for armed in entries:
            self.armed.add(armed, found[armed.id])
        if entries:
            self.say(f"armed {len(entries)} connection entr{'y' if len(entries) == 1 else 'ies'}")
        named = {u.id for u in self.unarmed}
        for item in unarmed:
            if item.id not in named:
                self.say(f"unarmed: {item.id}: {item.reason}")
        self.unarmed = [u for u in self.unarmed if not u.id.startswith(PREFIX)] + unarmed

    def _keep_armed(self, exc: Exception) -> bool:
        """An applied pointer or version that cannot be read leaves what is armed running (logged once)."""
        if str(exc) != self._unreadable:
            self.say(f"error: {exc}")
        self._unreadable = str(exc)
        return self.armed is not None

    def _arm(self, version: int) -> None:
        from contextful.engine.control.arming import load_armable
        from contextful.engine.control.history import pulled_starts

        manifest, refused = load_armable(self.root, version, self.snapshots)
        # a version whose credentialed fires serve cannot credential arms nothing; the last one stays
        check_fire_credentials(manifest, self.fire_issuer, version=version)
        self._connections_mark = self.store.catalog.connections_mark(manifest.project.name)  # read before the rows
        self._pulled = pulled_starts(self.snapshots.path, self.deployment, exclude_node=self._node)
        units, armed, unarmed = arm_version(manifest, self.store, self.deployment, self.clock.now_us(), self._pulled)
        unarmed += refused
        self.version, self.manifest, self.units, self.armed, self.unarmed = version, manifest, units, armed, unarmed
        for head in units:
            history = armed.history(head)
            if history is not None and history.last_dispatch_us is not None:
                self.starts[head] = max(history.last_dispatch_us, self.starts.get(head, 0))
        pool_bound = manifest.control.pool
        if self.pool is None:
            self.pool = Pool(self._launcher(version), pool_bound)
            self._readopt(self.pool)
        else:  # units in flight keep running under the version they started with
            self.pool.launcher, self.pool.bound = self._launcher(version), pool_bound
        self.say(f"armed v{version}: {len(armed)} entr{'y' if len(armed) == 1 else 'ies'}"
                 + (f", next due {rfc3339(armed.next_due_us())}" if len(armed) else ""))
        if version != self._named:  # once per applied version, however often the lease comes back
            for item in unarmed:
                self.say(f"unarmed: {item.id}: {item.reason}")
            self._named = version

    def _readopt(self, pool: Pool) -> None:
        """Units a previous serve left in flight on workers (``engine.control.relay``: its journaled
        attempts), taken into the pool under their keys as if this plane had fired them."""
        readopt = getattr(pool.launcher, "readopt", None)
        for unit in readopt() if readopt is not None else ():
            if unit.head in pool.running or unit.head not in self.units:
                continue
            pool.running[unit.head] = unit
            self.fires[unit.head] = Fire(unit.head, self.members(unit.head), self.clock.now_us())
            self.say(f"re-adopted {unit.head}: its step in flight on a worker when serve last stopped")

    def _history_of(self, head: str) -> Any:
        """One head's history after its unit ended: its journaled start, the pulled starts as last
        read, and the dispatch this process recorded (no scan of every entry's records)."""
        from contextful.engine.control.arm import History, latest_start
        from contextful.engine.control.history import entry_scope

        owner = self.store.journal.owner(entry_scope(head))
        now = self.clock.now_us()
        start = latest_start(owner.opened_us if owner is not None else None, self._pulled.get(head, ()), now)
        return History(start, self.starts.get(head))

    def members(self, head: str) -> tuple[str, ...]:
        """What one fire of ``head`` runs, as answers name it: a unit's pipelines, then the build
        jobs riding it (``job:<name>``, ``surface.fire.build-dependency``); a job entry alone."""
        from contextful.engine.jobs.after import dependent_builds

        unit = self.units.get(head)
        if unit is None:
            return (head,)
        riding = dependent_builds(self.manifest, unit.members) if self.manifest is not None else []
        return unit.members + tuple(job.identity for job in riding)

    def _record_start(self, head: str, at_us: int) -> None:
        """Keep this node's run state (``engine.control.history``) current: what a pull carries."""

        self.starts[head] = max(at_us, self.starts.get(head, at_us))
        self._state_dirty = True
        if at_us - self._state_written_us >= RUN_STATE_EVERY_US:
            self._write_run_state()

    def _write_run_state(self) -> None:
        from contextful.engine.control.history import write_run_state

        if not self._state_dirty or self.manifest is None:
            return
        try:
            write_run_state(self.snapshots.path, self._node, self.deployment, self.starts)
        except OSError as exc:
            self.say(f"warning: this node's run state could not be written: {exc}")
            return
        self._state_dirty, self._state_written_us = False, self.clock.now_us()

    # --- one evaluation -------------------------------------------------------------------------

    def _reap(self) -> list[Fire]:
        """Collect the units that ended: free their keys, log them, recompute their next fire."""
        if self.pool is None:
            return []
        ended: list[Fire] = []
        for outcome in self.pool.reap():
            fire = self.fires.pop(outcome.head, None)
            if fire is None:
                continue
            fire.outcome = outcome
            ended.append(fire)
            if outcome.canceled:
                self.say(f"{outcome.head}: canceled ({', '.join(outcome.canceled)}: landed nothing)")
            elif outcome.ok:
                self.say(f"{outcome.head}: ok ({', '.join(fire.members)})")
            else:
                self.say(f"{outcome.head}: failed: " + "; ".join(outcome.failures))
            if self.armed is not None and outcome.head in self.armed:
                self.armed.update(outcome.head, self._history_of(outcome.head))
        return ended

    def _admit(self, heads: list[str]) -> tuple[list[Fire], list[str]]:
        """Admit ``heads`` (in admission order) into the pool; the fires started and the heads left pending."""
        assert self.pool is not None and self.armed is not None
        started: list[Fire] = []

        def on_start(head: str, at_us: int) -> None:
            from contextful.engine.control.arm import History

            assert self.armed is not None
            fire = Fire(head, self.members(head), at_us)
            self.fires[head] = fire
            started.append(fire)
            due = self.armed.next_fire(head)
            history = self.armed.history(head)
            self.armed.update(head, History(history.last_start_us if history is not None else None, at_us))
            self._record_start(head, at_us)
            self.say(f"fired {head} (due {rfc3339(due)}; unit: {', '.join(self.members(head))})")

        admission = self.pool.admit(heads, self.lease, started=on_start)
        return started, admission.pending

    def tick(self) -> list[Fire]:
        """One beat of the in-process trigger (``surface.arm.tick-interval``): hold the lease, reap,
        and admit every due unit; the fires started."""
        with self._lock:
            if not self.lease.hold():
                self._disarm_for_lease()
                return []
            if not self.refresh():
                return []
            self._reap()
            assert self.armed is not None
            due = [d.id for d in self.armed.due(self.clock.now_us())]
            started, _pending = self._admit(due)
            if self._state_dirty and self.clock.now_us() - self._state_written_us >= RUN_STATE_EVERY_US:
                self._write_run_state()
            return started

    def keep(self) -> list[Fire]:
        """A beat without evaluation (the external trigger): hold the lease, keep the applied version
        armed, and reap ended units (the fires that ended)."""
        with self._lock:
            if not self.lease.hold():
                self._disarm_for_lease()
                return self._reap()
            self.refresh()
            return self._reap()

    def _disarm_for_lease(self) -> None:
        if self.armed is not None:
            self.say(f"cadence lease held by {self.lease.held_by}: nothing armed")
        self.armed, self.version = None, None

    def wake(self, budget_s: float = WAKE_BUDGET_S, *, wait_all: bool = False) -> Answer:
        """Evaluate due-ness once and dispatch; wait up to ``budget_s`` (``wait_all``: until every unit
        it dispatched ended) admitting what the evaluation left pending into freed slots
        (``surface.dispatch.refill``); answer what fired, failed, stays pending, the armed count and
        the next due instant (``surface.arm.wake-answer``, ``wake-pending-steps``)."""
        answer = Answer()
        waiting = threading.Event()
        deadline = threading.Timer(budget_s, waiting.set) if not wait_all else None
        if deadline is not None:
            deadline.daemon = True
            deadline.start()
        try:
            with self._lock:
                if not self.lease.hold():
                    self._disarm_for_lease()
                    answer.lease_held_by = self.lease.held_by
                    return answer
                if not self.refresh(poll=True):  # surface.reconcile.learns-by-reading: each wake reads the source
                    return self._finish(answer, [], [])
                self._reap()
                assert self.armed is not None
                due = [d.id for d in self.armed.due(self.clock.now_us())]
                fires, pending = self._admit(due)
            while not waiting.is_set():
                with self._lock:
                    held = self.lease.hold()  # renewed while units run: a long unit never lets it lapse
                    self._reap()
                    if pending and held:
                        more, pending = self._admit(pending)
                        fires += more
                    if all(f.outcome is not None for f in fires) and not pending:
                        break
                waiting.wait(WAIT_STEP_S)
            with self._lock:
                self._reap()
                self._write_run_state()
                return self._finish(answer, fires, pending)
        finally:
            if deadline is not None:
                deadline.cancel()

    def _finish(self, answer: Answer, fires: list[Fire], pending: list[str]) -> Answer:
        for fire in fires:
            if fire.outcome is None:
                answer.pending += fire.members
            elif fire.outcome.ok:
                answer.fired += fire.members
            else:
                answer.failed += fire.members
                answer.failures += fire.outcome.failures
        for head in pending:
            answer.pending += self.members(head)
        answer.armed = len(self.armed) if self.armed is not None else 0
        answer.next_due_us = self.armed.next_due_us() if self.armed is not None else None
        answer.unarmed = [{"pipeline": u.id, "reason": u.reason} for u in self.unarmed]
        answer.version = self.version
        return answer

    def cycle(self, *, drain: bool = True) -> Answer:
        """``pipeline serve --cycle``: arm the applied version, evaluate once, wait for every unit it
        dispatched, drain the queue once (``surface.fire.cycle-drain``) before giving the cadence
        lease back, and answer."""
        try:
            answer = self.wake(wait_all=True)
            if answer.lease_held_by is None and drain and self.manifest is not None:
                from contextful.engine.control.drain import drain_queues

                answer.drained = drain_queues(self.store, self.manifest)  # before close() gives the lease back
            return answer
        finally:
            self.close()

    def in_flight(self) -> list[str]:
        with self._lock:
            return sorted(self.fires)

    def close(self, grace_s: float | None = None) -> None:
        """Stop every unit in flight (``surface.dispatch.children-reaped``) and give the lease back."""
        from contextful.engine.control.dispatch import REAP_GRACE_S

        if self._closed:
            return
        self._closed = True
        if self.pool is not None:
            for outcome in self.pool.reap_all(REAP_GRACE_S if grace_s is None else grace_s):
                self.say(f"{outcome.head}: stopped" + (f": {'; '.join(outcome.failures)}" if outcome.failures else ""))
        shutil.rmtree(self._results, ignore_errors=True)
        self.fires.clear()
        self._write_run_state()
        try:
            self.lease.release()
        finally:
            self.store.close()


def plan_entries(manifest: Manifest) -> tuple[dict[str, Unit], list[Any], list[Unarmed]]:
    """The units of ``manifest`` by head, the armed entries of the heads with a readable schedule, and
    every pipeline that arms nothing with its reason (``surface.arm.unarmed-named``).

    Each ``[[job]]`` declaring a schedule arms one entry ``job:<name>`` too, a unit of its own
    (``surface.fire.scheduled-build``, ``scheduled-maintenance``); a build declaring ``after``
    rides its pipeline's unit instead (``engine.jobs.after``), and a job declaring neither arms
    nothing (it fires on ``contextful job fire``) and is named so."""
    from contextful.engine.control.arm import Unarmed, arm_entries, not_heads
    from contextful.engine.run.units import Unit, units_of

    units = {unit.head: unit for unit in units_of(manifest)}
    jobs = {job.identity: job for job in manifest.jobs if job.after is None}
    units |= {entry: Unit(entry, (), (), (entry,)) for entry in jobs}
    entries, unarmed = arm_entries([(head, manifest.pipeline(head).schedule, manifest.pipeline(head).priority)
                                    for head in sorted(units) if head not in jobs]
                                   + [(entry, job.schedule, 0) for entry, job in sorted(jobs.items())])
    for item in unarmed:
        if item.id in jobs and item.error is None:
            unarmed[unarmed.index(item)] = Unarmed(item.id, "declares no schedule: it fires on `contextful job fire`")
    unarmed += [Unarmed(error.entry, f"{error.name}: {error.detail}", error) for error in not_heads(manifest, units.values())]
    return units, entries, unarmed


def arm_version(manifest: Manifest, store: Store | None, deployment: str, now_us: int,
                pulled: dict[str, list[int]]) -> tuple[dict[str, Unit], ArmedSet, list[Unarmed]]:
    """``manifest``'s units by head, its armed set with each entry's history as ``store`` and the
    ``pulled`` run states record it (None: no store yet, so no history), and what arms nothing:
    what serve arms and what ``pipeline status`` shows, computed one way. With a store, each active
    connection arms its entry ``connection:<id>`` too (``engine.control.connection_run``)."""
    from contextful.engine.control.arm import ArmedSet, History
    from contextful.engine.control.history import histories

    units, entries, unarmed = plan_entries(manifest)
    if store is not None:  # surface.connection.schedule-scale: one entry per active connection
        from contextful.engine.control.connection_run import armable_connections

        armable, held = armable_connections(manifest, store.catalog.connections(manifest.project.name))
        entries, unarmed = entries + armable, unarmed + held
    armed = ArmedSet(entries, now_us)
    heads = [e.id for e in entries]
    found = (histories(store, deployment, heads, now_us, pulled) if store is not None
             else {head: History() for head in heads})
    for head, history in found.items():
        armed.update(head, history)
    return units, armed, unarmed
