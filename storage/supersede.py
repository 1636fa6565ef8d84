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
unit with ``status`` ``ok``, ``empty`` or ``retired``. A row the key merge answers is then withheld when

(a) a later commit settled its unit under another derivation key, or
(b) it is a marker (``kind = 'marker'``) whose status is not settling, and a later commit settled its
    unit under any key, or
(c) its status is ``retired`` (:data:`RETIRED`).

A *retirement* (a row with status ``retired``, landed under a key no derivation yields) settles its
unit like ``ok``/``empty`` and is itself never answered: from its commit on the unit answers nothing
until a later landing (decision "derived-unit-follows": a derived unit whose parent left takes its
rows with it; ``engine.derive.retire``).

So a unit's old rows answer until its new ok/empty landing commits (no reader sees the unit empty),
and after key A, then B, then A again, only the last A landing's rows answer. A row with a null in a
unit column belongs to no unit: it is never withheld and settles nothing. A null status is not
settling; a null kind is not a marker.

The rule is set-shaped (:func:`ruled_sql`): a hash aggregate of the settling landings by unit and
key, two per-unit aggregates over that small relation (the latest settling landing and its key, and
the latest under any other key), one hash join onto the merged rows and a filter; no per-row
subquery and no window over the rows (``bench/bench_supersede.py``: about 2x the plain keyed read).

>>> Supersede(("unit_ref",)).to_json()
{'unit': ['unit_ref'], 'key': 'derivation_key', 'status': 'unit_status', 'kind': 'kind'}
>>> Supersede.from_json({'unit': ['unit_ref', 'task_version']}).unit
('unit_ref', 'task_version')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RETIRED = "retired"
"""The status of a retirement: it settles its unit and is never answered (rule (c))."""
SETTLING = ("ok", "empty", RETIRED)
"""Statuses whose landing settles a unit under its derivation key."""
MARKER = "marker"
"""The ``kind`` of a unit's marker row (passages carry ``passage``)."""

SEQ = "__cf_seq"
"""The internal column holding the commit (``ord_seq``) that landed a scanned row."""
TOP_SEQ, TOP_KEY = "__cf_top_s", "__cf_top_k"
"""A unit's latest settling landing: its commit, and its key (the largest among several)."""
OTHER = "__cf_other"
"""A unit's latest settling landing under a key other than :data:`TOP_KEY`."""
LATEST = "__cf_ks"
"""A unit's latest settling landing under one key."""
LANDED, UNITS = "__cf_landed", "__cf_units"
"""The relations of the ruled query: each unit's settling landings by key, and each unit's facts
(:data:`TOP_SEQ`, :data:`TOP_KEY`, :data:`OTHER`)."""
NAMES = (SEQ, TOP_SEQ, TOP_KEY, OTHER, LATEST, LANDED, UNITS)
"""Every name the ruled query adds (none reaches the user's namespace)."""


@dataclass(frozen=True)
class Supersede:
    """Which columns the supersede rule reads (docs/store.md)."""

    unit: tuple[str, ...]
    """The columns naming a unit: ``("unit_ref",)``, or ``("unit_ref", "task_version")`` when rows
    under each task version stay current beside each other (``retain_versions``)."""
    key: str = "derivation_key"
    """The derivation key a row was landed under."""
    status: str = "unit_status"
    """The unit's status on the row: ``ok``/``empty``/``retired`` settle (:data:`SETTLING`)."""
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


def settling(status: str) -> str:
    """Whether the status expression ``status`` settles its unit (NULL for a null status)."""
    return f"({status} IN ({', '.join(repr(s) for s in SETTLING)}))"


def open_marker(rule: Supersede, column: Callable[[str], str]) -> str:
    """Whether a row (its columns' expressions from ``column``) is a marker that did not settle: any
    later settling landing of its unit withholds it."""
    return (f"({column(rule.kind)} IS NOT DISTINCT FROM {MARKER!r}"
            f" AND NOT coalesce({settling(column(rule.status))}, false))")


def ruled_sql(rule: Supersede, scanned: str, rows: str, inner: Callable[[str], str], winner: str,
              columns: str) -> str:
    """The rows the key merge answers less those the rule withholds, as one SELECT.

    ``scanned`` selects every scanned row under internal names plus :data:`SEQ`; ``rows`` is the
    alias the other expressions qualify columns by, ``inner(name)`` a column's quoted internal
    name, ``winner`` the key merge's QUALIFY condition and ``columns`` the projection back to the
    user's columns. Set-shaped: one hash aggregate of the settling landings by unit and key, two
    per-unit aggregates over that (small) relation, and one hash join onto the merged rows.
    """
    units = [inner(u) for u in rule.unit]
    key = inner(rule.key)
    known = " AND ".join(f"{rows}.{u} IS NOT NULL" for u in units)  # a null unit settles nothing
    unit_list = ", ".join(units)
    landed = (f"SELECT {', '.join(f'{rows}.{u}' for u in units)}, {rows}.{key}, max({rows}.{SEQ}) AS {LATEST}"
              f" FROM ({scanned}) AS {rows} WHERE {settling(f'{rows}.{inner(rule.status)}')} AND {known}"
              f" GROUP BY ALL")
    # Per unit: its latest settling commit, the largest key settled then, and the latest settling
    # commit under any other key (that commit again when two keys settled in it). Hash aggregates
    # and a join over the small relation of settling landings: no window.
    tops = f"SELECT {unit_list}, max({LATEST}) AS {TOP_SEQ} FROM {LANDED} GROUP BY ALL"
    at_top = f"{LATEST} = {TOP_SEQ}"
    facts = (f"SELECT {unit_list}, any_value({TOP_SEQ}) AS {TOP_SEQ}, max({key}) FILTER (WHERE {at_top}) AS {TOP_KEY},"
             f" CASE WHEN count(*) FILTER (WHERE {at_top}) > 1 THEN any_value({TOP_SEQ})"
             f" ELSE max({LATEST}) FILTER (WHERE {LATEST} < {TOP_SEQ}) END AS {OTHER}"
             f" FROM {LANDED} JOIN ({tops}) USING ({unit_list}) GROUP BY ALL")
    joined = " AND ".join(f"{rows}.{u} = {UNITS}.{u}" for u in units)
    other_key = (f"(CASE WHEN {rows}.{key} IS NOT DISTINCT FROM {UNITS}.{TOP_KEY} THEN {UNITS}.{OTHER}"
                 f" ELSE {UNITS}.{TOP_SEQ} END) > {rows}.{SEQ}")
    withheld_marker = (f"({open_marker(rule, lambda name: f'{rows}.{inner(name)}')}"
                       f" AND {UNITS}.{TOP_SEQ} > {rows}.{SEQ})")
    retired = f"{rows}.{inner(rule.status)} IS NOT DISTINCT FROM {RETIRED!r}"
    # The scan is written out twice, not shared: the settling landings read three columns of it,
    # and a shared scan would be materialized whole.
    return (f"WITH {LANDED} AS ({landed}), {UNITS} AS ({facts})"
            f" SELECT {columns} FROM (SELECT * FROM ({scanned}) AS {rows} QUALIFY {winner}) AS {rows}"
            f" LEFT JOIN {UNITS} ON {joined} WHERE NOT coalesce({other_key} OR {withheld_marker} OR {retired}, false)")
