"""What a gateway SQL text reads, found by DuckDB's parser alone (decision "iceberg-audience").

A template is checked when the manifest is parsed and caller SQL when a request arrives, both
before any engine sees them: :func:`read_shape` parses the text with DuckDB's parser
(``extract_statements`` and ``json_serialize_sql`` in a blank connection that holds no table and
may touch no file) and answers its :class:`SqlShape` — the tables it names (CTEs excluded), the
table functions it calls and its parameters. Text that is not exactly one ``SELECT`` raises
:class:`SqlShapeError`, which callers turn into their own catalogue error.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb

from storage.errors import first_line

TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
"""The only spelling of a table a gateway request or its SQL may use."""

SAFE_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
"""Table functions that read no file and no catalog; SQL calling any other is refused."""

_parser_lock = threading.Lock()
_parser: duckdb.DuckDBPyConnection | None = None


class SqlShapeError(ValueError):
    """The text is not one SELECT statement DuckDB's parser accepts; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class TableRef:
    name: str
    schema: str = ""
    catalog: str = ""

    @property
    def qualified(self) -> bool:
        """Whether the reference names a schema or catalog (a namespace, to a reader)."""
        return bool(self.schema or self.catalog)

    def __str__(self) -> str:
        return ".".join(p for p in (self.catalog, self.schema, self.name) if p)


@dataclass(frozen=True)
class SqlShape:
    tables: tuple[TableRef, ...]
    """Every base table the statement reads, in first-appearance order, CTE names excluded."""
    table_functions: tuple[str, ...]
    """Every table function it calls (``read_parquet``, ``range``, ...)."""
    parameters: frozenset[str]
    """Its ``$name`` parameters (positional ones appear as ``1``, ``2``, ...)."""

    @property
    def positional(self) -> bool:
        return any(p.isdigit() for p in self.parameters)

    def unsafe_functions(self) -> list[str]:
        return [f for f in self.table_functions if f.lower() not in SAFE_TABLE_FUNCTIONS]


def read_shape(sql: str) -> SqlShape:
    """The tables, table functions and parameters of ``sql``; SqlShapeError unless one SELECT."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlShapeError(f"DuckDB's parser refused it: {first_line(exc)}") from exc
    if len(statements) != 1:
        raise SqlShapeError(f"it holds {len(statements)} statements; give exactly one SELECT")
    statement = statements[0]
    if statement.type != duckdb.StatementType.SELECT:
        raise SqlShapeError(f"it is {statement.type.name}, not SELECT; only SELECT reads through the gateway")
    tree = _serialize(sql)
    ctes: set[str] = set()
    tables: list[TableRef] = []
    functions: list[str] = []
    for node in _nodes(tree):
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict):
            ctes.update(entry["key"] for entry in cte_map.get("map", []))
        kind = node.get("type")
        if kind == "BASE_TABLE":
            ref = TableRef(node.get("table_name") or "", node.get("schema_name") or "", node.get("catalog_name") or "")
            if ref not in tables:
                tables.append(ref)
        elif kind == "TABLE_FUNCTION":
            function = node.get("function") or {}
            name = function.get("function_name") or "?"
            if name not in functions:
                functions.append(name)
    kept = tuple(t for t in tables if t.qualified or t.name not in ctes)
    return SqlShape(kept, tuple(functions), frozenset(statement.named_parameters))


def _serialize(sql: str) -> dict[str, Any]:
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect()
            _parser.execute("SET enable_external_access = false")
            _parser.execute("SET lock_configuration = true")
        row = _parser.execute("SELECT json_serialize_sql($1::VARCHAR)", [sql]).fetchone()
    assert row is not None
    tree = json.loads(row[0])
    if tree.get("error"):
        raise SqlShapeError(f"DuckDB's parser refused it: {tree.get('error_message')}")
    return tree


def _nodes(tree: Any) -> Iterator[dict[str, Any]]:
    stack = [tree]
    while stack:  # bounded by the parse tree's size
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
