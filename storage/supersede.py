"""A derive output table's supersede rule: a unit's newer settling landing retires its older rows.

Implements ``run.emit.stale-supersedes``, ``run.emit.version-retained`` and, at the store level,
``run.select.key-change`` (decisions "derivation-key-decides", "derived-unit-follows",
"host-registered-derive"); docs/store.md, "Supersede rules".

A table declares the rule at creation (``Store.create_table(..., supersede=Supersede(...))``); the
catalog keeps it in the table's merge declaration beside ``order_by`` (:meth:`Supersede.to_json`).
Every reader applies it inside ``storage.snapshot.snapshot_sql``, after the primary-key merge:

A *landing* is one commit (a part's ``ord_seq``). The rule's facts are the landings themselves, read
from every stored row of the snapshot (before the key merge: a landing happened, whatever later rows
override): a unit *settled* under a derivation key at a commit when that commit landed a row of the
unit with ``status`` ``ok`` or ``empty``. A row the key merge answers is then withheld when

(a) a later commit settled its unit under another derivation key, or
(b) it is a marker (``kind = 'marker'``) whose status is not settling, and a later commit settled its
    unit under any key.

So a unit's old rows answer until its new ok/empty landing commits (no reader sees the unit empty),
and after key A, then B, then A again, only the last A landing's rows answer. A row with a null in a
unit column belongs to no unit: it is never withheld and settles nothing. A null status is not
settling; a null kind is not a marker.

The rule is set-shaped: two window aggregates partitioned by unit over the scanned rows (the
latest settling landing and its key, then the latest settling landing under any other key) and a
filter, no per-row subquery.

>>> Supersede(("unit_ref",)).to_json()
{'unit': ['unit_ref'], 'key': 'derivation_key', 'status': 'unit_status', 'kind': 'kind'}
>>> Supersede.from_json({'unit': ['unit_ref', 'task_version']}).unit
('unit_ref', 'task_version')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SETTLING = ("ok", "empty")
"""Statuses whose landing settles a unit under its derivation key."""
MARKER = "marker"
"""The ``kind`` of a unit's marker row (passages carry ``passage``)."""

TOP = "__cf_top"
"""The internal column holding a row's unit's latest settling landing: ``{s: commit, k: key}``."""
SEQ = "__cf_seq"
"""The internal column holding the commit (``ord_seq``) that landed a row."""
KEEP = "__cf_keep"
"""The internal column saying whether the primary-key merge answers a row."""


@dataclass(frozen=True)
class Supersede:
    """Which columns the supersede rule reads (docs/store.md)."""

    unit: tuple[str, ...]
    """The columns naming a unit: ``("unit_ref",)``, or ``("unit_ref", "task_version")`` when rows
    under each task version stay current beside each other (``retain_versions``)."""
    key: str = "derivation_key"
    """The derivation key a row was landed under."""
    status: str = "unit_status"
    """The unit's status on the row: ``ok``/``empty`` settle (:data:`SETTLING`)."""
    kind: str = "kind"
    """``passage`` or ``marker``."""

    def __post_init__(self) -> None:
        if not self.unit:
            raise ValueError("a supersede rule names at least one unit column")

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.unit, self.key, self.status, self.kind)

    def to_json(self) -> dict[str, Any]:
        return {"unit": list(self.unit), "key": self.key, "status": self.status, "kind": self.kind}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Supersede:
        defaults = cls(("unit",))
        return cls(tuple(doc["unit"]), doc.get("key", defaults.key), doc.get("status", defaults.status),
                   doc.get("kind", defaults.kind))

    def describe(self) -> str:
        return (f"supersede(unit={', '.join(self.unit)}; key={self.key}; status={self.status};"
                f" kind={self.kind})")


def _settling(status: str) -> str:
    return f"({status} IN ({', '.join(repr(s) for s in SETTLING)}))"


def latest_settling(rule: Supersede, column: Callable[[str], str]) -> str:
    """The window aggregate giving each row its unit's latest settling landing ``{s, k}`` (the
    largest key among several settling in that commit; NULL: the unit never settled).

    ``column`` maps a rule column to its expression in the relation (with :data:`SEQ` beside it).
    """
    units = ", ".join(column(u) for u in rule.unit)
    return (f"max(CASE WHEN {_settling(column(rule.status))} AND NOT {_unit_null(rule, column)}"
            f" THEN struct_pack(s := {SEQ}, k := {column(rule.key)}) END) OVER (PARTITION BY {units})")


def withheld(rule: Supersede, column: Callable[[str], str]) -> str:
    """True for a row the rule withholds, over a relation holding :data:`SEQ` and :data:`TOP`.

    The latest settling landing under a key other than the row's is ``TOP.s`` when the row's key is
    not ``TOP.k``, else the latest settling landing under any key but ``TOP.k`` (a second window).
    """
    units = ", ".join(column(u) for u in rule.unit)
    key = column(rule.key)
    other = (f"max(CASE WHEN {_settling(column(rule.status))} AND {key} IS DISTINCT FROM {TOP}.k"
             f" AND NOT {_unit_null(rule, column)} THEN {SEQ} END) OVER (PARTITION BY {units})")
    by_other_key = f"(CASE WHEN {key} IS NOT DISTINCT FROM {TOP}.k THEN {other} ELSE {TOP}.s END) > {SEQ}"
    open_marker = (f"({column(rule.kind)} IS NOT DISTINCT FROM {MARKER!r}"
                   f" AND NOT coalesce({_settling(column(rule.status))}, false) AND {TOP}.s > {SEQ})")
    return f"(NOT {_unit_null(rule, column)} AND coalesce({by_other_key} OR {open_marker}, false))"


def _unit_null(rule: Supersede, column: Callable[[str], str]) -> str:
    return "(" + " OR ".join(f"{column(u)} IS NULL" for u in rule.unit) + ")"
