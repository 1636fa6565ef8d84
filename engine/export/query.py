"""The gateway's query engine: DuckDB over the current snapshots of one namespace's Iceberg tables.

:class:`NamespaceReader` is opened for one audience (a catalog and its one namespace) and runs one
checked statement at a time (``engine.export.gateway`` has already refused anything beyond the
reader's grant). For each table the statement reads it loads the Iceberg table through pyiceberg,
plans the current snapshot's files and makes a DuckDB view of it:

- local data files with no delete files: ``read_parquet`` over exactly those files, columns in
  the table's schema order (``parquet``);
- anything else (object-store files, delete files, files DuckDB cannot bind to the schema):
  pyiceberg's own scan. A table the statement scans once is registered as pyiceberg's batch
  reader, which DuckDB pulls lazily — a ``LIMIT 1`` reads the first batches, not the table
  (``stream``); a table it may scan more than once (several references, or inside a CTE) is read
  into memory first, at most the memory limit's worth (``arrow``).

Then the connection is sealed before the statement runs: external access off (only the planned
data files stay readable), Python replacement scans off, the configuration locked, a memory limit
and a thread count set; a deadline interrupts the statement, however far its answer has streamed.
:meth:`NamespaceReader.open` yields a :class:`QueryStream` whose batches are pulled from DuckDB as
the answer is written, at most ``max_rows`` rows. A catalog that cannot be reached is
``CatalogUnavailable``; a table not exported yet is ``NotFound``; DuckDB refusing the statement
(or the deadline, or the memory limit) is ``QueryInvalid``. Anything else — a data file gone or
unreadable under the catalog, an engine fault — propagates as it is: the gateway answers it as
``QueryFailed`` with an error id, never with its text.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import duckdb
import pyarrow as pa
from contextful.engine.export.catalogs import CatalogCache, guard_catalog
from contextful.storage.errors import NotFound, QueryInvalid, whole_message
from contextful.storage.snapshot import quote

if TYPE_CHECKING:
    from contextful.engine.export.spec import CatalogSpec
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

DEFAULT_DEADLINE_S = 60.0
DEFAULT_MEMORY_LIMIT_BYTES = 4 << 30
DEFAULT_THREADS = 2
BATCH_ROWS = 16_384
"""Rows per batch pulled from DuckDB."""

_READER_ERRORS = (duckdb.ParserException, duckdb.SyntaxException, duckdb.BinderException, duckdb.CatalogException,
                  duckdb.ConversionException, duckdb.InvalidInputException, duckdb.InvalidTypeException,
                  duckdb.TypeMismatchException, duckdb.OutOfRangeException, duckdb.NotImplementedException,
                  duckdb.PermissionException)
"""DuckDB errors a statement itself causes; any other error is the gateway's, not the reader's."""


@dataclass
class QueryStream:
    """An answer being read: its schema and snapshots, then its batches (at most ``max_rows`` rows)."""

    schema: pa.Schema
    snapshots: dict[str, int | None]
    """The Iceberg snapshot each table was read at (None: the table holds no snapshot yet)."""
    reads: dict[str, str]
    """How each table was read: ``parquet``, ``stream`` or ``arrow`` (see the module docstring)."""
    scans: _Scans
    """What pyiceberg's scans handed the engine so far."""
    batches: Iterator[pa.RecordBatch] = field(default_factory=lambda: iter(()))
    """The answer's batches, pulled from the engine as they are read; at most ``max_rows`` rows."""
    truncated: bool = False
    """Whether the engine had rows past ``max_rows`` (known once ``batches`` is exhausted)."""
    rows: int = 0


@dataclass(frozen=True)
class QueryResult:
    data: pa.Table
    """At most ``max_rows`` rows of the answer."""
    truncated: bool
    """Whether the answer had more rows than ``max_rows``."""
    snapshots: dict[str, int | None]
    reads: dict[str, str]


class NamespaceReader:
    """Runs checked statements over the current snapshots of ``namespace``'s tables."""

    def __init__(self, catalogs: CatalogCache, spec: CatalogSpec, namespace: str, *,
                 deadline_s: float = DEFAULT_DEADLINE_S, memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
                 threads: int = DEFAULT_THREADS) -> None:
        self.catalogs = catalogs
        self.spec = spec
        self.namespace = namespace
        self.deadline_s = deadline_s
        self.memory_limit_bytes = memory_limit_bytes
        self.threads = threads

    @contextmanager
    def open(self, sql: str, tables: Sequence[str], params: Mapping[str, Any], max_rows: int, *,
             rescanned: Collection[str] = ()) -> Iterator[QueryStream]:
        """``sql`` with ``params`` bound, over views of ``tables`` at their current snapshots, streaming.

        ``rescanned`` names the tables the statement may scan more than once (a lazy reader is
        read once, so those are read into memory when they go through pyiceberg's scan).
        """
        catalog = self.catalogs.get(self.spec)
        con = duckdb.connect()
        deadline = threading.Event()

        def interrupt() -> None:
            deadline.set()
            try:
                con.interrupt()
            except duckdb.Error:
                pass  # the connection closed as the deadline passed: nothing left to interrupt

        timer = threading.Timer(self.deadline_s, interrupt)
        timer.start()
        try:
            snapshots: dict[str, int | None] = {}
            reads: dict[str, str] = {}
            scans = _Scans()
            allowed: list[str] = []
            for name in tables:
                table = self._load(catalog, name)
                snapshot = table.current_snapshot()
                snapshots[name] = snapshot.snapshot_id if snapshot else None
                reads[name] = self._view(con, name, table, allowed, scans, once=name not in rescanned)
            _seal(con, allowed, self.memory_limit_bytes, self.threads)
            try:
                reader = con.sql(sql, params=dict(params) or None).to_arrow_reader(min(max_rows + 1, BATCH_ROWS))
            except duckdb.Error as exc:
                raise self._engine_error(exc, sql, scans) from exc
            stream = QueryStream(reader.schema, snapshots, reads, scans)
            stream.batches = self._bounded(stream, reader, max_rows, sql, deadline)
            yield stream
        finally:
            timer.cancel()
            con.close()

    def run(self, sql: str, tables: Sequence[str], params: Mapping[str, Any], max_rows: int) -> QueryResult:
        """The whole answer (at most ``max_rows`` rows) in memory."""
        with self.open(sql, tables, params, max_rows) as stream:
            data = pa.Table.from_batches(list(stream.batches), stream.schema)
        return QueryResult(data, stream.truncated, stream.snapshots, stream.reads)

    def _bounded(self, stream: QueryStream, reader: pa.RecordBatchReader, max_rows: int, sql: str,
                 deadline: threading.Event) -> Iterator[pa.RecordBatch]:
        batches = iter(reader)
        while True:  # bounded: it stops at the first batch past max_rows
            try:
                batch = next(batches, None)
            except duckdb.Error as exc:
                raise self._engine_error(exc, sql, stream.scans) from exc
            except (pa.ArrowException, OSError) as exc:  # DuckDB's error, carried through Arrow's C stream as text
                raise self._engine_error(_as_duckdb(exc), sql, stream.scans) from exc
            if deadline.is_set():  # an interrupted stream may just end: never take that for the whole answer
                raise self._engine_error(duckdb.InterruptException("deadline"), sql, stream.scans)
            if batch is None:
                return
            room = max_rows - stream.rows
            if batch.num_rows > room:
                stream.truncated = True
                if room:
                    stream.rows += room
                    yield batch.slice(0, room)
                return
            stream.rows += batch.num_rows
            yield batch

    def _engine_error(self, exc: duckdb.Error, sql: str, scans: _Scans) -> Exception:
        """The catalogue error for a statement's own failure; any other failure as it is."""
        if scans.failed is not None:
            return scans.failed
        if isinstance(exc, duckdb.InterruptException):
            return QueryInvalid(sql, f"it ran past the gateway's {self.deadline_s:g} s deadline")
        if isinstance(exc, duckdb.OutOfMemoryException):
            return QueryInvalid(sql, f"it needs more than the gateway's {self.memory_limit_bytes:,}-byte memory limit")
        if isinstance(exc, _READER_ERRORS):
            return QueryInvalid(sql, whole_message(exc))
        return exc

    def _load(self, catalog: Catalog, name: str) -> Table:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            return guard_catalog(self.spec, lambda: catalog.load_table((self.namespace, name)))
        except (NoSuchTableError, NoSuchNamespaceError) as exc:
            raise NotFound(f"the Iceberg table {name!r} has not been exported yet "
                           f"(`contextful export run` publishes it)", table=name) from exc

    def _view(self, con: duckdb.DuckDBPyConnection, name: str, table: Table, allowed: list[str],
              scans: _Scans, *, once: bool) -> str:
        """Make ``name`` a view of the table's current snapshot; how it reads (``parquet``/``stream``/``arrow``)."""
        scan = table.scan()
        tasks = list(scan.plan_files())
        paths = [_local_path(t.file.file_path) for t in tasks]
        if tasks and all(paths) and not any(t.delete_files for t in tasks):
            files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
            columns = ", ".join(quote(f.name) for f in table.schema().fields)
            try:
                con.execute(f"CREATE VIEW {quote(name)} AS SELECT {columns} "
                            f"FROM read_parquet([{files}], union_by_name = true, hive_partitioning = false)")
                allowed.extend(str(p) for p in paths)
                return "parquet"
            except duckdb.Error:
                pass  # files written under another schema (another engine): pyiceberg's scan maps them
        reader = scan.to_arrow_batch_reader()
        counted = pa.RecordBatchReader.from_batches(reader.schema, scans.counting(reader, name))
        if once:
            con.register(name, counted)
            return "stream"
        con.register(name, _read_within(counted, self.memory_limit_bytes, name))
        return "arrow"


_KINDS: dict[str, type[duckdb.Error]] = {
    "Parser": duckdb.ParserException, "Syntax": duckdb.SyntaxException, "Binder": duckdb.BinderException,
    "Catalog": duckdb.CatalogException, "Conversion": duckdb.ConversionException,
    "Invalid Input": duckdb.InvalidInputException, "Invalid Type": duckdb.InvalidTypeException,
    "Type Mismatch": duckdb.TypeMismatchException, "Out of Range": duckdb.OutOfRangeException,
    "Not implemented": duckdb.NotImplementedException, "Permission": duckdb.PermissionException,
    "INTERRUPT": duckdb.InterruptException, "Out of Memory": duckdb.OutOfMemoryException,
}
"""DuckDB's error kinds by the name its messages start with (``Conversion Error: ...``)."""


def _as_duckdb(exc: Exception) -> duckdb.Error:
    """The DuckDB error an Arrow stream error carries, by its message's kind; a plain ``duckdb.Error`` else."""
    kind, sep, _ = str(exc).partition(" Error: ")
    return _KINDS.get(kind, duckdb.Error)(str(exc)) if sep else duckdb.Error(str(exc))


class _Scans:
    """Rows each pyiceberg scan handed the engine, and the first failure of one (the gateway's, not the reader's)."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.failed: Exception | None = None

    def counting(self, reader: pa.RecordBatchReader, name: str) -> Iterator[pa.RecordBatch]:
        self.rows[name] = 0
        try:
            for batch in reader:  # bounded by the engine: it stops pulling once it has what it needs
                self.rows[name] += batch.num_rows
                yield batch
        except Exception as exc:
            self.failed = exc
            raise


def _read_within(reader: pa.RecordBatchReader, limit: int, name: str) -> pa.Table:
    """The whole table, or QueryInvalid once it holds more than ``limit`` bytes."""
    batches: list[pa.RecordBatch] = []
    held = 0
    for batch in reader:  # bounded by ``limit`` bytes
        held += batch.nbytes
        if held > limit:
            raise QueryInvalid(f"(the table {name})", f"it scans {name!r} more than once, and {name!r} is over the "
                                                      f"gateway's {limit:,}-byte memory limit; read it once")
        batches.append(batch)
    return pa.Table.from_batches(batches, reader.schema)


def _seal(con: duckdb.DuckDBPyConnection, allowed: list[str], memory_limit_bytes: int, threads: int) -> None:
    con.execute(f"SET memory_limit = '{int(memory_limit_bytes)}B'")
    con.execute(f"SET threads = {int(threads)}")
    if allowed:
        con.execute("SET allowed_paths = $1", [allowed])
    con.execute("SET enable_external_access = false")
    con.execute("SET python_enable_replacements = false")
    con.execute("SET lock_configuration = true")


def _local_path(uri: str) -> Path | None:
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if not parts.scheme and uri.startswith("/"):
        return Path(uri)
    return None
