"""Forgetting a pipeline's cursor (``contextful pipeline reset``): the next run reads everything again.

A reset is one commit on the pipeline's table: a run of no rows setting its cursor scope
(``pipeline:<id>``) to null, so the ``files`` source holds no landed input and the ``http`` source
no position. It deletes no row: what the next run reads again meets the rows kept by the
pipeline's write disposition (``engine.land.disposition``): ``merge`` upserts them by key,
``replace`` makes them the table, ``append`` lands them a second time. The seed's commit-once
scope is kept (a seed lands once).

The reset takes the guard a run takes (``engine.land.journal``): it opens the pipeline's execution,
so while a run holds it the reset refuses with ``ExecutionHeld`` (a ``JournalConflict``), and its commit carries the
execution's fence. The commit is in the table's history and in ``run history`` (meta ``reset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contextful.engine.config.manifest import PipelineSpec
from contextful.storage import Store
from contextful.storage.errors import ArgumentInvalid
from contextful.storage.transaction import CommitResult

SOURCES = ("files", "http")


@dataclass(frozen=True)
class ResetPlan:
    pipeline: str
    table: str
    source: str
    disposition: str
    inputs: list[str]
    """files: the landed inputs the cursor holds (each read again by the next run)."""
    position: Any
    """The stored cursor value (an http position; None: nothing to forget)."""
    rows: int
    """Rows the table holds and keeps."""

    @property
    def nothing(self) -> bool:
        return self.position is None

    def consequence(self) -> str:
        """What the next run does with what it reads again, by the write disposition."""
        if self.disposition == "merge":
            return "rows read again merge by primary key: updated keys replaced, none repeated"
        if self.disposition == "replace":
            return "the next run's rows replace the table (its current version stays readable as of its time)"
        return (f"warning: the pipeline appends and has no primary_key: every row read again lands twice beside "
                f"the {self.rows:,} kept (declare primary_key or write_disposition = \"replace\" first, or "
                f"`contextful table drop {self.table}`)")

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "table": self.table, "source": self.source,
                "write_disposition": self.disposition, "rows_kept": self.rows,
                "forgot": {"inputs": self.inputs} if self.source == "files" else {"position": self.position},
                "nothing_to_forget": self.nothing}


def plan_reset(store: Store | None, spec: PipelineSpec) -> ResetPlan:
    """What resetting ``spec`` forgets (``store`` None: nothing has landed)."""
    from contextful.engine.land.pipeline import cursor_scope

    if spec.source.kind not in SOURCES:
        raise ArgumentInvalid("PIPELINE", spec.id, f"a {spec.source.kind} pipeline keeps no source cursor to reset; "
                                                   f"reset forgets the cursor of a {' or '.join(SOURCES)} pipeline")
    value: Any = None
    rows = 0
    if store is not None and spec.table in store.table_names():
        table = store.table(spec.table)
        committed = table.cursor(cursor_scope(spec))
        value = committed[0] if committed is not None else None
        rows = table.count()
    inputs = sorted(value.get("inputs", {})) if isinstance(value, dict) and spec.source.kind == "files" else []
    return ResetPlan(spec.id, spec.table, spec.source.kind, spec.disposition, inputs, value, rows)


def reset_pipeline(store: Store, spec: PipelineSpec) -> CommitResult | None:
    """Forget ``spec``'s cursor under the run's guard; None when there was nothing to forget."""
    from contextful.engine.land.journal import PullJournal
    from contextful.engine.land.pipeline import cursor_scope

    scope = cursor_scope(spec)
    journal = PullJournal.open(store, spec, scope)  # ExecutionHeld while a run holds the pipeline
    try:
        with journal.writing():
            if plan_reset(store, spec).nothing:  # read under the guard: no run moves it meanwhile
                result = None
            else:
                txn = store.table(spec.table).transaction("append", meta={"pipeline": spec.id, "reset": scope})
                txn.set_cursor(scope, None)
                result = txn.commit()
    except BaseException:
        journal.close(ok=False)
        raise
    journal.close(ok=True)
    return result
