"""One catalog location (a SQLite file or a PostgreSQL schema) that tests open several times.

A :class:`CatalogPlace` opens stores over the same object root and catalog, each with its own
connection (and optionally hooks, ``tests.storage.hooked_catalog``), and holds the catalog's write
lock from a raw connection of its own, the way a concurrent committer does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from contextful.storage import Store
from contextful.storage.catalog import Catalog
from contextful.storage.clock import Clock

from tests.storage.hooked_catalog import HookedPostgresCatalog, HookedSqliteCatalog, Hooks


@dataclass
class CatalogPlace:
    kind: str
    root: Path
    sqlite_path: str = ""
    dsn: str = ""
    schema: str = ""

    def catalog(self, hooks: Hooks | None = None) -> Catalog:
        if self.kind == "sqlite":
            return HookedSqliteCatalog(self.sqlite_path, hooks or Hooks())
        return HookedPostgresCatalog(self.dsn, self.schema, hooks or Hooks())

    def store(self, clock: Clock, hooks: Hooks | None = None) -> Store:
        return Store.open(self.root, catalog=self.catalog(hooks), clock=clock)

    @contextmanager
    def write_lock(self, table: str) -> Iterator[None]:
        """Hold what a commit on ``table`` must wait for: SQLite's writer lock, or the table's
        head row on PostgreSQL. Released (rolled back) on exit."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.sqlite_path, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield
                conn.execute("ROLLBACK")
            finally:
                conn.close()
            return
        with psycopg.connect(self.dsn, autocommit=True) as pg:
            pg.execute("BEGIN")
            pg.execute(f'SELECT 1 FROM "{self.schema}".cf_tables WHERE name = %s FOR UPDATE', (table,))
            yield
            pg.execute("ROLLBACK")


def place_for(kind: str, tmp_path: Path, dsn: str = "", schema: str = "") -> CatalogPlace:
    """The place of ``kind`` (``sqlite``: a file under ``tmp_path``; ``postgres``: ``schema`` on ``dsn``)."""
    if kind == "sqlite":
        return CatalogPlace("sqlite", tmp_path / "store", sqlite_path=str(tmp_path / "catalog.sqlite"))
    return CatalogPlace("postgres", tmp_path / "store", dsn=dsn, schema=schema)
