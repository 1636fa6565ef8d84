"""The journal store's SQL, shared by the SQLite and PostgreSQL adapters.

An owner verb is one write transaction: lock the scope (SQLite's ``BEGIN IMMEDIATE`` writer lock;
on PostgreSQL an advisory lock on the scope, which also covers a scope with no row yet, and
``SELECT … FOR UPDATE`` on the row), read the row, apply the transition, upsert the result. A step
is ``INSERT … ON CONFLICT DO NOTHING`` followed by a read of the stored row, so a second writer of
one step waits for the first insert to commit and then reads its value.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from contextful.storage.dbapi import CommitUnheard, SqlDialect
from contextful.storage.errors import CommitOutcomeUnknown, ContextfulError
from contextful.storage.fence import WriterFence
from contextful.storage.journal import CallbackIdentity, HeldOwners, JournalStore, OwnerRow, StepRow

OWNER_COLUMNS = ("scope", "execution_id", "plan_ref", "status", "holder", "lease_expires_us", "opened_us",
                 "closed_us", "cursor", "attempts", "replay_from", "pins",
                 "cancel_requested_us", "held_since_us")

DDL = (
    """CREATE TABLE IF NOT EXISTS cf_journal_owners (
        scope TEXT PRIMARY KEY, execution_id TEXT NOT NULL UNIQUE, plan_ref TEXT NOT NULL, status TEXT NOT NULL,
        holder TEXT, lease_expires_us BIGINT NOT NULL, opened_us BIGINT NOT NULL, closed_us BIGINT,
        cursor TEXT, attempts BIGINT NOT NULL, replay_from BIGINT NOT NULL, pins TEXT NOT NULL DEFAULT '{{}}',
        cancel_requested_us BIGINT, held_since_us BIGINT)""",
    """CREATE TABLE IF NOT EXISTS cf_journal_steps (
        execution_id TEXT NOT NULL, seq BIGINT NOT NULL, label TEXT NOT NULL, value {blob} NOT NULL,
        recorded_us BIGINT NOT NULL, PRIMARY KEY (execution_id, seq))""",
)

_SELECT_OWNER = f"SELECT {', '.join(OWNER_COLUMNS)} FROM cf_journal_owners"
_UPSERT_OWNER = (f"INSERT INTO cf_journal_owners ({', '.join(OWNER_COLUMNS)})"
                 f" VALUES ({', '.join('?' for _ in OWNER_COLUMNS)}) ON CONFLICT (scope) DO UPDATE SET "
                 + ", ".join(f"{c} = excluded.{c}" for c in OWNER_COLUMNS[1:]))
ADDED_OWNER_COLUMNS = {"pins": "TEXT NOT NULL DEFAULT '{}'", "cancel_requested_us": "BIGINT", "held_since_us": "BIGINT"}
"""Owner columns added after ``cf_journal_owners`` first shipped: a journal made before gains them."""

_SELECT_STEP = "SELECT execution_id, seq, label, value, recorded_us FROM cf_journal_steps"


def _owner(row: Any) -> OwnerRow | None:
    return None if row is None else OwnerRow(*row)


def _step(row: Any) -> StepRow:
    return StepRow(row[0], int(row[1]), row[2], bytes(row[3]), int(row[4]))


class SqlJournalStore(SqlDialect, JournalStore, ABC):
    """A journal store over one DB-API connection; adapters fill in the dialect hooks."""

    placeholder = "?"
    blob_type = "BLOB"

    def __init__(self) -> None:
        self._open_connection()

        def create(cur: Any) -> None:
            self._lock_ddl(cur)
            for statement in DDL:
                cur.execute(statement.format(blob=self.blob_type))
            cur.execute("SELECT * FROM cf_journal_owners WHERE 1 = 0")
            present = {column[0] for column in cur.description}
            for column, ddl in ADDED_OWNER_COLUMNS.items():
                if column not in present:
                    cur.execute(f"ALTER TABLE cf_journal_owners ADD COLUMN {column} {ddl}")

        self._write(create, rerun_unheard=True)

    # --- dialect hooks --------------------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> Any: ...

    @abstractmethod
    def _begin_write(self, cur: Any, durable: bool = True) -> None:
        """Begin a write transaction."""

    @abstractmethod
    def _map_error(self, exc: Exception) -> ContextfulError | None:
        """The catalogue error for a driver error (None: not the driver's)."""

    def _lock_ddl(self, cur: Any) -> None:
        """Serialize table creation between processes opening the store at once."""

    def _lock_scope(self, cur: Any, scope: str) -> None:
        """Serialize owner writes of ``scope``, the row present or not (after ``_begin_write``)."""

    row_lock = ""
    """Appended to the owner read inside a write transaction (`` FOR UPDATE`` where rows lock)."""

    row_share = ""
    """Appended to the owner read :meth:`hold_owners` holds (`` FOR SHARE`` where rows lock)."""

    # --- plumbing -------------------------------------------------------------------------------

    def _query(self, statement: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return self._query_rows(statement, params)

    def close_store(self) -> None:
        with self._lock:
            self._conn.close()

    # --- owners ---------------------------------------------------------------------------------

    def _swap_owner(self, change: Callable[[OwnerRow | None], OwnerRow], *, scope: str | None = None,
                    execution_id: str | None = None) -> OwnerRow:
        def swap(cur: Any) -> OwnerRow:
            if scope is not None:
                self._lock_scope(cur, scope)
                cur.execute(self._sql(f"{_SELECT_OWNER} WHERE scope = ?{self.row_lock}"), (scope,))
            else:
                cur.execute(self._sql(f"{_SELECT_OWNER} WHERE execution_id = ?{self.row_lock}"), (execution_id,))
            new = change(_owner(cur.fetchone()))
            cur.execute(self._sql(_UPSERT_OWNER), tuple(getattr(new, c) for c in OWNER_COLUMNS))
            return new

        try:  # an owner transition is not repeatable blindly: a lost answer is an unknown outcome
            return self._write(swap)
        except CommitUnheard as exc:
            raise CommitOutcomeUnknown(f"journal owner {scope or execution_id}", str(execution_id or scope),
                                       str(exc)) from exc

    @contextmanager
    def hold_owners(self, execution_id: str, scopes: Sequence[str] = (), fence: WriterFence | None = None,
                    callback: CallbackIdentity | None = None) -> Iterator[HeldOwners]:
        # Its own connection: the held transaction stays open through the caller's block while this
        # store's connection goes on serving its other verbs (a step record, another scope's claim).
        with self._mapped_errors():
            conn = self._connect()
        try:
            with self._mapped_errors():
                cur = conn.cursor()
                self._begin_write(cur)
                cur.execute(self._sql(f"{_SELECT_OWNER} WHERE execution_id = ?{self.row_share}"), (execution_id,))
                own = _owner(cur.fetchone())
                others: dict[str, OwnerRow] = {}
                if scopes:
                    marks = ", ".join("?" for _ in scopes)
                    cur.execute(self._sql(f"{_SELECT_OWNER} WHERE scope IN ({marks}) ORDER BY scope{self.row_share}"),
                                tuple(scopes))
                    others = {row.scope: row for row in (OwnerRow(*found) for found in cur.fetchall())}

            def record(step: StepRow) -> StepRow:
                # in the held transaction: the value is durable exactly when the hold ends
                with self._mapped_errors():
                    if self._try_insert(cur, step):
                        return step
                    cur.execute(self._sql(f"{_SELECT_STEP} WHERE execution_id = ? AND seq = ?"),
                                (step.execution_id, step.seq))
                    return _step(cur.fetchone())

            yield HeldOwners(own, others, record)
            with self._mapped_errors():
                cur.execute("COMMIT")
        finally:
            conn.close()  # a block that raised: closing rolls the read back and frees the lock

    def owner(self, scope: str) -> OwnerRow | None:
        rows = self._query(f"{_SELECT_OWNER} WHERE scope = ?", (scope,))
        return _owner(rows[0]) if rows else None

    def owners(self) -> list[OwnerRow]:
        return [OwnerRow(*row) for row in self._query(f"{_SELECT_OWNER} ORDER BY scope")]

    # --- steps ----------------------------------------------------------------------------------

    def _try_insert(self, cur: Any, row: StepRow) -> bool:
        cur.execute(self._sql("INSERT INTO cf_journal_steps (execution_id, seq, label, value, recorded_us)"
                              " VALUES (?, ?, ?, ?, ?) ON CONFLICT (execution_id, seq) DO NOTHING"
                              " RETURNING seq"),
                    (row.execution_id, row.seq, row.label, row.value, row.recorded_us))
        return cur.fetchone() is not None

    def _insert_step(self, row: StepRow, fence: WriterFence | None = None) -> StepRow:
        def insert(cur: Any) -> bool:
            if fence is not None:  # in the insert's transaction: a takeover serializes before or after it
                fence.check_sql(cur, self._sql, self.row_share)
            return self._try_insert(cur, row)

        while True:  # bounded in practice: it loops only if a collect removes the step in between
            if self._write(insert, rerun_unheard=True, one_statement=fence is None):
                return row  # this write stored it: one round trip in the common case
            stored = self._query(f"{_SELECT_STEP} WHERE execution_id = ? AND seq = ?", (row.execution_id, row.seq))
            if stored:
                return _step(stored[0])

    def steps(self, execution_id: str) -> list[StepRow]:
        return [_step(row) for row in self._query(f"{_SELECT_STEP} WHERE execution_id = ? ORDER BY seq",
                                                  (execution_id,))]

    def collect(self, execution_id: str, below: int | None = None, fence: WriterFence | None = None) -> int:
        def delete(cur: Any) -> int:
            if fence is not None:
                fence.check_sql(cur, self._sql, self.row_share)
            if below is None:
                cur.execute(self._sql("DELETE FROM cf_journal_steps WHERE execution_id = ?"), (execution_id,))
            else:
                cur.execute(self._sql("DELETE FROM cf_journal_steps WHERE execution_id = ? AND seq < ?"),
                            (execution_id, below))
            return int(cur.rowcount)

        return self._write(delete, rerun_unheard=True)
