"""Isolated items: what names a store-driven item, the entity it writes for, its budget, and parking.

Implements ``surface.delegate.defer-parks`` with the job's ``isolated_items`` declaration
(``engine.config.jobs.IsolatedItems``; docs/jobs.md, "Isolated items and parking"):

- an item is named by the ``logical_key`` column (else the statement's first column), its entity is
  ``(entity_namespace, the entity_key column's value)`` (:func:`item_entity`), and its budget is
  ``max_attempts`` (else the job's ``retry`` attempts: :func:`item_budget`);
- a delegate's defer answer of an isolated item is journaled as the item's attempt step
  (:meth:`Deferral.step`) and PARKS it: the item is neither terminal nor retried in this fire, no
  thread waits for it, and the fire ends with the execution pending. A later fire reads the
  deferral back (:meth:`Deferral.recorded`) and :func:`admission` decides: before its retry_at the
  item stays parked and is sent nothing; at or after it (the engine's instant, the store clock) the
  item is re-admitted under its next attempt. A defer is no failed attempt: the item's failed-attempt
  count stays as it was, so the budget's ``max_attempts`` counts failures alone and the re-admitted
  item may fail as often as before its defer (the scenario of ``defer-parks``). Each request still
  carries its own attempt number (the envelope's ``attempt``, its journal step), counting defers.

Decision ``terminal-item-s``: an isolated item's run ids are digests of its execution and key
(``engine.jobs.store_driven.attempt_run_id``), and its receipt sits in a catalog cursor keyed by a
digest (``engine.run.items``), which no read face exposes.

    >>> from datetime import UTC, datetime
    >>> at = datetime(2030, 1, 1, 0, 10, tzinfo=UTC)
    >>> deferred = Deferral.recorded(Deferral(1, at).step())
    >>> admission(deferred, 3, datetime(2030, 1, 1, 0, 5, tzinfo=UTC)).parked_until == at
    True
    >>> admitted = admission(deferred, 3, at)
    >>> admitted.first, admitted.last          # attempt 2 on; three failures still allowed
    (2, 4)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec

DEFER = "defer"
"""The journal value's field holding a deferral's retry_at (RFC 3339 UTC)."""


def rfc3339(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Deferral:
    """A defer answer to one attempt of an isolated item: the attempt it answered, its retry_at, and
    how many defers the item has had, this one included."""

    attempt: int
    retry_at: datetime
    defers: int = 1

    def step(self) -> dict[str, Any]:
        """The journal value of the attempt's step (``row/<key>/delegate/<attempt>``)."""
        return {DEFER: rfc3339(self.retry_at), "attempt": self.attempt, "defers": self.defers}

    @classmethod
    def recorded(cls, value: Any) -> Deferral | None:
        """The deferral a journaled step value holds (None: it holds none)."""
        if not isinstance(value, dict) or DEFER not in value:
            return None
        return cls(int(value["attempt"]), datetime.fromisoformat(value[DEFER]), int(value.get("defers", 1)))


class ItemParked(Exception):
    """An isolated item's attempt was answered defer: the item is parked, not failed."""

    def __init__(self, deferral: Deferral) -> None:
        super().__init__(f"parked until {rfc3339(deferral.retry_at)}")
        self.deferral = deferral


@dataclass(frozen=True)
class Admission:
    """What a fire does with an item: the attempts it may make, or that it stays parked."""

    first: int = 1
    """The attempt the item is handed over under."""
    last: int = 1
    """The last attempt it may make in this fire: its budget, plus one for each earlier defer (a defer
    is no failed attempt)."""
    parked_until: datetime | None = None
    """Set: the item stays parked until then and is sent nothing."""


def admission(deferral: Deferral | None, budget: int, now: datetime, answered: bool = False) -> Admission:
    """How this fire (at the engine's instant ``now``) admits an item whose last recorded defer is
    ``deferral`` (None: none), under ``budget`` failed attempts; ``answered``: a later attempt's
    answer is recorded too (it lands, whatever the clock says)."""
    if deferral is None:
        return Admission(1, budget)
    if deferral.retry_at > now and not answered:
        return Admission(parked_until=deferral.retry_at)
    return Admission(deferral.attempt + 1, budget + deferral.defers)


def item_budget(job: JobSpec) -> int:
    """An item's attempts: ``isolated_items.max_attempts``, else the job's retry attempts."""
    from contextful.engine.run.retry import RetrySchedule

    isolated = job.isolated_items
    if isolated is not None and isolated.max_attempts is not None:
        return isolated.max_attempts
    return RetrySchedule.from_config(dict(job.retry)).attempts


def key_column(job: JobSpec, columns: list[str]) -> str | None:
    """The column naming the items: ``isolated_items.logical_key``, else the first (None: there is none)."""
    if job.isolated_items is not None:
        return job.isolated_items.logical_key
    return columns[0] if columns else None


def item_entity(job: JobSpec, key: str, row: dict[str, Any]) -> tuple[str, str] | None:
    """The entity (namespace, key) an isolated item writes for; None for a job without isolated items."""
    isolated = job.isolated_items
    if isolated is None:
        return None
    namespace = isolated.entity_namespace or job.identity
    return namespace, key if isolated.entity_key is None else str(row[isolated.entity_key])
