"""Journal store adapter: its own SQLite file in WAL mode.

Owner writes begin with ``BEGIN IMMEDIATE``, taking SQLite's single writer lock before they read
the row, so every owner transition is linearizable across processes; a writer waits for the lock
up to the busy timeout. WAL is switched on the way the catalog does it (:func:`enable_wal`
retries the switch, which SQLite answers without its busy handler).

:meth:`hold_owners` (an execution's admission) reads the owner rows inside ``BEGIN IMMEDIATE`` on a
connection of its own and holds that write lock through the admitted callback: no owner write of
any scope commits until the callback returns (writers wait up to the busy timeout), which is
coarser than PostgreSQL's row lock but as strict. Journal the callback's value after the block.
"""

from __future__ import annotations

import os

from contextful.storage.journal.sql import SqlJournalStore
from contextful.storage.port_dialects import SqliteFilePort


class SqliteJournalStore(SqliteFilePort, SqlJournalStore):
    hold_blocks_every_owner_write = True

    @property
    def location(self) -> str:
        return f"sqlite:{os.path.realpath(self.path)}"
