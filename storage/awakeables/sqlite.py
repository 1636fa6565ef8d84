"""Awakeable store adapter: table ``cf_awakeables`` in a SQLite file in WAL mode — the catalog's
file, beside the journal's tables (:attr:`Store.awakeables`).

Writes begin with ``BEGIN IMMEDIATE``, taking SQLite's single writer lock, so two settlements of
one token (two resolutions, or a resolution and the waiter's timeout) serialize across processes
and the second finds the row settled.
"""

from __future__ import annotations

from contextful.storage.awakeables.sql import SqlAwakeableStore
from contextful.storage.port_dialects import SqliteFilePort


class SqliteAwakeableStore(SqliteFilePort, SqlAwakeableStore):
    pass
