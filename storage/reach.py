"""A credential's reach: the tables a store handle may read and write (``surface.dispatch.fire-reach``).

A job's child process opens its store under the reach of the fire credential it admitted at start
(``engine.jobs.admission``): ``Store.open(..., reach=Reach(...))``. The store checks every table
access against it where the access happens, so no caller can skip the check:

- read: ``Table.snapshot_at`` (every read of a table's rows: ``Table.snapshot``, ``to_arrow``,
  the read path's views) and ``Store.pin`` naming tables; ``Store.pin`` of every table pins only
  the tables the reach reads, so the read path's views (``engine.read.attach_views``) hold no view
  of another table;
- write: ``Store.create_table``, ``Store.drop_table``, ``Store.fold``, a run's transaction
  (``RunTransaction``: ``append``, ``replace``, a model build's run) and a table's declarations.

Anything else is :class:`~contextful.storage.errors.ReachRefused` naming the subject, the access
and the table, raised before a byte is read or staged. Names compare case-insensitively, as DuckDB
compares them. The reserved tables (``_runs``, ``_items``) are the run substrate's own record of
what a fire did, written under every fire: a reach never governs them. A grant on a table also
covers its dead-letter table (:func:`dead_letter_table`): the rows a job could not land in it.

``read-individual`` is carried (``surface.dispatch.fire-individual``) for what reads
per-individual rows; a table grants it only where a credential names it.

    >>> reach = Reach("svc://job/claims", read=frozenset({"mentions"}), write=frozenset({"claims"}))
    >>> reach.admits("read", "Mentions"), reach.admits("write", "claims_dead_letters"), reach.admits("read", "users")
    (True, True, False)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from contextful.storage.errors import ReachRefused
from contextful.storage.reserved import RESERVED_TABLES

ACCESSES = ("read", "write", "read-individual")
"""What a grant gives on a table."""
DEAD_LETTERS = "_dead_letters"
"""The suffix naming a table's dead-letter table."""


def dead_letter_table(table: str) -> str:
    """The table holding the rows a job could not land in ``table``, with the reason."""
    return f"{table}{DEAD_LETTERS}"


@dataclass(frozen=True)
class Reach:
    """What one credential's holder may do with a store's tables."""

    subject: str
    """Who holds it (the credential's ``sub``: ``svc://job/<name>`` for a fire)."""
    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()
    read_individual: frozenset[str] = frozenset()

    @classmethod
    def from_grants(cls, subject: str, grants: Mapping[str, Iterable[str]]) -> Reach:
        """The reach a credential's ``grants`` claim (access -> table names) states."""
        sets = {access: frozenset(str(t).lower() for t in grants.get(access, ())) for access in ACCESSES}
        return cls(subject, sets["read"], sets["write"], sets["read-individual"])

    def grants(self) -> dict[str, list[str]]:
        """The ``grants`` claim stating this reach (each access's tables, sorted)."""
        return {"read": sorted(self.read), "write": sorted(self.write), "read-individual": sorted(self.read_individual)}

    def _granted(self, access: str) -> frozenset[str]:
        return {"read": self.read, "write": self.write, "read-individual": self.read_individual}[access]

    def admits(self, access: str, table: str) -> bool:
        """Whether ``access`` on ``table`` is within this reach."""
        if table in RESERVED_TABLES:
            return True
        name = table.lower()
        granted = self._granted(access)
        return name in granted or (name.endswith(DEAD_LETTERS) and name[: -len(DEAD_LETTERS)] in granted)

    def admit(self, access: str, table: str) -> None:
        """ReachRefused unless ``access`` on ``table`` is within this reach."""
        if not self.admits(access, table):
            raise ReachRefused(self.subject, access, table, tuple(sorted(self._granted(access))))


def check_reach(reach: Reach | None, access: str, table: str) -> None:
    """:meth:`Reach.admit` for a store handle's reach (None: the handle is not limited)."""
    if reach is not None:
        reach.admit(access, table)


def readable(reach: Reach | None, names: Iterable[str]) -> list[str]:
    """The names of ``names`` ``reach`` reads (every one when the handle is not limited)."""
    return list(names) if reach is None else [n for n in names if reach.admits("read", n)]


def grants_problem(grants: Any) -> str | None:
    """Why a credential's ``grants`` claim is not access -> list of table names (None: it is)."""
    if not isinstance(grants, dict) or not set(grants) <= set(ACCESSES):
        return f"the 'grants' claim must map {', '.join(ACCESSES)} to table names"
    if not all(isinstance(v, list) and all(isinstance(t, str) and t for t in v) for v in grants.values()):
        return "each grant of the 'grants' claim must be a list of table names"
    return None
