"""The child process of ``test_orchestrate``'s crash tests: one provider step, killed at a point.

    python -m tests.engine.run.provider_step_child KIND LOCATION SCHEMA STORE CALLS POINT

Opens the journal of one adapter (``KIND`` files, sqlite or postgres at ``LOCATION``, with
``SCHEMA`` for postgres) and the store at ``STORE``, opens the workflow :data:`WORKFLOW` as holder
``w`` at :data:`T0`, and runs one provider step of :func:`land_orders`. At ``POINT`` it prints
``stall POINT`` and blocks until the parent kills it with SIGKILL, so nothing after the point runs:

- ``unit-committed``: the unit's table commit returned; nothing else of the step is written yet.
- ``unit-closed``: the journal closed the unit's execution (``closed-ok``).
- ``pointer-recorded``: the journal recorded the workflow's step (the commit pointer).

A point the step never reaches prints ``done``. The hooks only observe: they wrap the journal's
``close`` and ``record`` and call through unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
from contextful.engine.run.execution import plan_reference
from contextful.engine.run.keeper import Keeper
from contextful.engine.run.orchestrate import EngineOrchestrator, ExecutionHandle
from contextful.engine.run.owners import Scope
from contextful.storage import ManualClock, Store

from tests.storage.test_journal_conformance import JournalSite

T0 = 1_700_000_000_000_000
LEASE_S = 30.0
WORKFLOW = Scope.host("workflow:nightly")
WORKFLOW_PLAN = plan_reference({"workflow": "nightly", "v": 1})
UNIT = Scope.table("pipeline:orders")
UNIT_PLAN = plan_reference({"pipeline": "orders", "v": 1})
TABLE = "orders"
SOURCE_ROWS = 5
"""The source holds ids 0..4; the unit lands those after its table's committed cursor."""


def land_orders(store: Store, calls: Path, after_commit: Callable[[], None] = lambda: None
                ) -> Callable[[ExecutionHandle], int]:
    """A table pull as the land path runs one: a resumed execution discards the pulls it recorded
    and pulls afresh from the cursor its table committed, the rows landing with their cursor in one
    commit. Each run of the body appends its attempt to ``calls``."""

    def unit(execution: ExecutionHandle) -> int:
        with calls.open("a") as out:
            out.write(f"{execution.attempt}\n")
        if execution.resumed:
            execution.discard_recorded()
        committed = store.table(TABLE).cursor(UNIT.key) if TABLE in store.table_names() else None
        start = 0 if committed is None else int(committed[0])
        page = execution.step(f"pull from {start}", lambda: {"ids": list(range(start, SOURCE_ROWS))})
        assert isinstance(page, dict)
        if not page["ids"]:  # everything the source holds has landed: the pointer is the landing commit
            assert committed is not None
            return committed[1]
        result = store.append(TABLE, pa.table({"id": pa.array(page["ids"], pa.int64())}),
                              cursor=(UNIT.key, SOURCE_ROWS))
        after_commit()
        execution.cache_cursor({"position": SOURCE_ROWS, "commit_seq": result.commit_seq})
        return result.commit_seq

    return unit


def main() -> None:
    kind, location, schema, token, store_dir, calls, point = sys.argv[1:]
    journal = JournalSite(kind, location, schema, token).open()
    store = Store.open(store_dir)
    clock = ManualClock(T0)
    orchestrator = EngineOrchestrator(journal, clock=clock, keeper=Keeper(clock, start=False))
    workflow = orchestrator.open(WORKFLOW, WORKFLOW_PLAN, holder="w", lease_s=LEASE_S)

    def stall(at: str) -> None:
        if at == point:
            print(f"stall {at}", flush=True)
            sys.stdin.read()  # the parent kills this process here
            raise SystemExit(f"not killed at {at}")

    close, record = journal.close, journal.record

    def closing(execution_id: str, *args: Any, **kwargs: Any) -> Any:
        closed = close(execution_id, *args, **kwargs)
        if execution_id != workflow.execution_id:
            stall("unit-closed")
        return closed

    def recording(execution_id: str, *args: Any, **kwargs: Any) -> Any:
        recorded = record(execution_id, *args, **kwargs)
        if execution_id == workflow.execution_id:
            stall("pointer-recorded")
        return recorded

    journal.close = closing  # type: ignore[method-assign]
    journal.record = recording  # type: ignore[method-assign]
    orchestrator.provider_step(workflow, UNIT, UNIT_PLAN, land_orders(store, Path(calls), lambda: stall("unit-committed")),
                               holder="w", lease_s=LEASE_S)
    print("done", flush=True)


if __name__ == "__main__":
    main()
