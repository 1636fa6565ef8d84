"""The DuckDB read path: one call gives a connection where every table is a view at a snapshot.

This is how notebooks read::

    import contextful.engine.read
    con = contextful.engine.read.connect("path/to/project")          # or a store root, or a Store
    con.sql("SELECT kind, count(*) FROM events GROUP BY kind").show()
    old = contextful.engine.read.connect("path/to/project", as_of="2026-11-01T00:00:00Z")

Each view reads exactly the parts live at its snapshot — the head, or the newest commit at or
before ``as_of`` — with schema evolution and primary-key resolution applied (contextful.storage.snapshot).
Views are pinned, every table at one point (``Store.pin``: one catalog read): a run
committing after ``connect`` does not change what they answer, and none is seen in some tables
but not others; call ``connect`` again to see it. A table whose view cannot be built never keeps
the others from reading: its view raises, when queried, the catalogue error naming it —
``SnapshotNotFound`` as of an instant before its first commit (naming that commit's time),
``SnapshotCollected`` when its parts at that snapshot were collected past retention,
``TableUnreadable`` for any other cause (a part missing, a key naming no column in a store
written before keys were checked) — and :func:`deferred_error` turns DuckDB's error back into
it. ``_runs`` is a view like any other (``_items`` too: at head, before any item ended, an empty
one), and so is each model (its latest published build);
:func:`model_build` adds a view of one specific build (docs/notebooks.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pyarrow as pa
from contextful.engine.project import open_store
from contextful.storage import Store
from contextful.storage.clock import from_us
from contextful.storage.duck_types import empty_select, null_row
from contextful.storage.errors import (
    ArgumentInvalid,
    ContextfulError,
    SnapshotCollected,
    SnapshotNotFound,
    TableUnreadable,
    first_line,
)
from contextful.storage.lazy import lazy_module
from contextful.storage.reserved import ITEMS_TABLE, RUNS_TABLE
from contextful.storage.run_record import history_sql
from contextful.storage.snapshot import Snapshot, quote, snapshot_sql, sql_literal

if TYPE_CHECKING:
    import duckdb
else:
    duckdb = lazy_module("duckdb")

_NAME = r"'(?P<table>[A-Za-z_][A-Za-z0-9_]*)'"
_DEFERRED: dict[str, tuple[Callable[..., ContextfulError], re.Pattern[str]]] = {  # each error a view may defer, by name
    "TableUnreadable": (TableUnreadable, re.compile(rf"table {_NAME} cannot be read: (?P<reason>.*)", re.DOTALL)),
    "SnapshotNotFound": (SnapshotNotFound, re.compile(rf"table {_NAME} has no snapshot (?P<wanted>.*)", re.DOTALL)),
    "SnapshotCollected": (SnapshotCollected, re.compile(
        rf"table {_NAME} snapshot (?P<commit_seq>\d+): part (?P<missing>.*) was collected past retention", re.DOTALL)),
}
_DEFERRED_ERROR = re.compile(rf"\b({'|'.join(_DEFERRED)}): (.*)", re.DOTALL)
INSTANT_FORMS = ("an ISO-8601 instant such as 2026-11-29T12:00:00Z, 2026-11-29T13:00:00+01:00 or 2026-11-29 "
                 "(UTC without an offset)")


def parse_instant(value: str | datetime | None, argument: str = "as_of") -> datetime | None:
    """An ``as_of`` given as ISO-8601 text (``Z`` allowed) or a datetime, as an aware instant (a
    value without an offset is UTC); ArgumentInvalid naming ``argument`` when it is neither."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ArgumentInvalid(argument, value, f"not {INSTANT_FORMS}") from None
    if not isinstance(value, datetime):
        raise ArgumentInvalid(argument, value, f"give {INSTANT_FORMS}, or a datetime")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def connect(project_or_store: Store | str | os.PathLike[str] | None = None,
            as_of: str | datetime | None = None, *, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per store table at head (or ``as_of`` a transaction time).

    As of an instant before a table's first commit, that table's view raises SnapshotNotFound.
    """
    instant = parse_instant(as_of)  # before the store opens: a mistyped instant touches nothing
    store = project_or_store if isinstance(project_or_store, Store) else open_store(project_or_store)
    try:
        con = store.duckdb(database)
        attach_views(con, store, instant)
        return con
    finally:
        if store is not project_or_store:
            store.close()


def attach_views(con: duckdb.DuckDBPyConnection, store: Store, as_of: datetime | None = None) -> list[str]:
    """Create (or replace) one view per table of ``store`` in ``con``; return their names.

    At the head, ``_runs`` answers the durable record merged with rows still in the catalog's
    cache (``contextful.storage.run_record``); as of a past instant it answers what ``_runs`` held then.
    """
    names: list[str] = []
    cached = store.catalog.pending_run_texts() if as_of is None else None  # before the pin (history_sql)
    pinned, unborn = store.pin_with_unborn(as_of=as_of)  # every table pinned at one point
    spelled: dict[str, str] = {}  # DuckDB compares view names case-insensitively
    for name, (table, seq) in pinned.items():
        if cached is not None and name == RUNS_TABLE:
            continue  # attached below, merged with the cache
        twin = spelled.setdefault(name.lower(), name)
        if twin != name:  # a store written before case twins were refused: neither view is answered
            attach_error(con, name, TableUnreadable(name, f"its name differs only in case from the table {twin!r}, "
                                                          f"and DuckDB reads both names as one view"))
            continue
        try:
            snap = table.snapshot_at(seq)
        except SnapshotCollected as exc:
            attach_error(con, name, exc, table.schema_at(seq))
            names.append(name)
            continue
        if snap.schema is None:
            continue
        try:
            attach_snapshot(con, snap, name)
        except TableUnreadable as exc:
            attach_error(con, name, exc, snap.schema)
        except duckdb.Error as exc:  # one table's view does not bind: it alone answers an error
            attach_error(con, name, TableUnreadable(name, first_line(exc)), snap.schema)
        names.append(name)
    if cached is not None:  # at the head: the durable record merged with the catalog's cache
        runs = pinned.get(RUNS_TABLE)
        try:
            durable = runs[0].snapshot_at(runs[1]) if runs is not None else None
            con.execute(f"CREATE OR REPLACE VIEW {quote(RUNS_TABLE)} AS {history_sql(con, cached, durable)}")
        except (SnapshotCollected, TableUnreadable) as exc:
            attach_error(con, RUNS_TABLE, exc)
        except duckdb.Error as exc:
            attach_error(con, RUNS_TABLE, TableUnreadable(RUNS_TABLE, first_line(exc)))
        names.insert(0, RUNS_TABLE)
    for name in unborn:  # as of an instant before its first commit: reading it is SnapshotNotFound
        if as_of is None or name.lower() in spelled or name in names:
            continue
        first = store.catalog.first_commit_us(name)  # one indexed row per such table
        landed = ("no commit has landed in it" if first is None
                  else f"its first commit landed at {from_us(first).isoformat()}")
        attach_error(con, name, SnapshotNotFound(name, f"as of {as_of.isoformat()} ({landed})"),
                     store.table(name).schema)  # the columns it has now: a query naming them binds
        names.append(name)
    if as_of is None and ITEMS_TABLE not in names:  # no item ended yet: the reserved table reads empty
        from contextful.engine.run.items import ITEMS_SCHEMA

        con.execute(f"CREATE OR REPLACE VIEW {quote(ITEMS_TABLE)} AS {empty_select(ITEMS_SCHEMA)}")
        names.append(ITEMS_TABLE)
    return names


def attach_error(con: duckdb.DuckDBPyConnection, view: str, error: ContextfulError,
                 schema: pa.Schema | None = None) -> None:
    """Create (or replace) the view ``view`` raising ``error`` whenever it is read (:func:`deferred_error`
    turns DuckDB's error back into it). ``schema`` gives the view the table's columns, so a query
    naming them binds and answers ``error`` too, the same error whatever its select list."""
    assert error.name in _DEFERRED, f"{error.name} is not an error a view defers"
    message = sql_literal(str(error))
    columns = null_row(schema) if schema is not None and len(schema) else "SELECT NULL AS unreadable"
    con.execute(f"CREATE OR REPLACE VIEW {quote(view)} AS {columns} WHERE error({message}) IS NULL")


def deferred_error(exc: BaseException) -> ContextfulError | None:
    """The catalogue error a query over a view made by :func:`attach_error` raised, if it is one."""
    found = _DEFERRED_ERROR.search(str(exc))
    if found is None:
        return None
    cls, pattern = _DEFERRED[found.group(1)]
    fields = pattern.fullmatch(found.group(2))
    if fields is None:
        return None
    values = {k: int(v) if k == "commit_seq" else v for k, v in fields.groupdict().items()}
    return cls(**values)


def attach_snapshot(con: duckdb.DuckDBPyConnection, snap: Snapshot, view: str) -> None:
    """Create (or replace) the view ``view`` answering exactly ``snap``."""
    sql = snapshot_sql(snap, con)
    if sql is None:
        sql = empty_select(snap.schema or pa.schema([]))
    con.execute(f"CREATE OR REPLACE VIEW {quote(view)} AS {sql}")


def model_build(con: duckdb.DuckDBPyConnection, store: Store, model: str, build_id: int,
                view: str | None = None) -> str:
    """Add a view answering build ``build_id`` of ``model`` (default name ``<model>@<build_id>``);
    return its name. SnapshotNotFound when no build of the model has that id."""
    table = store.table(model)
    commit = next((c for c in table.commits() if c.commit_seq == build_id and c.manifest), None)
    if commit is None or table.manifest(commit.run_id).meta.get("model") != model:
        raise SnapshotNotFound(model, f"at build {build_id} (no build of model {model!r} has that id)")
    name = view or f"{model}@{build_id}"
    attach_snapshot(con, table.snapshot(commit_seq=build_id), name)
    return name
