"""The armed set: each scheduled entry's next fire and which entries are due, in admission order.

Implements ``surface.arm.next-fire-from-history`` (an entry's next fire is the first instant its
schedule admits after the later of its last run start and its last dispatch; an entry with neither
is due when armed), ``surface.arm.catch-up`` (re-armed from a dispatch at ``t``, the next fire is
``next_after(t)``: one fire however many intervals passed), ``surface.arm.pulled-history`` and
``surface.arm.pulled-future`` (:func:`latest_start`), the per-entry half of
``surface.arm.unreadable-schedule`` and the arming half of ``surface.arm.unarmed-named``
(:func:`arm_entries`), and the ordering rule of ``surface.dispatch.admission-order`` (:meth:`ArmedSet.due`).
docs/schedules.md states the rules.

    >>> from contextful.engine.control.schedule import parse_schedule
    >>> armed = ArmedSet([ArmedEntry("orders", parse_schedule("every 1m", "orders"))], armed_us=0)
    >>> [d.id for d in armed.due(0)]
    ['orders']
    >>> armed.update("orders", History(last_start_us=None, last_dispatch_us=0))
    >>> armed.next_due_us()
    60000000

No I/O: the caller (dispatch) reads histories from the catalog and the journal and passes instants
(microseconds since the epoch, UTC). A tick costs O(due · log n): the next fires sit in a heap whose
stale rows (an entry re-armed since) are skipped when they reach its top.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.engine.control.schedule import Schedule, parse_schedule
from contextful.storage.errors import (
    ArgumentInvalid,
    ContextfulError,
    DispatchUnitNotAHead,
    ScheduleUnreadable,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.run.units import Unit

COMPACT_SLACK = 64
"""Stale heap rows tolerated beyond one per entry before the heap is rebuilt from the live rows."""


@dataclass(frozen=True)
class ArmedEntry:
    """One entry of the armed set: a pipeline (or job) id, its schedule and its admission priority."""

    id: str
    schedule: Schedule
    priority: int = 0
    """``[[pipeline]] priority``: higher starts first among entries due at the same instant."""


@dataclass(frozen=True)
class Unarmed:
    """An entry that arms nothing (``surface.arm.unarmed-named``) and why."""

    id: str
    reason: str
    error: ContextfulError | None = None
    """The refusal that held it back (``ScheduleUnreadable``), if one did."""


@dataclass(frozen=True)
class History:
    """What the catalog and journal record of an entry: its last run start and last dispatch."""

    last_start_us: int | None = None
    last_dispatch_us: int | None = None

    @property
    def reference_us(self) -> int | None:
        """The later of the two, the instant the next fire is computed from; None when neither."""
        known = [t for t in (self.last_start_us, self.last_dispatch_us) if t is not None]
        return max(known) if known else None


@dataclass(frozen=True)
class Due:
    """An entry due at a tick, with the fields admission order sorts on."""

    id: str
    next_fire_us: int
    priority: int
    reference_us: int | None

    def admission_key(self) -> tuple[bool, int, int, int, str]:
        """``surface.dispatch.admission-order``: never run (nor dispatched) first, then earliest next
        fire, highest priority, least recent reference, id."""
        return (self.reference_us is not None, self.next_fire_us, -self.priority, self.reference_us or 0, self.id)


def latest_start(local: int | None, pulled: Iterable[int], now_us: int) -> int | None:
    """The last run start of an entry across this node's catalog (``local``) and the pulled run
    states recording it (``surface.arm.pulled-history``); a pulled start later than ``now_us``
    counts as no start (``surface.arm.pulled-future``)."""
    starts = [t for t in pulled if t <= now_us]
    if local is not None:
        starts.append(local)
    return max(starts, default=None)


def arm_entries(candidates: Iterable[tuple[str, str | None, int]]) -> tuple[list[ArmedEntry], list[Unarmed]]:
    """Read each candidate ``(id, schedule text or None, priority)``: the entries that arm, and the
    ones that do not with their reason (no schedule, or ``ScheduleUnreadable`` for that entry alone)."""
    armed: list[ArmedEntry] = []
    unarmed: list[Unarmed] = []
    for entry, text, priority in candidates:
        if text is None:
            unarmed.append(Unarmed(entry, "declares no schedule"))
            continue
        try:
            armed.append(ArmedEntry(entry, parse_schedule(text, entry), priority))
        except ScheduleUnreadable as exc:
            unarmed.append(Unarmed(entry, f"{exc.name}: {exc.diagnostic}", exc))
    return armed, unarmed


class ArmedSet:
    """The armed entries, each with its history and next fire; :meth:`due` answers a tick."""

    def __init__(self, entries: Iterable[ArmedEntry], armed_us: int) -> None:
        self._entries: dict[str, ArmedEntry] = {}
        for entry in entries:
            if entry.id in self._entries:
                raise ArgumentInvalid("entries", entry.id, "two armed entries share this id")
            self._entries[entry.id] = entry
        self._armed_us = armed_us
        self._reference: dict[str, int | None] = dict.fromkeys(self._entries)
        self._history: dict[str, History] = {}
        self._next: dict[str, int] = dict.fromkeys(self._entries, armed_us)
        self._seq = itertools.count()
        self._row: dict[str, int] = {}
        self._heap: list[tuple[int, int, str]] = []
        for entry_id in self._entries:
            self._push(entry_id)
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        """The armed ids, in the order they were given."""
        return list(self._entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._entries

    def schedule(self, entry_id: str) -> Schedule:
        return self._entries[entry_id].schedule

    def history(self, entry_id: str) -> History | None:
        """The history last given for ``entry_id`` (None: none was)."""
        return self._history.get(entry_id)

    def next_fire(self, entry_id: str) -> int:
        """The instant ``entry_id`` next falls due."""
        return self._next[entry_id]

    def update(self, entry_id: str, history: History) -> None:
        """Set ``entry_id``'s history; its next fire becomes the first instant its schedule admits
        after the history's reference, or the armed instant when the history holds neither."""
        entry = self._entries[entry_id]
        reference = history.reference_us
        self._reference[entry_id] = reference
        self._history[entry_id] = history
        self._next[entry_id] = self._armed_us if reference is None else entry.schedule.next_after(reference)
        self._push(entry_id, heap=True)
        if len(self._heap) > 2 * len(self._entries) + COMPACT_SLACK:
            self._heap = [(self._next[i], self._row[i], i) for i in self._entries]
            heapq.heapify(self._heap)

    def add(self, entry: ArmedEntry, history: History) -> None:
        """Arm ``entry`` beside the others (a connection created while serve runs), due from ``history``."""
        if entry.id in self._entries:
            raise ArgumentInvalid("entries", entry.id, "two armed entries share this id")
        self._entries[entry.id] = entry
        self.update(entry.id, history)

    def remove(self, entry_id: str) -> None:
        """Disarm ``entry_id`` (a connection paused or deleted): it falls due no more; its heap rows
        are skipped as stale ones are."""
        del self._entries[entry_id]
        self._reference.pop(entry_id, None)
        self._history.pop(entry_id, None)
        self._next.pop(entry_id, None)
        self._row.pop(entry_id, None)

    def due(self, now_us: int) -> list[Due]:
        """The entries whose next fire is at or before ``now_us``, in admission order. Consumes
        nothing: asked again before an :meth:`update`, it answers the same."""
        live: list[tuple[int, int, str]] = []
        while self._heap and self._heap[0][0] <= now_us:
            row = heapq.heappop(self._heap)
            if self._row.get(row[2]) == row[1]:
                live.append(row)
        for row in live:
            heapq.heappush(self._heap, row)
        found = [Due(entry_id, fire, self._entries[entry_id].priority, self._reference[entry_id])
                 for fire, _, entry_id in live]
        found.sort(key=Due.admission_key)
        return found

    def next_due_us(self) -> int | None:
        """The earliest next fire of any entry (None when nothing is armed)."""
        while self._heap and self._row.get(self._heap[0][2]) != self._heap[0][1]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def _push(self, entry_id: str, heap: bool = False) -> None:
        seq = next(self._seq)
        self._row[entry_id] = seq
        row = (self._next[entry_id], seq, entry_id)
        if heap:
            heapq.heappush(self._heap, row)
        else:
            self._heap.append(row)


def schedule_problems(doc: Mapping[str, Any], manifest: Manifest | None = None) -> list[ContextfulError]:
    """What ``contextful pipeline validate`` reports of the document's schedules, each a problem of
    its pipeline alone: ``ScheduleUnreadable`` for each ``[[pipeline]]`` whose schedule the grammar
    cannot read, and for each ``[[job]]`` (its entry ``job:<name>``) (read from the raw document, so
    it is reported beside every other problem), and,
    given the parsed ``manifest``, ``DispatchUnitNotAHead`` for each step or tier declaring a
    schedule of its own (its cadence rides its head's)."""
    found: list[ContextfulError] = []
    for kind, entry_of in (("pipeline", lambda b: str(b.get("id", "?"))), ("job", lambda b: f"job:{b.get('name', '?')}")):
        blocks = doc.get(kind, [])
        for block in blocks if isinstance(blocks, list) else []:
            if not isinstance(block, dict) or not isinstance(block.get("schedule"), str):
                continue
            try:
                parse_schedule(block["schedule"], entry_of(block))
            except ScheduleUnreadable as exc:
                found.append(exc)
    if manifest is not None:
        from contextful.engine.run.units import units_of

        found += not_heads(manifest, units_of(manifest))
    return found


def not_heads(manifest: Manifest, units: Iterable[Unit]) -> list[DispatchUnitNotAHead]:
    """``surface.dispatch.not-a-head``: each step or tier of ``units`` declaring a schedule of its
    own, refused: its cadence rides its head's (the first head whose unit it is a member of)."""
    units = list(units)
    heads = {u.head for u in units}
    return [DispatchUnitNotAHead(spec.id, next((u.head for u in units if spec.id in u.members), "?"))
            for spec in manifest.pipelines if spec.id not in heads and spec.schedule is not None]
