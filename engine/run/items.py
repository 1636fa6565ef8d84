"""The reserved ``_items`` table: one row per terminal item, landing with the item's receipt.

Implements decision ``terminal-item-s`` ("A terminal item's outcome is a row of a reserved
relation"):

- ``run.items.outcome-record``: each terminal item appends one row to ``_items`` once its receipt
  commits: ``job, logical_key, entity_namespace, entity_key, attempts, outcome, reason,
  attempt_run_id, execution_id, ended_at``. The row and the receipt land in ONE catalog commit
  (:meth:`ItemOutcomes.commit`): the ``_items`` run carries, as catalog cursors on ``_items``, one
  receipt per item (scope ``receipt/<job>/<digest of the served logical key>``: a cursor no read
  face exposes), and the runs the caller passes beside it (the item's output rows) join the same
  commit (:func:`storage.transaction.commit_together`). Either everything lands or nothing does.
- ``run.items.terminal-outcome``: the outcome is an :class:`ItemTerminal` — ``completed``,
  ``permanent``, or ``exhausted`` on the attempt that spends the retry budget (a transient failure
  on the last attempt the budget allows, :func:`terminal_outcome`); a failed item's reason is its
  failure tag (the error's catalogue name) and its message masked by the secret guard and capped
  at :data:`ERROR_CAP_BYTES` UTF-8 bytes (:func:`failure_reason`).
- ``run.items.served-key``: keys land as the job's input relation served them. A served key that
  its source masked (``[masked:<family>]#<digest>``, ``engine.guard.key_cells``) lands as it is;
  the writer runs every row through the same rule (the secret guard with the key-cell digest
  suffix) before staging, so a key handed over in the clear lands under that rule too and a
  credential never reaches an ``_items`` part.

Crash safety (never a lost or doubled row): the ``_items`` run id is a digest of the job and the
items' attempt run ids, and a catalog lands a run id at most once per table. A crash before the
commit leaves nothing visible (the staged parts are orphans for collection) and the replayed
attempt stages and commits again under the same run id; a commit whose answer was lost is found
landed by the catalog's rerun; an item whose receipt already names its attempt run id is left out
of a later commit (:meth:`ItemOutcomes.commit` reads the receipts before staging), so committing
the same items again lands nothing, and the key ``(job, attempt_run_id)`` merges any repeat. One
owner holds an item's scope at a time (``storage.journal``), so two writers never race on one item.

    >>> from contextful.storage import Store
    >>> import tempfile
    >>> store = Store.open(tempfile.mkdtemp())
    >>> outcomes = ItemOutcomes(store, "stage-screen")
    >>> _ = outcomes.record("p-7", entity=("entity", "e-1"), attempts=1, outcome=ItemTerminal.COMPLETED,
    ...                     attempt_run_id="item-3f2a", execution_id="x-7f3a", ended_us=1_900_000_000_000_000)
    >>> [result.table for result in outcomes.commit()]
    ['_items']
    >>> store.table("_items").to_arrow().column("outcome").to_pylist()
    ['completed']
    >>> outcomes.receipt("p-7")["outcome"]
    'completed'
    >>> store.close()
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from contextful.storage.commits import SetCursor
from contextful.storage.errors import ArgumentInvalid, TransientError
from contextful.storage.reserved import ITEMS_TABLE
from contextful.storage.run_record import RunFailure
from contextful.storage.transaction import CommitResult, RunTransaction, commit_together

if TYPE_CHECKING:
    from contextful.storage.store import Store
    from contextful.storage.table import Table

PRIMARY_KEY = ("job", "attempt_run_id")
KEY_COLUMNS = ("logical_key", "entity_key")
RECEIPT_PREFIX = "receipt/"
ERROR_CAP_BYTES = 1024
"""error-cap: the most UTF-8 bytes of an error message an item row's reason carries."""

ITEMS_SCHEMA = pa.schema([
    ("job", pa.string()),
    ("logical_key", pa.string()),
    ("entity_namespace", pa.string()),
    ("entity_key", pa.string()),
    ("attempts", pa.int64()),
    ("outcome", pa.string()),
    ("reason", pa.string()),
    ("attempt_run_id", pa.string()),
    ("execution_id", pa.string()),
    ("ended_at", pa.timestamp("us", tz="UTC")),
])
"""The columns ``run.items.outcome-record`` lists, in its order (``ended_at``: the end instant)."""


class ItemTerminal(StrEnum):
    """How an item ended: the only values an ``_items`` row's ``outcome`` holds."""

    COMPLETED = "completed"
    """Its body answered ok and its rows landed."""
    PERMANENT = "permanent"
    """A failure retrying cannot cure (a permanent answer or rejection, any non-transient error)."""
    EXHAUSTED = "exhausted"
    """A transient failure on the attempt that spent the retry budget."""


def terminal_outcome(error: BaseException | None, attempt: int, budget: int) -> ItemTerminal | None:
    """The terminal outcome of ``attempt`` (1-based) of ``budget`` allowed, failing with ``error``
    (None: it succeeded); None when the item is not terminal (a transient failure with attempts left).

    >>> terminal_outcome(None, 1, 3), terminal_outcome(ValueError("bad"), 1, 3)
    (<ItemTerminal.COMPLETED: 'completed'>, <ItemTerminal.PERMANENT: 'permanent'>)
    >>> from contextful.storage.errors import RateLimited
    >>> busy = RateLimited("api", 2.0, "429")
    >>> terminal_outcome(busy, 2, 3) is None, terminal_outcome(busy, 3, 3)
    (True, <ItemTerminal.EXHAUSTED: 'exhausted'>)
    """
    if budget < 1 or attempt < 1:
        raise ArgumentInvalid("attempt" if attempt < 1 else "budget", attempt if attempt < 1 else budget,
                              "attempts and the retry budget count from 1")
    if error is None:
        return ItemTerminal.COMPLETED
    if isinstance(error, TransientError) and not getattr(error, "permanent", False):
        return ItemTerminal.EXHAUSTED if attempt >= budget else None
    return ItemTerminal.PERMANENT


def failure_reason(error: BaseException) -> str:
    """An item row's reason: ``<failure tag>: <message>``, the message on one line, masked by the
    secret guard and capped at :data:`ERROR_CAP_BYTES` UTF-8 bytes (cut at a character, ``…`` marking
    the cut)."""
    from contextful.engine.guard import mask_message

    failure = RunFailure.of(error, mask_message)
    return f"{failure.error}: {_capped(failure.detail)}"


def _capped(text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= ERROR_CAP_BYTES:
        return text
    marker = "…"
    return raw[:ERROR_CAP_BYTES - len(marker.encode())].decode("utf-8", "ignore") + marker


def served_keys(rows: pa.Table) -> pa.Table:
    """``rows`` with the key columns under the source's serving rule: the secret guard, a changed key
    cell keeping the digest suffix landing gives it (``engine.guard.key_cells``). A key already served
    masked is unchanged; every other text column (the reason) is masked too."""
    from contextful.engine.guard import guard_table
    from contextful.engine.guard.key_cells import distinct_key_cells

    return distinct_key_cells(rows, guard_table(rows).table, KEY_COLUMNS)


@dataclass(frozen=True)
class ItemOutcome:
    """One terminal item's row, before it lands."""

    job: str
    logical_key: str
    entity_namespace: str | None
    entity_key: str | None
    attempts: int
    outcome: ItemTerminal
    reason: str | None
    attempt_run_id: str
    execution_id: str
    ended_us: int

    def to_row(self) -> dict[str, Any]:
        return {"job": self.job, "logical_key": self.logical_key, "entity_namespace": self.entity_namespace,
                "entity_key": self.entity_key, "attempts": self.attempts, "outcome": self.outcome.value,
                "reason": self.reason, "attempt_run_id": self.attempt_run_id, "execution_id": self.execution_id,
                "ended_at": self.ended_us}


class ItemOutcomes:
    """The writer a job's item loop calls: :meth:`record` each terminal item, then :meth:`commit` the
    rows with their receipts (and the item's output runs) in one catalog commit."""

    def __init__(self, store: Store, job: str) -> None:
        self.store = store
        self.job = job
        self._pending: list[ItemOutcome] = []

    def record(self, logical_key: str | int, *, entity: tuple[str, str | int] | None = None, attempts: int,
               outcome: ItemTerminal | str, attempt_run_id: str, execution_id: str, ended_us: int,
               error: BaseException | None = None) -> ItemOutcome:
        """Queue the row of a terminal item for the next :meth:`commit`.

        ``logical_key`` and ``entity`` (namespace, key) are the values the job's input relation
        served; ``error`` is the failure of a ``permanent`` or ``exhausted`` item (its reason),
        None for a completed one. ArgumentInvalid for an outcome that is no ItemTerminal, a
        failure without an error or a completion with one, or fewer than one attempt.
        """
        try:
            terminal = ItemTerminal(outcome)
        except ValueError:
            raise ArgumentInvalid("outcome", outcome,
                                  f"an item ends as one of {', '.join(t.value for t in ItemTerminal)}") from None
        if terminal is ItemTerminal.COMPLETED and error is not None:
            raise ArgumentInvalid("error", error, "a completed item takes no error")
        if terminal is not ItemTerminal.COMPLETED and error is None:
            raise ArgumentInvalid("error", None, f"a {terminal.value} item needs the error it failed on")
        if isinstance(attempts, bool) or attempts < 1:
            raise ArgumentInvalid("attempts", attempts, "an item ends after at least one attempt")
        namespace, entity_key = entity if entity is not None else (None, None)
        item = ItemOutcome(self.job, str(logical_key), namespace, None if entity_key is None else str(entity_key),
                           attempts, terminal, None if error is None else failure_reason(error),
                           attempt_run_id, execution_id, ended_us)
        self._pending.append(item)
        return item

    @property
    def pending(self) -> tuple[ItemOutcome, ...]:
        return tuple(self._pending)

    def run_id(self) -> str:
        """The ``_items`` run id of the items recorded so far: the same items, the same run id."""
        return _run_id(self.job, [i.attempt_run_id for i in self._pending])

    def commit(self, *alongside: RunTransaction) -> list[CommitResult]:
        """Land the recorded rows and their receipts, with ``alongside`` (the runs carrying the items'
        output rows), in one catalog commit; return every run's result, ``_items``'s last.

        An item whose receipt already names its attempt run id (its row landed: a replay after a
        crash) lands nothing again; when every item did, ``alongside`` is committed alone.
        """
        if not self._pending:
            return commit_together(alongside)
        table = self.store.reserved_table(ITEMS_TABLE, PRIMARY_KEY)
        guarded = served_keys(pa.Table.from_pylist([i.to_row() for i in self._pending], schema=ITEMS_SCHEMA))
        rows = guarded.to_pylist()
        fresh = [n for n, row in enumerate(rows) if not self._landed(table, row)]
        if not fresh:
            results = commit_together(alongside)
            self._pending.clear()
            return results
        txn = table.transaction("append", run_id=_run_id(self.job, [rows[n]["attempt_run_id"] for n in fresh]),
                                meta={"job": self.job})
        try:
            txn.stage(guarded.take(fresh))
            txn.add_to_commit(updates=tuple(
                SetCursor(self.receipt_scope(rows[n]["logical_key"]), _receipt(rows[n])) for n in fresh))
            results = commit_together([*alongside, txn])
        except BaseException:
            txn.abort()
            raise
        self._pending.clear()
        return results

    def _landed(self, table: Table, row: dict[str, Any]) -> bool:
        found = table.cursor(self.receipt_scope(row["logical_key"]))
        return found is not None and found[0].get("attempt_run_id") == row["attempt_run_id"]

    def receipt_scope(self, served_logical_key: str | int) -> str:
        """The catalog cursor holding the receipt of the item the input relation served under this key."""
        digest = hashlib.sha256(f"{self.job}\0{served_logical_key}".encode()).hexdigest()[:32]
        return f"{RECEIPT_PREFIX}{self.job}/{digest}"

    def receipt(self, served_logical_key: str | int) -> dict[str, Any] | None:
        """The receipt of the item served under ``served_logical_key``: its outcome, attempts, attempt
        run id and execution id, or None while it is not terminal."""
        if ITEMS_TABLE not in self.store.table_names(include_reserved=True):
            return None
        found = self.store.table(ITEMS_TABLE).cursor(self.receipt_scope(served_logical_key))
        return None if found is None else dict(found[0])


def _run_id(job: str, attempt_run_ids: list[str]) -> str:
    digest = hashlib.sha256("\0".join([job, *sorted(attempt_run_ids)]).encode())
    return f"items-{digest.hexdigest()[:32]}"


def _receipt(row: dict[str, Any]) -> dict[str, Any]:
    return {"outcome": row["outcome"], "attempts": row["attempts"], "attempt_run_id": row["attempt_run_id"],
            "execution_id": row["execution_id"]}

