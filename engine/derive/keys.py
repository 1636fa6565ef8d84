"""Derivation keys: lowercase hex SHA-256 deciding whether a settled unit is current.

Implements ``run.emit.derivation-key``, ``run.emit.local-content-key``, ``run.emit.task-version``
and ``run.select.join-key`` (decisions "derivation-key-decides", "derived-unit-follows",
"host-registered-derive").

A key is the SHA-256 of one text: a *static* part fixed by the build, then the unit's own parts,
separated by U+001F::

    static  = sha256(canonical JSON of
                built-in task: {"task", "engine", "binding" (less its bounds and zone), "columns"}
                host task:     {"task", "task_version", "columns"})
    key     = sha256(static  US  json(parent id)  US  json(media value | declared parent columns)
                     US  parent's derivation_key ("" when the parent is not a derive output)
                     US  sha256 of the local media file's bytes ("" for an address)
                     US  join digest ("" without joins))

The per-unit part is computed by DuckDB over the parent scan (:func:`key_sql`), so selection stays
columnar: a changed engine binding, output column list or task version changes ``static`` and
re-selects every unit; a corrected parent row, changed media bytes under the same path, or a joined
row landing, changing or leaving changes that unit's key alone. The engine id alone never decides.

Local media bytes are hashed again only when the file's stat (size, mtime, ctime, inode) changed
since the machine last hashed it (:class:`MediaDigests`, a cache under ``.contextful/derive/``), so
a run does not re-read every file of the archive.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

SEPARATOR = "\x1f"
DIGEST_CACHE = Path(".contextful") / "derive" / "media-digests.sqlite"


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def static_digest(parts: Mapping[str, Any]) -> str:
    """The build's part of every key of one pipeline (its task, engine binding, columns, version)."""
    return hashlib.sha256(canonical(parts).encode()).hexdigest()


def sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def key_sql(static: str, unit: str, value: str, parent_key: str | None, content: str | None,
            join: str | None = None) -> str:
    """The DuckDB expression of a unit's key from SQL expressions of its parts (``parent_key``,
    ``content`` and ``join``: text or NULL; None: absent)."""
    sep = f"chr({ord(SEPARATOR)})"
    parts = [sql_text(static), f"CAST(to_json({unit}) AS VARCHAR)", f"coalesce(CAST(to_json({value}) AS VARCHAR), 'null')",
             f"coalesce({parent_key}, '')" if parent_key else "''",
             f"coalesce({content}, '')" if content else "''",
             f"coalesce({join}, '')" if join else "''"]
    return "sha256(" + f" || {sep} || ".join(parts) + ")"


def is_address(media: str) -> bool:
    return media.startswith(("http://", "https://"))


def local_path(media: str, root: Path) -> Path:
    """A local media value's path: absolute as written, else relative to the project."""
    path = Path(media)
    return path if path.is_absolute() else root / path


class MediaDigests:
    """SHA-256 of local media files, re-hashed only when a file's stat changed (a machine-local cache)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        path = root / DIGEST_CACHE
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS digests (path TEXT PRIMARY KEY, stat TEXT NOT NULL, "
                         "sha256 TEXT NOT NULL)")
        self.hashed = 0
        """Files read this session (the rest came from the cache)."""

    def close(self) -> None:
        self._db.close()

    def digest(self, path: Path) -> str | None:
        """The file's SHA-256, or None when it is not a readable regular file (that unit fails alone)."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        if not os.path.isfile(path):
            return None
        stat = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
        row = self._db.execute("SELECT stat, sha256 FROM digests WHERE path = ?", (str(path),)).fetchone()
        if row is not None and row[0] == stat:
            return str(row[1])
        sha = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    sha.update(chunk)
        except OSError:
            return None
        self.hashed += 1
        self._db.execute("INSERT INTO digests VALUES (?, ?, ?) ON CONFLICT(path) DO UPDATE SET stat = excluded.stat, "
                         "sha256 = excluded.sha256", (str(path), stat, sha.hexdigest()))
        return sha.hexdigest()

    def table(self, media: Iterable[str | None]) -> tuple[list[str], list[str | None]]:
        """Columns (media, digest) for the local values of ``media`` (addresses and nulls skipped)."""
        values: list[str] = []
        digests: list[str | None] = []
        for value in media:
            if value is None or is_address(value):
                continue
            values.append(value)
            digests.append(self.digest(local_path(value, self.root)))
        return values, digests


def join_digest_sql(table_view: str, column: str, read: Sequence[str]) -> str:
    """A SELECT of (join value, digest) over a joined table: each value's rows as JSON over the read
    columns (every column when none is declared), sorted, hashed (``run.select.join-key``)."""
    from contextful.storage.snapshot import quote

    row = ("to_json({" + ", ".join(f"{sql_text(c)}: j.{quote(c)}" for c in read) + "})") if read else "to_json(j)"
    return (f"SELECT j.{quote(column)} AS join_value, sha256(string_agg(CAST({row} AS VARCHAR), chr(30) "
            f"ORDER BY CAST({row} AS VARCHAR))) AS join_digest FROM {table_view} AS j GROUP BY j.{quote(column)}")
