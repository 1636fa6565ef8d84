"""Where a job's executions live: the host scope ``job:<name>``, and the start its cadence reads.

Implements the substrate half of ``surface.fire.scheduled-history``: a scheduled job computes its
next fire from its host execution's recorded start, failed attempts included. The owner row of
the scope holds the latest execution, whatever its status (pending, closed-ok, closed-failed,
closed-canceled, retired), and its ``opened_us`` is when that execution opened; a resumption of a
pending execution keeps it (the execution started then, not at the resumption).

    >>> job_scope("score-documents").key
    'host:job:score-documents'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.engine.run.owners import Scope

if TYPE_CHECKING:
    from contextful.storage.journal import JournalStore


def job_scope(name: str) -> Scope:
    """The host scope every execution of job ``name`` opens under (its dispatch identity ``job:<name>``)."""
    return Scope.host(f"job:{name}")


def last_start_us(journal: JournalStore, name: str) -> int | None:
    """When the latest execution of job ``name`` opened (None: it never ran), whatever it ended as:
    what serve's armed set takes as the job's last journaled start."""
    owner = journal.owner(job_scope(name).key)
    return None if owner is None else owner.opened_us
