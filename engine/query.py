"""A read-only query over the store's views (``contextful sql``): an allow-list of statement types.

``contextful sql`` reads. DuckDB parses the query into its statements (``extract_statements``) and
each statement's type, as DuckDB's parser reports it, decides before any statement runs:
``SELECT`` is allowed — DuckDB reports ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``, ``FROM``-first queries,
``VALUES`` and ``WITH`` queries as ``SELECT`` too — and every other type is refused with
:class:`QueryWriteRefused` naming it: ``CREATE``, ``INSERT``, ``UPDATE``, ``DELETE``, ``DROP``,
``COPY`` (either way), ``EXPORT``, ``ATTACH``, ``DETACH``, ``INSTALL``/``LOAD``, ``PRAGMA``,
``SET``, ``CALL``, ``EXPLAIN`` (its ``ANALYZE`` form runs the statement it explains), and any type
added later. An allow-list over the parser's own verdict, never a pattern over the query's text
(CONVENTIONS: a sandbox decides on the whole parse tree).

    >>> import duckdb
    >>> check_read_only(duckdb.connect(), "SELECT 1; FROM range(3)")
    >>> check_read_only(duckdb.connect(), "CREATE TABLE t AS SELECT 1")
    Traceback (most recent call last):
    ...
    contextful.storage.errors.QueryWriteRefused: QueryWriteRefused: `contextful sql` only reads: CREATE is not a SELECT statement ...
"""

from __future__ import annotations

import duckdb
from contextful.storage.errors import QueryInvalid, QueryWriteRefused, whole_message

ALLOWED = frozenset({duckdb.StatementType.SELECT})
"""The statement types a read-only query may hold."""


def check_read_only(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Raise unless every statement of ``query`` is one :data:`ALLOWED` admits (nothing runs)."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryInvalid(query, whole_message(exc)) from exc
    if not statements:
        raise QueryInvalid(query, "the query holds no statement")
    for statement in statements:
        if _type(statement) not in ALLOWED:
            raise QueryWriteRefused(query, _named(statement))


def run_query(con: duckdb.DuckDBPyConnection, query: str) -> duckdb.DuckDBPyRelation:
    """The relation of ``query``'s last statement, once every statement is known to only read."""
    from contextful.engine.read import deferred_error

    check_read_only(con, query)
    try:
        rel = con.sql(query)
    except duckdb.Error as exc:
        raise deferred_error(exc) or QueryInvalid(query, whole_message(exc)) from exc
    assert rel is not None, "a SELECT statement answers a relation"
    return rel


def _type(statement: duckdb.Statement) -> duckdb.StatementType | None:
    """The statement's type; None for one DuckDB's Python API has no name for (``UPDATE EXTENSIONS``)."""
    try:
        return statement.type
    except ValueError:
        return None


def _named(statement: duckdb.Statement) -> str:
    """The statement as the query spells it (``INSTALL``) and, when DuckDB types it otherwise, its type."""
    kind = getattr(_type(statement), "name", "unnamed")
    words = statement.query.split(None, 1)
    spelled = words[0].upper() if words else kind
    return spelled if spelled == kind else f"{spelled} (DuckDB statement type {kind})"
