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
but not others; call ``connect`` again to see it. A table whose view cannot be built (a part
missing, a snapshot collected, a key naming no column in a store written before keys were
checked) never keeps the others from reading: its view raises ``TableUnreadable`` naming it and
the cause when queried (:func:`unreadable_error` turns DuckDB's error back into it). ``_runs`` is
a view like any other, and so is each model (its latest
published build); :func:`model_build` adds a view of one specific build (docs/notebooks.md).
"""

from __future__ import annotations

import os
import re
from datetime import datetime

import duckdb
import pyarrow as pa
from contextful.engine.project import open_store
from contextful.storage import Store
from contextful.storage.errors import SnapshotCollected, SnapshotNotFound, TableUnreadable, first_line
from contextful.storage.reserved import RUNS_TABLE
from contextful.storage.snapshot import Snapshot, quote, snapshot_sql, sql_literal

_RUNS_CACHE = "__contextful_runs_history"
_UNREADABLE = re.compile(r"TableUnreadable: table '([A-Za-z_][A-Za-z0-9_]*)' cannot be read: (.*)", re.DOTALL)


def parse_instant(value: str | datetime | None) -> datetime | None:
    """An ``as_of`` given as an ISO-8601 string (``Z`` allowed) or a datetime."""
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


def connect(project_or_store: Store | str | os.PathLike[str] | None = None,
            as_of: str | datetime | None = None, *, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per store table at head (or ``as_of`` a transaction time).

    A table whose first commit came after ``as_of`` has no view.
    """
    store = project_or_store if isinstance(project_or_store, Store) else open_store(project_or_store)
    try:
        con = store.duckdb(database)
        attach_views(con, store, parse_instant(as_of))
        return con
    finally:
        if store is not project_or_store:
            store.close()


def attach_views(con: duckdb.DuckDBPyConnection, store: Store, as_of: datetime | None = None) -> list[str]:
    """Create (or replace) one view per table of ``store`` in ``con``; return their names.

    At the head, ``_runs`` answers the durable record merged with rows still in the catalog's
    cache (``contextful.storage.run_record``); as of a past instant it answers what ``_runs`` held then.
    """
    names = []
    if as_of is None:
        con.register(_RUNS_CACHE, store.runs.history())
        con.execute(f"CREATE OR REPLACE VIEW {quote(RUNS_TABLE)} AS SELECT * FROM {quote(_RUNS_CACHE)}")
        names.append(RUNS_TABLE)
    spelled: dict[str, str] = {}  # DuckDB compares view names case-insensitively
    for name, (table, seq) in store.pin(as_of=as_of).items():  # every table pinned at one point
        if name in names:
            continue
        twin = spelled.setdefault(name.lower(), name)
        if twin != name:  # a store written before case twins were refused: neither view is answered
            attach_unreadable(con, name, f"its name differs only in case from the table {twin!r}, and DuckDB "
                                         f"reads both names as one view")
            continue
        try:
            snap = table.snapshot_at(seq)
        except SnapshotCollected as exc:
            attach_unreadable(con, name, exc.detail)
            names.append(name)
            continue
        if snap.schema is None:
            continue
        try:
            attach_snapshot(con, snap, name)
        except TableUnreadable as exc:
            attach_unreadable(con, name, exc.reason)
        except duckdb.Error as exc:  # one table's view does not bind: it alone answers an error
            attach_unreadable(con, name, first_line(exc))
        names.append(name)
    return names


def attach_unreadable(con: duckdb.DuckDBPyConnection, view: str, reason: str) -> None:
    """Create (or replace) the view ``view`` raising :class:`TableUnreadable` whenever it is read."""
    message = sql_literal(str(TableUnreadable(view, reason)))
    con.execute(f"CREATE OR REPLACE VIEW {quote(view)} AS SELECT NULL AS unreadable WHERE error({message}) IS NULL")


def unreadable_error(exc: Exception) -> TableUnreadable | None:
    """The :class:`TableUnreadable` a query over an unreadable table's view raised, if it is one."""
    found = _UNREADABLE.search(str(exc))
    return TableUnreadable(found.group(1), found.group(2)) if found else None


def attach_snapshot(con: duckdb.DuckDBPyConnection, snap: Snapshot, view: str) -> None:
    """Create (or replace) the view ``view`` answering exactly ``snap``."""
    sql = snapshot_sql(snap, con)
    if sql is None:
        empty = f"__contextful_empty_{view}"
        con.register(empty, (snap.schema or pa.schema([])).empty_table())
        sql = f"SELECT * FROM {quote(empty)}"
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
