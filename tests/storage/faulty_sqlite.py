"""A SQLite catalog whose connection fails at chosen statements: fault injection around a real file.

The catalog is the real :class:`SqliteCatalog`; only its DB-API connection is wrapped, so that a
test can make one statement fail the way a disk or a driver fails:

- ``fail_before(trigger)``: the next statement holding ``trigger`` raises instead of running;
- ``fail_after_commit(trigger)``: the ``COMMIT`` of a transaction that ran ``trigger`` is carried
  out and then raises, as if the answer was lost;
- ``refuse_connections``: opening a new connection raises.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass, field
from typing import Any

from contextful.storage.catalog.sqlite import SqliteCatalog


@dataclass
class Faults:
    before: str | None = None
    after_commit: str | None = None
    refuse_connections: bool = False
    then_refuse: bool = False
    fired: threading.Event = field(default_factory=threading.Event)

    def fail_before(self, trigger: str, then_refuse: bool = False) -> None:
        self.before, self.then_refuse = trigger, then_refuse
        self.fired.clear()

    def fail_after_commit(self, trigger: str, then_refuse: bool = False) -> None:
        self.after_commit, self.then_refuse = trigger, then_refuse
        self.fired.clear()

    def fire(self) -> None:
        self.refuse_connections = self.then_refuse
        self.fired.set()

    def heal(self) -> None:
        self.before = self.after_commit = None
        self.refuse_connections = self.then_refuse = False


class FaultySqliteCatalog(SqliteCatalog):
    def __init__(self, path: str, faults: Faults) -> None:
        self.faults = faults
        super().__init__(path)

    def _connect(self) -> Any:
        if self.faults.refuse_connections:
            raise sqlite3.OperationalError("unable to open database file")
        return _Connection(super()._connect(), self.faults)


class _Connection:
    def __init__(self, conn: sqlite3.Connection, faults: Faults) -> None:
        self._conn = conn
        self._faults = faults
        self.armed_txn = False

    def cursor(self) -> _Cursor:
        return _Cursor(self._conn.cursor(), self)

    def execute(self, *args: Any) -> Any:
        return self._conn.execute(*args)

    def close(self) -> None:
        self._conn.close()


class _Cursor:
    def __init__(self, cur: sqlite3.Cursor, conn: _Connection) -> None:
        self._cur = cur
        self._conn = conn

    def execute(self, statement: str, params: Any = ()) -> Any:
        faults = self._conn._faults
        if faults.before and faults.before in statement:
            faults.before = None
            faults.fire()
            raise sqlite3.OperationalError("disk I/O error")
        if faults.after_commit and faults.after_commit in statement:
            self._conn.armed_txn = True
        result = self._cur.execute(statement, params)
        if statement == "COMMIT" and self._conn.armed_txn and faults.after_commit:
            faults.after_commit = None
            self._conn.armed_txn = False
            faults.fire()
            raise sqlite3.OperationalError("disk I/O error")
        return result

    def executemany(self, statement: str, rows: Any) -> Any:
        return self._cur.executemany(statement, rows)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> Any:
        return self._cur.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def close(self) -> None:
        self._cur.close()
