"""Awakeable store adapter: table ``cf_awakeables`` in a PostgreSQL schema — the catalog's schema,
beside the journal's tables (psycopg 3).

A settlement's conditional ``UPDATE`` takes the row lock: a racing settlement of the same token (a
resolution, or the waiter's timeout) waits for the first to commit, re-evaluates ``state =
'pending'`` on the committed row and changes nothing, so exactly one outcome is recorded across
connections.
"""

from __future__ import annotations

from contextful.storage.awakeables.sql import SqlAwakeableStore
from contextful.storage.port_dialects import PostgresSchemaPort


class PostgresAwakeableStore(PostgresSchemaPort, SqlAwakeableStore):
    pass
