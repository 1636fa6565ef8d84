"""The store-driven job kind: a registered body over a store input relation, one item per row.

Implements ``surface.fire.scheduled-body`` (a fire runs under ``job:<name>`` with the registered
body and the applied version's declaration), the resume half of ``surface.fire.scheduled-history``
(a restarted fire resumes the pending execution through its input pin, redoing no settled item) and
``surface.fire.executable-pin`` for this kind (``engine.jobs.pinned``). docs/jobs.md, "Store-driven jobs".

One fire:

1. refuses before anything opens when its body is no registered body (``JobBodyUnregistered``, as
   validation says) or no delegate a ``call`` binding names (``engine.jobs.delegated``);
2. opens, or resumes, the execution under the host scope ``job:<name>`` pinned to the job's
   structure (``engine.jobs.pinned``): changed structure under a pending execution meets
   ``OwnerPlanMismatch`` here, before any replay or publication;
3. reads the statement as of the job's ``as_of``, else the instant the execution first opened,
   recorded as its first journal step (``engine.run.sweep``), so a resumed execution reads the same rows;
4. hands each row (an item, named by its first column, or by ``isolated_items.logical_key``:
   ``engine.jobs.isolated``) to the body or, one signed call per attempt, to the delegate, at most
   ``max_in_flight`` in flight, each under the job's retry budget (``engine.run.retry``; an isolated
   item's ``max_attempts``): a transient failure is retried, an item failing for good fails alone,
   by name, and an isolated item its delegate defers is parked (``surface.delegate.defer-parks``);
5. lands, per batch of settled items, the rows their bodies answered into the job's ``tables`` and
   one ``_items`` row per item (``engine.run.items``) in ONE commit carrying the attempt's fence;
6. closes the execution ``closed-ok`` (``closed-failed`` when an item failed), or, when the fire is
   stopped (its cancel event) or fails, or an item is parked, leaves it pending for the next fire to
   resume: the items whose ``_items`` row names the execution are settled and are not handed to the
   body again, and a parked item is re-admitted by the first fire at or after its retry_at.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from contextful.engine.jobs.context import JobContext, JobOutcome, Opening
from contextful.engine.jobs.delegated import AdmissionUnknown, DelegateBody, DelegateCalls
from contextful.engine.jobs.isolated import (
    Admission,
    Deferral,
    ItemParked,
    item_budget,
    item_entity,
    key_column,
    rfc3339,
)
from contextful.engine.jobs.pinned import pinned_plan
from contextful.engine.run.bodies import RegisteredBody
from contextful.engine.run.items import ItemOutcomes, ItemTerminal, served_keys, terminal_outcome
from contextful.engine.run.retry import RetrySchedule
from contextful.engine.run.sweep import SweepSpec, open_sweep
from contextful.storage.errors import (
    JobAnswerInvalid,
    JobItemKeyInvalid,
    QueryInvalid,
)
from contextful.storage.reserved import ITEMS_TABLE

if TYPE_CHECKING:
    from datetime import datetime

    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.run.execution import Execution
    from contextful.storage.store import Store
    from contextful.storage.transaction import RunTransaction

ItemBody = Callable[[str, dict[str, Any], int], Any]
"""What an item is handed to: its key, its row and the attempt (1-based), answering ``{table: rows}``."""
Admit = Callable[[str], Admission]
"""How the fire admits an item by its key (an earlier fire may have parked it)."""

INPUT = "input"
"""The one origin of a store-driven execution's sweep: its input relation."""


@dataclass
class Settled:
    """One item's last attempt in this fire: its error (None: answered) and the rows it answered."""

    key: str
    attempts: int
    error: Exception | None
    tables: dict[str, pa.Table] = field(default_factory=dict)
    ended_us: int = 0
    entity: tuple[str, str] | None = None
    parked: Deferral | None = None
    """Set: the item's delegate deferred it; it is neither terminal nor retried in this fire."""
    last: int = 0
    """The last attempt its budget allowed in this fire (0: the job's budget): a transient failure
    on it is ``exhausted``."""


@dataclass
class Tally:
    completed: int = 0
    failures: list[str] = field(default_factory=list)
    unsettled: int = 0
    rows: int = 0
    parked: list[datetime] = field(default_factory=list)


def chosen_body(job: JobSpec, manifest: Manifest) -> RegisteredBody | DelegateBody:
    """The body a fire of ``job`` runs: its bound delegate (``engine.jobs.delegated``) or its
    registered body; JobBodyUnregistered or JobDelegateUnbound (as validation says) otherwise."""
    from contextful.engine.config.jobs import body_problems
    from contextful.engine.run.bodies import BODIES

    if job.delegate is not None:
        from contextful.engine.jobs.delegated import delegate_body

        return delegate_body(job, manifest)
    problems = body_problems(job, manifest)
    if problems:
        raise problems[0]
    assert job.body is not None
    return BODIES.get(job.body)


def store_driven_opening(ctx: JobContext) -> Opening:
    """What a store-driven fire's execution pins (``engine.jobs.pinned``) with the body's and input's
    identities; the body's refusal before anything opens when it is not registered or bound."""
    body = chosen_body(ctx.job, ctx.manifest)
    pinned = pinned_plan(ctx.manifest, ctx.store, ctx.job)
    return Opening(pinned.reference, body.pins(pinned.input_identity), resumes=True)


def _registered(body: RegisteredBody) -> ItemBody:
    """A registered body as an item body: it takes the row alone."""
    return lambda key, row, attempt: body.fn(row)


def run_store_driven(ctx: JobContext) -> JobOutcome:
    """Fire store-driven ``ctx.job`` once in the execution ``engine.jobs.fire`` opened (see the module docstring)."""
    return _fire(ctx, chosen_body(ctx.job, ctx.manifest), ctx.opened)


def _fire(ctx: JobContext, chosen: RegisteredBody | DelegateBody, execution: Execution) -> JobOutcome:
    job, store = ctx.job, ctx.store
    sweep = open_sweep(execution, store, SweepSpec(as_of=job.as_of), outputs=job.tables, origins=[INPUT])
    body: ItemBody
    budget = item_budget(job)
    admit: Admit = lambda _key: Admission(1, budget)
    if isinstance(chosen, DelegateBody):
        calls = DelegateCalls(ctx, chosen, execution, sweep.as_of, budget)
        body, admit = calls.answer, calls.admission
    else:
        body = _registered(chosen)
    served = _served(job, sweep.connect(INPUT))
    keys = item_keys(job, served)
    settled_before = 0
    if execution.resumed:
        left = pc.invert(pc.is_in(_guarded(keys), value_set=_settled_keys(store, job.name, execution.execution_id)))
        settled_before = len(keys) - pc.sum(left.cast(pa.int64())).as_py() if len(keys) else 0
        served, keys = served.filter(left), keys.filter(left)
    tally = Tally()
    stopped = _run_items(ctx, body, admit, execution, served, keys, budget, tally)
    parked = sorted(tally.parked)
    detail = {"execution": execution.execution_id, "attempt": execution.attempt, "resumed": execution.resumed,
              "as_of": sweep.as_of.isoformat(), "completed": tally.completed, "failed": len(tally.failures),
              "settled_before": settled_before, "left": tally.unsettled, "parked": len(parked),
              "parked_until": rfc3339(parked[0]) if parked else None}
    done = f"{tally.completed} item(s) completed, {len(tally.failures)} failed"
    if execution.cancel_token.is_set():
        return JobOutcome(False, f"canceled: {done}", tally.rows, tuple(tally.failures), detail, canceled=True)
    if stopped or tally.unsettled:
        return JobOutcome(False, f"stopped: {done}; {tally.unsettled} left for the next fire, which resumes "
                                 f"execution {execution.execution_id}", tally.rows, tuple(tally.failures), detail,
                          pending=True)
    if parked:  # not a failure: the first fire at or after the earliest retry_at resumes the execution
        return JobOutcome(not tally.failures, f"{done}; {len(parked)} item(s) parked until {rfc3339(parked[0])}",
                          tally.rows, tuple(tally.failures), detail, pending=True)
    return JobOutcome(not tally.failures, done + (f" ({settled_before} settled by an earlier attempt)"
                                                  if settled_before else ""),
                      tally.rows, tuple(tally.failures), detail)


def _served(job: JobSpec, con: Any) -> pa.Table:
    """The statement's rows at the sweep's instant."""
    import duckdb

    assert job.statement is not None
    try:
        return con.sql(job.statement).to_arrow_table()
    except duckdb.Error as exc:
        raise QueryInvalid(job.statement, f"[[job]] {job.name!r} statement: {exc}") from exc
    finally:
        con.close()


def item_keys(job: JobSpec, served: pa.Table) -> pa.Array:
    """Each item's key as text: the statement's first column (an isolated item's ``logical_key``),
    non-null and unique, and an isolated item's entity column selected and non-null (JobItemKeyInvalid)."""
    column = key_column(job, served.column_names)
    if column is None:
        raise JobItemKeyInvalid(job.name, "", "the statement selects no column")
    isolated = job.isolated_items
    for needed in (column, isolated.entity_key if isolated is not None else None):
        if needed is not None and needed not in served.column_names:
            raise JobItemKeyInvalid(job.name, needed, f"the statement selects no column {needed!r} (it selects "
                                                      f"{', '.join(served.column_names)})")
    if isolated is not None and isolated.entity_key is not None and served.column(isolated.entity_key).null_count:
        raise JobItemKeyInvalid(job.name, isolated.entity_key,
                                f"{served.column(isolated.entity_key).null_count} row(s) serve a null entity key")
    keys = pc.cast(served.column(column), pa.string()).combine_chunks()
    if keys.null_count:
        raise JobItemKeyInvalid(job.name, column, f"{keys.null_count} row(s) serve a null key")
    if pc.count_distinct(keys).as_py() != len(keys):
        counts = pc.value_counts(keys)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")[0].as_py()
        raise JobItemKeyInvalid(job.name, column, f"key {repeated!r} is served more than once")
    return keys


def _guarded(keys: pa.Array) -> pa.Array:
    """``keys`` as their ``_items`` rows hold them (the served-key rule of ``engine.run.items``)."""
    rows = pa.table({"logical_key": keys, "entity_key": pa.nulls(len(keys), pa.string())})
    return served_keys(rows).column("logical_key").combine_chunks()


def _settled_keys(store: Store, job: str, execution_id: str) -> pa.Array:
    """The keys of the items whose ``_items`` row names ``execution_id``: settled by an earlier attempt."""
    if ITEMS_TABLE not in store.table_names(include_reserved=True):
        return pa.array([], pa.string())
    from contextful.engine.read import connect

    con = connect(store)
    try:
        found = con.sql(f"SELECT logical_key FROM {ITEMS_TABLE} WHERE job = ? AND execution_id = ?",
                        params=[job, execution_id]).to_arrow_table()
    finally:
        con.close()
    return found.column("logical_key").combine_chunks()


def _run_items(ctx: JobContext, body: ItemBody, admit: Admit, execution: Execution, served: pa.Table,
               keys: pa.Array, budget: int, tally: Tally) -> bool:
    """Run every item, at most ``max_in_flight`` at once, committing each batch of settled items;
    whether the fire stopped before handing every item over (its cancel event, or a run cancel).
    An item parked until later is sent nothing; one whose recorded defer spent its budget settles
    without a call."""
    job = ctx.job
    assert job.max_in_flight is not None
    rows = _items_of(served, keys)
    pending: set[Future[Settled]] = set()
    batch: list[Settled] = []
    stopped = False
    with ThreadPoolExecutor(max_workers=job.max_in_flight, thread_name_prefix=f"job-{job.name}") as pool:
        while True:
            while not stopped and len(pending) < job.max_in_flight:
                if ctx.cancel.is_set() or execution.cancel_token.is_set():
                    stopped = True
                    break
                item = next(rows, None)
                if item is None:
                    break
                key, row = item
                admitted = admit(key)
                if admitted.parked_until is not None:
                    tally.parked.append(admitted.parked_until)
                    continue
                entity = item_entity(job, key, row)
                pending.add(pool.submit(_attempt, job, body, key, row, ctx.cancel, ctx.store,
                                        range(admitted.first, admitted.last + 1), entity))
            if not pending:
                if batch:
                    _commit(ctx, execution, batch, budget, tally)
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            batch += [future.result() for future in done]
            if len(batch) >= job.max_in_flight or not pending:
                _commit(ctx, execution, batch, budget, tally)
                batch = []
    return stopped


def _items_of(served: pa.Table, keys: pa.Array, batch_rows: int = 1024) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each item's key and row, a batch of rows made Python at a time: the body takes one row per
    call, so this loop is bounded by the items, and memory by the batch, not the input."""
    offset = 0
    for batch in served.to_batches(max_chunksize=batch_rows):
        yield from zip(keys.slice(offset, batch.num_rows).to_pylist(), batch.to_pylist(), strict=True)
        offset += batch.num_rows


def _attempt(job: JobSpec, body: ItemBody, key: str, row: dict[str, Any], cancel: threading.Event,
             store: Store, attempts_left: range, entity: tuple[str, str] | None) -> Settled:
    """One item under its budget's ``attempts_left`` (a worker thread); a defer parks it."""
    attempts = 0

    def once(n: int) -> dict[str, pa.Table]:
        nonlocal attempts
        attempts = attempts_left[n - 1]
        return answer_tables(job, key, body(key, row, attempts))  # the one place an item is dispatched

    schedule = RetrySchedule.from_config(dict(job.retry) | {"attempts": len(attempts_left)})
    last = attempts_left[-1]
    try:
        tables = schedule.run(f"item {key}", once, cancel=cancel)
    except ItemParked as parked:
        return Settled(key, attempts, None, ended_us=store.clock.now_us(), entity=entity, parked=parked.deferral,
                       last=last)
    except AdmissionUnknown as unknown:  # the execution's state is unknown, not the item's: the fire stops
        raise unknown.error from unknown
    except Exception as exc:  # noqa: BLE001 - an item's failure is its own: it fails alone, by name
        return Settled(key, attempts, exc, ended_us=store.clock.now_us(), entity=entity, last=last)
    return Settled(key, attempts, None, tables, store.clock.now_us(), entity, last=last)


def answer_tables(job: JobSpec, key: str, answer: Any) -> dict[str, pa.Table]:
    """A body's answer ``{table: rows}`` (rows: an Arrow table, a Polars frame or a list of dicts),
    every table one of the job's ``tables``, as Arrow tables; JobAnswerInvalid otherwise."""
    if not isinstance(answer, Mapping):
        raise JobAnswerInvalid(job.name, key, f"is a {type(answer).__name__}, not a mapping of table to rows")
    tables: dict[str, pa.Table] = {}
    for table, rows in answer.items():
        if table not in job.tables:
            raise JobAnswerInvalid(job.name, key, f"names table {table!r}, which is not among the job's tables "
                                                  f"({', '.join(job.tables)})")
        if isinstance(rows, pa.Table):
            tables[table] = rows
        elif hasattr(rows, "to_arrow"):
            tables[table] = rows.to_arrow()
        elif isinstance(rows, list) and all(isinstance(r, Mapping) for r in rows):
            tables[table] = pa.Table.from_pylist(rows)
        else:
            raise JobAnswerInvalid(job.name, key, f"gives table {table!r} a {type(rows).__name__}: answer an Arrow "
                                                  "table, a Polars frame or a list of rows")
    return tables


def attempt_run_id(execution: Execution, key: str) -> str:
    """The id of this attempt's run of one item (the ``_items`` row's ``attempt_run_id``)."""
    digest = hashlib.sha256(f"{execution.execution_id}\0{execution.attempt}\0{key}".encode()).hexdigest()
    return f"item-{digest[:24]}"


def _commit(ctx: JobContext, execution: Execution, batch: list[Settled], budget: int, tally: Tally) -> None:
    """Land ``batch``: the settled items' output rows and their ``_items`` rows in one fenced commit."""
    from contextful.engine.control.contracts import applied_contract

    job, store = ctx.job, ctx.store
    outcomes = ItemOutcomes(store, job.name)
    parts: dict[str, list[pa.Table]] = {}
    for item in batch:  # bounded by max_in_flight items
        if item.parked is not None:
            tally.parked.append(item.parked.retry_at)
            continue
        terminal = terminal_outcome(item.error, max(item.attempts, 1), item.last or budget)
        if terminal is None:  # a retry wait the fire's cancel ended: the next fire takes the item again
            tally.unsettled += 1
            continue
        outcomes.record(item.key, entity=item.entity, attempts=max(item.attempts, 1), outcome=terminal,
                        attempt_run_id=attempt_run_id(execution, item.key), execution_id=execution.execution_id,
                        ended_us=item.ended_us, error=item.error)
        if terminal is ItemTerminal.COMPLETED:
            tally.completed += 1
            for table, rows in item.tables.items():
                parts.setdefault(table, []).append(rows)
        else:
            tally.failures.append(f"item {item.key!r}: {terminal.value}: "
                                  f"{outcomes.pending[-1].reason}")
            ctx.say(f"{job.identity}: {tally.failures[-1]}")
    if not outcomes.pending:
        return
    txns: list[RunTransaction] = []
    try:
        for table, tables in parts.items():  # each under the contract its version pins (applied-data-contract)
            contract = applied_contract(ctx, table)
            txn = store.create_table(table, contract.primary_key, contract.order_by, provisional=True).transaction(
                "append", run_id=f"{outcomes.run_id()}-{table}", meta={"job": job.name,
                                                                        "execution": execution.execution_id})
            txns.append(txn)
            for rows in tables:  # each item's answer reconciles on its own: values land as they arrived
                txn.stage(rows)
        with execution.writing():
            outcomes.commit(*txns)
    except BaseException:
        for txn in txns:
            txn.abort()
        raise
    tally.rows += sum(t.num_rows for tables in parts.values() for t in tables)
