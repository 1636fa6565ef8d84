"""Journal store adapter: tables ``cf_journal_owners`` and ``cf_journal_steps`` in a PostgreSQL
schema (psycopg 3).

An owner write takes a transaction-scoped advisory lock on its scope, then ``SELECT … FOR UPDATE``
on the row: claims of one scope serialize across connections even before its first row exists,
and a verb addressed by execution id waits on the row lock, re-reading the row once the lock is
granted (a row whose execution a claim replaced meanwhile no longer matches). A step insert is
``ON CONFLICT DO NOTHING``: a racing insert of the same step waits for the first to commit, then
does nothing, and both read the first value.

:meth:`hold_owners` (an execution's admission, ``run.journal.durable-dispatch``) reads the owner row
(and those of the item's ancestors and entity fences) ``FOR SHARE`` on a connection of its own and
keeps that transaction open through the admitted callback: every owner write of those scopes takes
its row ``FOR UPDATE`` and so waits for the callback to return. The held session is idle in its transaction meanwhile, so the server's
``idle_in_transaction_session_timeout`` (60 s, :mod:`storage.dbapi`) bounds an admitted callback:
one that overruns it loses its lock and its exit fails with the mapped connection error.
"""

from __future__ import annotations

from typing import Any

from contextful.storage.journal.sql import SqlJournalStore
from contextful.storage.port_dialects import PostgresSchemaPort


class PostgresJournalStore(PostgresSchemaPort, SqlJournalStore):
    row_lock = " FOR UPDATE"
    row_share = " FOR SHARE"

    @property
    def location(self) -> str:
        return f"postgres:{self.dsn}:{self.schema}"

    def _lock_scope(self, cur: Any, scope: str) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"contextful-journal-owner:{self.schema}:{scope}",))
