"""The completion store on the local profile: ``cf_publication_completions`` in the store's SQLite
catalog database, beside its other ``cf_`` tables (``run.export.group-source``).

A completion is one row keyed by its run id; triggers refuse every UPDATE and DELETE, so a recorded
completion is immutable in the database itself, not by this module's good manners. Recording a run
again keeps the first row (``INSERT … ON CONFLICT DO NOTHING``) and answers it.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing

from contextful.engine.export.publications import Completion
from contextful.storage.port_dialects import SqliteFilePort

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cf_publication_completions (
        run_id TEXT PRIMARY KEY,
        producer TEXT NOT NULL,
        recorded_us INTEGER NOT NULL,
        body TEXT NOT NULL)""",
    ("CREATE INDEX IF NOT EXISTS cf_publication_completions_producer "
    "ON cf_publication_completions (producer, recorded_us)"),
    """CREATE TRIGGER IF NOT EXISTS cf_publication_completions_immutable BEFORE UPDATE
        ON cf_publication_completions BEGIN SELECT RAISE(ABORT, 'a producer completion is immutable'); END""",
    """CREATE TRIGGER IF NOT EXISTS cf_publication_completions_kept BEFORE DELETE
        ON cf_publication_completions BEGIN SELECT RAISE(ABORT, 'a producer completion is immutable'); END""",
)


class SqliteCompletions(SqliteFilePort):
    """:class:`~contextful.engine.export.publications.CompletionStore` over the catalog's SQLite file."""

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection = self._connect()
        for statement in SCHEMA:
            conn.execute(statement)
        return conn

    def record(self, completion: Completion) -> Completion:
        with closing(self._connection()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO cf_publication_completions (run_id, producer, recorded_us, body) "
                         "VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
                         (completion.run_id, completion.producer, completion.recorded_us, completion.body()))
            row = conn.execute("SELECT body FROM cf_publication_completions WHERE run_id = ?",
                               (completion.run_id,)).fetchone()
            conn.execute("COMMIT")
        return Completion.from_json(json.loads(row[0]))

    def latest(self, producer: str) -> Completion | None:
        with closing(self._connection()) as conn:
            row = conn.execute("SELECT body FROM cf_publication_completions WHERE producer = ? "
                               "ORDER BY recorded_us DESC, rowid DESC LIMIT 1", (producer,)).fetchone()
        return None if row is None else Completion.from_json(json.loads(row[0]))

    def of_run(self, run_id: str) -> Completion | None:
        with closing(self._connection()) as conn:
            row = conn.execute("SELECT body FROM cf_publication_completions WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else Completion.from_json(json.loads(row[0]))
