"""Where an export's Iceberg table's metadata is now, read from a SQL catalog without pyiceberg.

``contextful export run`` with an unchanged source and ``contextful export status`` answer from the
state file (``engine.export.state``) while it describes the table as it is: the catalog's
``metadata_location`` for the table is the one the state file recorded (every Iceberg commit
writes a new metadata file, so an unchanged pointer is an unchanged table). Reading that pointer
through pyiceberg would cost its import (about a second); a SQL catalog keeps it in one row of
``iceberg_tables`` (pyiceberg's ``SqlCatalog`` schema), read here with ``sqlite3`` or ``psycopg``.

:func:`metadata_location` answers the pointer, ``None`` when the catalog holds no such table (a
SQLite catalog file that does not exist yet is not created: reading never writes), or
:data:`UNKNOWN` when it cannot say cheaply — a REST catalog, an in-memory or other SQL URL, or any
failure to read — and the caller asks pyiceberg, whose errors are the ones to report.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from contextful.engine.export.spec import ExportSpec

UNKNOWN: Final = "unknown"
"""Not readable without pyiceberg: ask the catalog through it."""

_QUERY = ("SELECT metadata_location FROM iceberg_tables "
          "WHERE catalog_name = {p} AND table_namespace = {p} AND table_name = {p}")
_POSTGRES = re.compile(r"postgres(?:ql)?(?:\+[a-z0-9_]+)?://", re.IGNORECASE)


def metadata_location(spec: ExportSpec) -> str | None:
    """The export table's current metadata file, ``None`` when there is no such table, or ``UNKNOWN``."""
    catalog = spec.catalog
    if catalog.type != "sql":
        return UNKNOWN
    key = (catalog.name, spec.namespace, spec.table)
    try:
        if catalog.uri.startswith("sqlite:///"):
            return _sqlite(Path(catalog.uri.removeprefix("sqlite:///")), key)
        if _POSTGRES.match(catalog.uri):
            return _postgres(_POSTGRES.sub("postgresql://", catalog.uri, count=1), key)
    except Exception:  # noqa: BLE001 - any failure: pyiceberg reads it and reports what is wrong
        return UNKNOWN
    return UNKNOWN


def _sqlite(path: Path, key: tuple[str, str, str]) -> str | None:
    if not path.is_file():
        return None
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        if con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'iceberg_tables'").fetchone() is None:
            return None
        row = con.execute(_QUERY.format(p="?"), key).fetchone()
    finally:
        con.close()
    return _answer(row)


def _postgres(url: str, key: tuple[str, str, str]) -> str | None:
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as con:
        if con.execute("SELECT to_regclass('iceberg_tables') IS NOT NULL").fetchone() != (True,):
            return None
        row = con.execute(_QUERY.format(p="%s"), key).fetchone()
    return _answer(row)


def _answer(row: tuple[str | None] | None) -> str | None:
    if row is None:
        return None
    return row[0] or UNKNOWN  # a row without a pointer: pyiceberg says what it makes of it
