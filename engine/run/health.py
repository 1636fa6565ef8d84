"""Upstream health: the last settled outcome of each table's runs, canceled runs skipped.

Implements the second half of ``run.cancel.distinct-terminal-status`` (decision
"external-signals-single"): ``canceled`` is a terminal status apart from ``failed``, and upstream
health observations skip it. An operator stopping a run says nothing about whether its source or
its table is healthy, so a canceled run neither spoils a table's health nor restores it: the
observation is the newest run that settled ``committed`` or ``failed``. A run still ``planned``
has not settled and is skipped too. The control plane asks this before firing a job over an
upstream table; ``engine.run.units`` reads the same rule when deciding whether a pipeline's
``after`` upstreams failed.

    >>> from contextful.storage import Store
    >>> import pyarrow as pa, tempfile
    >>> store = Store.open(tempfile.mkdtemp())
    >>> _ = store.append("orders", pa.table({"id": [1]}))
    >>> upstream_health(store, ["orders", "items"])["orders"].status
    'committed'
    >>> upstream_health(store, ["orders", "items"])["items"] is None
    True
    >>> store.close()
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from contextful.storage.run_record import HISTORY

if TYPE_CHECKING:
    from contextful.storage import Store

SETTLED = ("committed", "failed")
"""The statuses a health observation reads; ``canceled`` and ``planned`` are skipped."""


@dataclass(frozen=True)
class Observation:
    """The run a table's health rests on."""

    table: str
    run_id: str
    status: str
    """``committed`` or ``failed``."""
    recorded_at: datetime
    error: str | None
    """The failed run's error name."""

    @property
    def healthy(self) -> bool:
        return self.status == "committed"


def upstream_health(store: Store, tables: Iterable[str]) -> dict[str, Observation | None]:
    """Per table of ``tables``: its newest settled run (None when no run of it settled)."""
    wanted = list(dict.fromkeys(tables))
    latest: dict[str, Observation | None] = dict.fromkeys(wanted)
    if not wanted:
        return latest
    marks = ", ".join("?" for _ in wanted)
    # a table's observation is its last settled row in the history's order (time, run id, phase)
    settled = store.runs.select(
        f"SELECT table_name, run_id, status, recorded_at, error FROM {HISTORY}"
        f" WHERE status IN ({', '.join(repr(s) for s in SETTLED)}) AND table_name IN ({marks})"
        " QUALIFY row_number() OVER (PARTITION BY table_name"
        " ORDER BY recorded_at DESC, run_id DESC, phase <> 'plan' DESC, phase DESC) = 1", wanted).to_pylist()
    for row in settled:  # one row per wanted table
        latest[row["table_name"]] = Observation(row["table_name"], row["run_id"], row["status"],
                                                row["recorded_at"], row["error"])
    return latest
