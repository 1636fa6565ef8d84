"""The gateway's query engine: DuckDB over the current snapshots of one namespace's Iceberg tables.

:class:`NamespaceReader` is opened for one audience (a catalog and its one namespace) and runs one
checked statement at a time (``engine.export.gateway`` has already refused anything beyond the
reader's grant). For each table the statement reads it loads the Iceberg table through pyiceberg,
plans the current snapshot's files and makes a DuckDB view of it:

- local data files with no delete files: ``read_parquet`` over exactly those files, columns in
  the table's schema order;
- anything else (object-store files, delete files, files DuckDB cannot bind to the schema):
  pyiceberg's own scan, as an Arrow table registered under the name.

Then the connection is sealed before the statement runs: external access off (only the planned
data files stay readable), the configuration locked, a memory limit and a thread count set; a
deadline interrupts the statement. A catalog that cannot be reached is ``CatalogUnavailable``; a
table not exported yet is ``NotFound``; DuckDB refusing the statement is ``QueryInvalid``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import duckdb
import pyarrow as pa

from engine.export.catalogs import CatalogCache, guard_catalog
from storage.errors import NotFound, QueryInvalid, first_line
from storage.snapshot import quote

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from engine.export.spec import CatalogSpec

DEFAULT_DEADLINE_S = 60.0
DEFAULT_MEMORY_LIMIT = "4GB"
DEFAULT_THREADS = 2


@dataclass(frozen=True)
class QueryResult:
    data: pa.Table
    """At most ``max_rows`` rows of the answer."""
    truncated: bool
    """Whether the answer had more rows than ``max_rows``."""
    snapshots: dict[str, int | None]
    """The Iceberg snapshot each table was read at (None: the table holds no snapshot yet)."""
    reads: dict[str, str]
    """How each table was read: ``parquet`` (DuckDB over its data files) or ``arrow`` (pyiceberg's scan)."""


class NamespaceReader:
    """Runs checked statements over the current snapshots of ``namespace``'s tables."""

    def __init__(self, catalogs: CatalogCache, spec: CatalogSpec, namespace: str, *,
                 deadline_s: float = DEFAULT_DEADLINE_S, memory_limit: str = DEFAULT_MEMORY_LIMIT,
                 threads: int = DEFAULT_THREADS) -> None:
        self.catalogs = catalogs
        self.spec = spec
        self.namespace = namespace
        self.deadline_s = deadline_s
        self.memory_limit = memory_limit
        self.threads = threads

    def run(self, sql: str, tables: Sequence[str], params: Mapping[str, Any], max_rows: int) -> QueryResult:
        """``sql`` with ``params`` bound, over views of ``tables`` at their current snapshots."""
        catalog = self.catalogs.get(self.spec)
        con = duckdb.connect()
        try:
            snapshots: dict[str, int | None] = {}
            reads: dict[str, str] = {}
            allowed: list[str] = []
            for name in tables:
                table = self._load(catalog, name)
                snapshot = table.current_snapshot()
                snapshots[name] = snapshot.snapshot_id if snapshot else None
                reads[name] = _view(con, name, table, allowed)
            _seal(con, allowed, self.memory_limit, self.threads)
            data, truncated = self._execute(con, sql, dict(params), max_rows)
        finally:
            con.close()
        return QueryResult(data, truncated, snapshots, reads)

    def _load(self, catalog: Catalog, name: str) -> Table:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return guard_catalog(self.spec, lambda: catalog.load_table((self.namespace, name)))
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise NotFound(f"the Iceberg table {name!r} has not been exported yet "
                           f"(`contextful export run` publishes it)", table=name) from exc

    def _execute(self, con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any],
                 max_rows: int) -> tuple[pa.Table, bool]:
        timer = threading.Timer(self.deadline_s, con.interrupt)
        timer.start()
        try:
            reader = con.sql(sql, params=params or None).to_arrow_reader(min(max_rows + 1, 65_536))
            batches: list[pa.RecordBatch] = []
            rows = 0
            for batch in reader:  # bounded by max_rows + 1
                batches.append(batch)
                rows += batch.num_rows
                if rows > max_rows:
                    break
            data = pa.Table.from_batches(batches, reader.schema)
        except duckdb.InterruptException as exc:
            raise QueryInvalid(sql, f"it ran past the gateway's {self.deadline_s:g} s deadline") from exc
        except duckdb.Error as exc:
            raise QueryInvalid(sql, first_line(exc)) from exc
        finally:
            timer.cancel()
        return (data.slice(0, max_rows), True) if data.num_rows > max_rows else (data, False)


def _view(con: duckdb.DuckDBPyConnection, name: str, table: Table, allowed: list[str]) -> str:
    """Make ``name`` a view of the table's current snapshot; how it reads (``parquet``/``arrow``)."""
    scan = table.scan()
    tasks = list(scan.plan_files())
    paths = [_local_path(t.file.file_path) for t in tasks]
    if tasks and all(paths) and not any(t.delete_files for t in tasks):
        files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
        columns = ", ".join(quote(field.name) for field in table.schema().fields)
        try:
            con.execute(f"CREATE VIEW {quote(name)} AS SELECT {columns} "
                        f"FROM read_parquet([{files}], union_by_name = true)")
            allowed.extend(str(p) for p in paths)
            return "parquet"
        except duckdb.Error:
            pass  # files written under another schema (another engine): pyiceberg's scan maps them
    con.register(name, scan.to_arrow())
    return "arrow"


def _seal(con: duckdb.DuckDBPyConnection, allowed: list[str], memory_limit: str, threads: int) -> None:
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET threads = {int(threads)}")
    if allowed:
        con.execute("SET allowed_paths = $1", [allowed])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def _local_path(uri: str) -> Path | None:
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if not parts.scheme and uri.startswith("/"):
        return Path(uri)
    return None
