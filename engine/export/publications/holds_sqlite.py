"""The local profile's publication holds (``surface.dispatch.export-quiesced``, ``export-claim``): one row
per holder and publication in the store's SQLite catalog database (``cf_publication_holds``), beside
its other ``cf_`` tables.

Every take is one ``BEGIN IMMEDIATE`` transaction (the catalog's writer lock), so an exclusive take and
a shared claim never interleave: a claim either sees the exclusive row and takes nothing, or commits
before the take, and the exporter then waits for it. A row whose ``expires_us`` has passed holds
nothing (its holder stopped renewing: crashed) and is swept by the next take.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import TypeVar

from contextful.engine.export.publications.holds import EXCLUSIVE, SHARED, Hold, holder_dead
from contextful.storage.port_dialects import SqliteFilePort

T = TypeVar("T")

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS cf_publication_holds (
        publication TEXT NOT NULL,
        holder TEXT NOT NULL,
        mode TEXT NOT NULL CHECK (mode IN ('exclusive', 'shared')),
        version INTEGER NOT NULL,
        expires_us INTEGER NOT NULL,
        PRIMARY KEY (publication, holder))""",
)
_COLUMNS = "publication, holder, mode, version, expires_us"


def _now_us() -> int:
    return time.time_ns() // 1000


class SqliteHolds(SqliteFilePort):
    """:class:`~contextful.engine.export.publications.holds.PublicationHolds` over the catalog's SQLite file."""

    def _write(self, body: Callable[[sqlite3.Connection, int], T]) -> T:
        try:
            with closing(self._connect()) as conn:
                for statement in SCHEMA:
                    conn.execute(statement)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    now = _now_us()
                    conn.execute("DELETE FROM cf_publication_holds WHERE expires_us <= ?", (now,))
                    answer = body(conn, now)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                return answer
        except sqlite3.Error as exc:
            raise (self._map_error(exc) or exc) from exc

    def _put(self, conn: sqlite3.Connection, publication: str, holder: str, mode: str, expires_us: int) -> Hold:
        conn.execute("INSERT INTO cf_publication_holds (publication, holder, mode, version, expires_us) "
                     "VALUES (?, ?, ?, 1, ?) ON CONFLICT (publication, holder) DO UPDATE SET "
                     "mode = excluded.mode, version = version + 1, expires_us = excluded.expires_us",
                     (publication, holder, mode, expires_us))
        row = conn.execute(f"SELECT {_COLUMNS} FROM cf_publication_holds WHERE publication = ? AND holder = ?",
                           (publication, holder)).fetchone()
        return Hold(*row)

    @staticmethod
    def _exclusive(conn: sqlite3.Connection, publications: Sequence[str], holder: str) -> tuple[Hold, ...]:
        marks = ", ".join("?" * len(publications))
        rows = conn.execute(f"SELECT {_COLUMNS} FROM cf_publication_holds WHERE mode = '{EXCLUSIVE}' "
                            f"AND holder <> ? AND publication IN ({marks}) ORDER BY publication",
                            (holder, *publications)).fetchall()
        return tuple(Hold(*row) for row in rows if not holder_dead(row[1]))  # a dead exporter holds nothing

    def hold_exclusive(self, publication: str, holder: str, lease_s: float) -> Hold | None:
        def take(conn: sqlite3.Connection, now: int) -> Hold | None:
            if self._exclusive(conn, (publication,), holder):
                return None
            return self._put(conn, publication, holder, EXCLUSIVE, now + int(lease_s * 1e6))
        return self._write(take)

    def claim_shared(self, publications: Sequence[str], holder: str, lease_s: float) -> tuple[Hold, ...]:
        names = sorted(set(publications))
        if not names:
            return ()

        def claim(conn: sqlite3.Connection, now: int) -> tuple[Hold, ...]:
            refused = self._exclusive(conn, names, holder)
            if not refused:
                for name in names:
                    self._put(conn, name, holder, SHARED, now + int(lease_s * 1e6))
            return refused
        return self._write(claim)

    def shared_holders(self, publication: str) -> tuple[Hold, ...]:
        try:
            with closing(self._connect()) as conn:
                for statement in SCHEMA:
                    conn.execute(statement)
                rows = conn.execute(f"SELECT {_COLUMNS} FROM cf_publication_holds WHERE publication = ? "
                                    f"AND mode = '{SHARED}' AND expires_us > ? ORDER BY holder",
                                    (publication, _now_us())).fetchall()
        except sqlite3.Error as exc:
            raise (self._map_error(exc) or exc) from exc
        return tuple(Hold(*row) for row in rows)

    def renew(self, holder: str, lease_s: float) -> tuple[Hold, ...]:
        def extend(conn: sqlite3.Connection, now: int) -> tuple[Hold, ...]:
            conn.execute("UPDATE cf_publication_holds SET version = version + 1, expires_us = ? WHERE holder = ?",
                         (now + int(lease_s * 1e6), holder))
            rows = conn.execute(f"SELECT {_COLUMNS} FROM cf_publication_holds WHERE holder = ? ORDER BY publication",
                                (holder,)).fetchall()
            return tuple(Hold(*row) for row in rows)
        return self._write(extend)

    def release(self, holder: str) -> None:
        def drop(conn: sqlite3.Connection, now: int) -> None:
            conn.execute("DELETE FROM cf_publication_holds WHERE holder = ?", (holder,))
        self._write(drop)
