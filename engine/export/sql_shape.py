"""Whether gateway SQL may run, decided on DuckDB's parse tree of the whole statement (decision "iceberg-audience").

A template is checked when the manifest is parsed and caller SQL when a request arrives, both
before any engine sees them. :func:`read_shape` parses the text with DuckDB's parser
(``extract_statements`` and ``json_serialize_sql`` in a blank connection that holds no table and
may touch no file) and walks the tree with an allow-list (CONVENTIONS: "a sandbox decides on the
whole parse tree with an allow-list"):

- every node kind, expression class and key the walk meets is one it knows; anything else —
  a node kind or key a newer DuckDB adds, ``PIVOT``, ``SAMPLE``, time travel, ``USING KEY`` —
  is refused, never skipped;
- every relation at every depth (CTE bodies, subqueries in FROM and in expressions, set
  operations, lateral joins, table-function arguments) is resolved where it stands: a name is a
  CTE only when a CTE of that name is in scope there (defined by an enclosing query, by an earlier
  CTE of the same ``WITH``, or the recursive CTE itself), otherwise a base table, which must be a
  bare ``[a-z_][a-z0-9_]*`` name (no schema, no catalog, no path: a string-literal "table" is a
  replacement scan of a file);
- every function call names a function of :mod:`engine.export.sql_vocabulary` (table functions:
  ``range``, ``generate_series``, ``unnest``), every cast a known type, with no schema or catalog.

The answer is a :class:`SqlShape`: the base tables and parameters, and ``sql``, the checked tree
rendered back to text by ``json_deserialize_sql`` — what the gateway's engine runs for caller SQL,
so a clause the serializer does not carry is not run either. Anything refused raises
:class:`SqlShapeError` with a reason naming what was refused; callers turn it into their own
catalogue error.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.engine.export.sql_vocabulary import (
    AGGREGATES,
    FUNCTIONS,
    SQL_VALUE_COLUMNS,
    SQL_VALUE_FUNCTIONS,
    TABLE_FUNCTIONS,
    TYPES,
    WINDOW_FUNCTIONS,
)
from contextful.storage.errors import first_line
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import duckdb
else:
    duckdb = lazy_module("duckdb")

TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")
"""The only spelling of a table a gateway request or its SQL may use."""

CTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A CTE's name: a plain identifier (it is matched as DuckDB does, ASCII case-insensitively)."""

_ASCII_NAME = re.compile(r"[\x21-\x7e]+")

_parser_lock = threading.Lock()
_parser: duckdb.DuckDBPyConnection | None = None


class SqlShapeError(ValueError):
    """The text is not one SELECT the gateway admits; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class SqlShape:
    tables: tuple[str, ...]
    """Every base table the statement reads (bare names), in first-appearance order, CTEs excluded."""
    parameters: frozenset[str]
    """Its ``$name`` parameters (positional ones appear as ``1``, ``2``, ...)."""
    sql: str
    """The checked parse tree rendered back to SQL: the text the engine runs."""
    rescanned: frozenset[str] = frozenset()
    """The base tables the engine may scan more than once: named twice or more, or inside a CTE."""

    @property
    def positional(self) -> bool:
        return any(p.isdigit() for p in self.parameters)


def read_shape(sql: str) -> SqlShape:
    """The tables and parameters of ``sql``; SqlShapeError unless it is one SELECT the allow-list admits."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlShapeError(f"DuckDB's parser refused it: {first_line(exc)}") from exc
    if len(statements) != 1:
        raise SqlShapeError(f"it holds {len(statements)} statements; give exactly one SELECT")
    statement = statements[0]
    if statement.type != duckdb.StatementType.SELECT:
        raise SqlShapeError(f"it is {statement.type.name}, not SELECT; only SELECT reads through the gateway")
    try:
        walk = _checked(sql)
        # The engine runs the checked tree rendered back to text, and that text is checked in turn:
        # what runs is exactly what was checked, whatever the serializer leaves out or spells anew.
        rendered = _render(sql)
        again = _checked(rendered)
    except RecursionError as exc:
        raise SqlShapeError("it nests deeper than the gateway checks") from exc
    if (again.tables, again.parameters, again.references) != (walk.tables, walk.parameters, walk.references):
        raise SqlShapeError("it reads differently once rendered back to SQL; the gateway runs only what it checks")
    rescanned = frozenset(t for t in walk.tables if walk.references.count(t) > 1) | walk.in_cte
    return SqlShape(tuple(walk.tables), frozenset(walk.parameters), rendered, rescanned)


def _checked(sql: str) -> _Walk:
    tree = json.loads(_parse("SELECT json_serialize_sql($1::VARCHAR)", sql))
    if tree.get("error") is not False:
        raise SqlShapeError(f"DuckDB's parser refused it: {tree.get('error_message')}")
    _keys(tree, {"error", "statements"}, "the parse")
    found = tree["statements"]
    if not isinstance(found, list) or len(found) != 1:
        raise SqlShapeError("it is not exactly one SELECT statement")
    walk = _Walk()
    walk.statement(found[0], ())
    return walk


def _render(sql: str) -> str:
    return _parse("SELECT json_deserialize_sql(json_serialize_sql($1::VARCHAR))", sql)


def _parse(query: str, sql: str) -> str:
    """One parser call in the blank, sealed parser connection."""
    global _parser
    with _parser_lock:
        if _parser is None:
            _parser = duckdb.connect()
            _parser.execute("SET enable_external_access = false")
            _parser.execute("SET lock_configuration = true")
        try:
            row = _parser.execute(query, [sql]).fetchone()
        except duckdb.Error as exc:
            raise SqlShapeError(f"DuckDB's parser refused it: {first_line(exc)}") from exc
    assert row is not None
    return str(row[0])


def _keys(node: Any, known: Iterable[str], what: str) -> dict[str, Any]:
    """``node`` as a dict holding no key outside ``known``."""
    if not isinstance(node, dict):
        raise SqlShapeError(f"{what}: the parse tree holds {type(node).__name__} where a node belongs")
    unknown = sorted(set(node) - set(known))
    if unknown:
        raise SqlShapeError(f"{what}: the gateway does not know {unknown[0]!r} here; it runs only what it checks")
    return node


def _empty(node: dict[str, Any], keys: Iterable[str], what: str) -> None:
    """Refuse ``what`` unless each of ``keys`` is absent, null, false or empty."""
    for key in keys:
        if node.get(key) not in (None, False, [], {}, ""):
            raise SqlShapeError(f"{what} ({key.replace('_', ' ')}) is not something the gateway runs")


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _ASCII_NAME.fullmatch(value):
        raise SqlShapeError(f"{what} {value!r} is not a plain name")
    return value.lower()


Scope = tuple[str, ...]
"""The CTE names visible at a point of the tree, in ASCII lower case."""

_LOCATION = ("query_location", "query_location_length")
_REF_COMMON = ("type", "alias", "sample", *_LOCATION)
_EXPR_COMMON = ("class", "type", "alias", *_LOCATION)

_COMPARISONS = frozenset({"COMPARE_EQUAL", "COMPARE_NOTEQUAL", "COMPARE_LESSTHAN", "COMPARE_GREATERTHAN",
                          "COMPARE_LESSTHANOREQUALTO", "COMPARE_GREATERTHANOREQUALTO", "COMPARE_DISTINCT_FROM",
                          "COMPARE_NOT_DISTINCT_FROM"})
_OPERATORS = frozenset({"OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL", "OPERATOR_COALESCE",
                        "OPERATOR_TRY", "COMPARE_IN", "COMPARE_NOT_IN", "ARRAY_EXTRACT", "ARRAY_SLICE",
                        "STRUCT_EXTRACT", "ARRAY_CONSTRUCT", "OPERATOR_UNPACK"})
_SUBQUERY_KINDS = frozenset({"SCALAR", "EXISTS", "NOT_EXISTS", "ANY"})
_JOIN_TYPES = frozenset({"INNER", "LEFT", "RIGHT", "OUTER", "SEMI", "ANTI"})
_JOIN_REFS = frozenset({"REGULAR", "CROSS", "NATURAL", "ASOF", "POSITIONAL", "DEPENDENT"})
_ORDER_TYPES = frozenset({"ORDER_DEFAULT", "ASCENDING", "DESCENDING"})
_SET_OPERATIONS = frozenset({"UNION", "EXCEPT", "INTERSECT", "UNION_BY_NAME"})


class _Walk:
    """One walk of a parse tree; collects base tables and parameters, raises SqlShapeError on anything else."""

    def __init__(self) -> None:
        self.tables: list[str] = []
        self.references: list[str] = []
        """Every base-table reference, once per place it stands."""
        self.in_cte: set[str] = set()
        """Base tables referenced inside a CTE body (which the engine may inline more than once)."""
        self._cte_depth = 0
        self.parameters: set[str] = set()

    # --- statements and query nodes -----------------------------------------------------------

    def statement(self, node: Any, scope: Scope) -> None:
        """A SELECT statement: ``{"node", "named_param_map"}`` (also a subquery's body)."""
        node = _keys(node, ("node", "named_param_map"), "a statement")
        self.query(node["node"], scope)

    def query(self, node: Any, scope: Scope) -> None:
        kind = node.get("type") if isinstance(node, dict) else None
        if kind == "SELECT_NODE":
            self._select(node, scope)
        elif kind == "SET_OPERATION_NODE":
            node = _keys(node, ("type", "modifiers", "cte_map", "setop_type", "setop_all", "left", "right",
                                "children"), "a set operation")
            if node.get("setop_type") not in _SET_OPERATIONS:
                raise SqlShapeError(f"the set operation {node.get('setop_type')!r} is not one the gateway knows")
            inner = self._ctes(node.get("cte_map"), scope)
            arms = list(node.get("children") or []) + [a for a in (node.get("left"), node.get("right")) if a]
            if not arms:
                raise SqlShapeError("a set operation without arms")
            for arm in arms:
                self.query(arm, inner)
            self._modifiers(node.get("modifiers"), inner)
        elif kind == "RECURSIVE_CTE_NODE":
            raise SqlShapeError("a recursive query node stands outside WITH RECURSIVE")
        else:
            raise SqlShapeError(f"the query node {kind!r} is not one the gateway knows")

    def _select(self, node: dict[str, Any], scope: Scope) -> None:
        node = _keys(node, ("type", "modifiers", "cte_map", "select_list", "from_table", "where_clause",
                            "group_expressions", "group_sets", "aggregate_handling", "having", "sample",
                            "qualify"), "a SELECT")
        _empty(node, ("sample",), "SAMPLE")
        if node.get("aggregate_handling") not in ("STANDARD_HANDLING", "FORCE_AGGREGATES"):
            raise SqlShapeError(f"aggregate handling {node.get('aggregate_handling')!r} is not one the gateway knows")
        inner = self._ctes(node.get("cte_map"), scope)
        self.relation(node.get("from_table"), inner)
        self.expressions(node.get("select_list"), inner)
        for key in ("where_clause", "having", "qualify"):
            self.optional(node.get(key), inner)
        self.expressions(node.get("group_expressions"), inner)
        for group in node.get("group_sets") or []:  # lists of positions into group_expressions
            if not isinstance(group, list) or not all(isinstance(i, int) for i in group):
                raise SqlShapeError("a grouping set the gateway does not know")
        self._modifiers(node.get("modifiers"), inner)

    def _ctes(self, cte_map: Any, scope: Scope) -> Scope:
        """Check each CTE of a WITH in order; the scope its query's body sees."""
        if cte_map is None:
            return scope
        cte_map = _keys(cte_map, ("map",), "a WITH")
        for entry in cte_map.get("map") or []:
            entry = _keys(entry, ("key", "value"), "a CTE")
            name = entry["key"]
            if not isinstance(name, str) or not CTE_NAME.fullmatch(name):
                raise SqlShapeError(f"the CTE name {name!r} is not a plain identifier")
            value = _keys(entry["value"], ("aliases", "query_node", "materialized", "key_targets",
                                           "payload_aggregates"), f"the CTE {name!r}")
            _empty(value, ("key_targets", "payload_aggregates"), f"the CTE {name!r} USING KEY")
            _strings(value.get("aliases"), f"the CTE {name!r}'s column names")
            body = value.get("query_node")
            self._cte_depth += 1
            if isinstance(body, dict) and body.get("type") == "RECURSIVE_CTE_NODE":
                self._recursive(body, name, scope)
            else:
                self.query(body, scope)  # a non-recursive CTE does not see itself
            self._cte_depth -= 1
            scope = (*scope, name.lower())
        return scope

    def _recursive(self, node: dict[str, Any], name: str, scope: Scope) -> None:
        node = _keys(node, ("type", "modifiers", "cte_map", "cte_name", "union_all", "left", "right", "aliases",
                            "key_targets"), f"the recursive CTE {name!r}")
        _empty(node, ("key_targets",), f"the recursive CTE {name!r} USING KEY")
        if not isinstance(node.get("cte_name"), str) or node["cte_name"].lower() != name.lower():
            raise SqlShapeError(f"the recursive CTE {name!r} names another CTE")
        _strings(node.get("aliases"), f"the CTE {name!r}'s column names")
        inner = self._ctes(node.get("cte_map"), scope)
        self.query(node.get("left"), inner)
        self.query(node.get("right"), (*inner, name.lower()))
        self._modifiers(node.get("modifiers"), inner)

    def _modifiers(self, modifiers: Any, scope: Scope) -> None:
        for modifier in modifiers or []:
            kind = modifier.get("type") if isinstance(modifier, dict) else None
            if kind == "ORDER_MODIFIER":
                self.orders(_keys(modifier, ("type", "orders"), "ORDER BY").get("orders"), scope)
            elif kind in ("LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER"):
                modifier = _keys(modifier, ("type", "limit", "offset", "limit_type"), "LIMIT")
                self.optional(modifier.get("limit"), scope)
                self.optional(modifier.get("offset"), scope)
            elif kind == "DISTINCT_MODIFIER":
                self.expressions(_keys(modifier, ("type", "distinct_on_targets"), "DISTINCT")
                                 .get("distinct_on_targets"), scope)
            else:
                raise SqlShapeError(f"the result modifier {kind!r} is not one the gateway knows")

    def orders(self, orders: Any, scope: Scope) -> None:
        for order in orders or []:
            order = _keys(order, ("type", "null_order", "expression"), "an ORDER BY term")
            if order.get("type") not in _ORDER_TYPES:
                raise SqlShapeError(f"the order {order.get('type')!r} is not one the gateway knows")
            self.expression(order.get("expression"), scope)

    # --- relations (FROM) ---------------------------------------------------------------------

    def relation(self, node: Any, scope: Scope) -> None:
        kind = node.get("type") if isinstance(node, dict) else None
        if kind == "EMPTY":
            _keys(node, _REF_COMMON, "an empty FROM")
        elif kind == "BASE_TABLE":
            self._base_table(node, scope)
        elif kind == "JOIN":
            node = _keys(node, (*_REF_COMMON, "left", "right", "condition", "join_type", "ref_type",
                                "using_columns", "delim_flipped", "duplicate_eliminated_columns", "is_implicit",
                                "ranking_expression", "nearest_count", "nearest_order_type", "nearest_approx"),
                         "a JOIN")
            _empty(node, ("sample", "delim_flipped", "duplicate_eliminated_columns", "ranking_expression",
                          "nearest_approx"), "a JOIN")
            if node.get("join_type") not in _JOIN_TYPES or node.get("ref_type") not in _JOIN_REFS:
                raise SqlShapeError(f"the join {node.get('join_type')!r}/{node.get('ref_type')!r} is not one "
                                    f"the gateway knows")
            _strings(node.get("using_columns"), "USING columns")
            self.relation(node.get("left"), scope)
            self.relation(node.get("right"), scope)
            self.optional(node.get("condition"), scope)
        elif kind == "SUBQUERY":
            node = _keys(node, (*_REF_COMMON, "subquery", "column_name_alias"), "a subquery")
            _empty(node, ("sample",), "SAMPLE")
            _strings(node.get("column_name_alias"), "column aliases")
            self.statement(node.get("subquery"), scope)
        elif kind == "TABLE_FUNCTION":
            node = _keys(node, (*_REF_COMMON, "function", "column_name_alias", "with_ordinality"),
                         "a table function")
            _empty(node, ("sample",), "SAMPLE")
            _strings(node.get("column_name_alias"), "column aliases")
            self.function(node.get("function"), scope, TABLE_FUNCTIONS, "the table function")
        elif kind == "EXPRESSION_LIST":
            node = _keys(node, (*_REF_COMMON, "values", "expected_names", "expected_types"), "VALUES")
            _empty(node, ("sample", "expected_types"), "VALUES")
            _strings(node.get("expected_names"), "VALUES column names")
            for row in node.get("values") or []:
                self.expressions(row, scope)
        else:
            raise SqlShapeError(f"the relation {kind!r} is not one the gateway knows")

    def _base_table(self, node: dict[str, Any], scope: Scope) -> None:
        node = _keys(node, (*_REF_COMMON, "schema_name", "table_name", "column_name_alias", "catalog_name",
                            "at_clause", "qualified_name"), "a table")
        name, schema, catalog = node.get("table_name"), node.get("schema_name"), node.get("catalog_name")
        _strings(node.get("column_name_alias"), "column aliases")
        if schema or catalog:
            shown = ".".join(str(p) for p in (catalog, schema, name) if p)
            raise SqlShapeError(f"names a namespace ({shown}); name tables bare")
        if not isinstance(name, str):
            raise SqlShapeError("a table without a name")
        qualified = _keys(node.get("qualified_name") or {"path": [name]}, ("path",), "a table name")
        if qualified.get("path") != [name]:
            raise SqlShapeError(f"names a namespace ({'.'.join(map(str, qualified.get('path') or []))}); "
                                f"name tables bare")
        _empty(node, ("sample",), "SAMPLE")
        _empty(node, ("at_clause",), "time travel")
        if CTE_NAME.fullmatch(name) and name.lower() in scope:
            return
        if not TABLE_NAME.fullmatch(name):
            raise SqlShapeError(f"reads {name!r}, outside [a-z_][a-z0-9_]*")
        if name not in self.tables:
            self.tables.append(name)
        self.references.append(name)
        if self._cte_depth:
            self.in_cte.add(name)

    # --- expressions --------------------------------------------------------------------------

    def expressions(self, nodes: Any, scope: Scope) -> None:
        if not isinstance(nodes, list):
            raise SqlShapeError("the parse tree holds a non-list where a list of expressions belongs")
        for node in nodes:
            self.expression(node, scope)

    def optional(self, node: Any, scope: Scope) -> None:
        if node is not None:
            self.expression(node, scope)

    def expression(self, node: Any, scope: Scope) -> None:
        cls = node.get("class") if isinstance(node, dict) else None
        kind = node.get("type") if isinstance(node, dict) else None
        if cls == "COLUMN_REF":
            node = _keys(node, (*_EXPR_COMMON, "column_names"), "a column")
            names = _strings(node.get("column_names"), "a column name")
            if not names:
                raise SqlShapeError("a column without a name")
            if len(names) == 1 and names[0].lower() in SQL_VALUE_FUNCTIONS - SQL_VALUE_COLUMNS:
                raise SqlShapeError(f"the bare name {names[0]!r} reads a fact of the engine; qualify a column "
                                    f"so named (t.{names[0]})")
        elif cls == "CONSTANT":
            _literal(_keys(node, (*_EXPR_COMMON, "literal", "value"), "a constant").get("literal"))
        elif cls == "PARAMETER":
            node = _keys(node, (*_EXPR_COMMON, "identifier"), "a parameter")
            identifier = node.get("identifier")
            if not isinstance(identifier, str) or not identifier:
                raise SqlShapeError("a parameter without a name")
            self.parameters.add(identifier)
        elif cls == "FUNCTION":
            self.function(node, scope, FUNCTIONS, "the function")
        elif cls == "WINDOW":
            self._window(node, scope)
        elif cls == "CASE":
            node = _keys(node, (*_EXPR_COMMON, "case_checks", "else_expr"), "CASE")
            for check in node.get("case_checks") or []:
                check = _keys(check, ("when_expr", "then_expr"), "CASE WHEN")
                self.expression(check.get("when_expr"), scope)
                self.expression(check.get("then_expr"), scope)
            self.optional(node.get("else_expr"), scope)
        elif cls == "CAST":
            node = _keys(node, (*_EXPR_COMMON, "child", "type_expr", "try_cast"), "a cast")
            self.expression(node.get("child"), scope)
            self._type(node.get("type_expr"), scope)
        elif cls == "COMPARISON":
            if kind not in _COMPARISONS:
                raise SqlShapeError(f"the comparison {kind!r} is not one the gateway knows")
            node = _keys(node, (*_EXPR_COMMON, "left", "right"), "a comparison")
            self.expression(node.get("left"), scope)
            self.expression(node.get("right"), scope)
        elif cls == "CONJUNCTION":
            if kind not in ("CONJUNCTION_AND", "CONJUNCTION_OR"):
                raise SqlShapeError(f"the conjunction {kind!r} is not one the gateway knows")
            self.expressions(_keys(node, (*_EXPR_COMMON, "children"), "AND/OR").get("children"), scope)
        elif cls == "OPERATOR":
            if kind not in _OPERATORS:
                raise SqlShapeError(f"the operator {kind!r} is not one the gateway knows")
            self.expressions(_keys(node, (*_EXPR_COMMON, "children"), "an operator").get("children"), scope)
        elif cls == "BETWEEN":
            node = _keys(node, (*_EXPR_COMMON, "input", "lower", "upper"), "BETWEEN")
            for key in ("input", "lower", "upper"):
                self.expression(node.get(key), scope)
        elif cls == "SUBQUERY":
            node = _keys(node, (*_EXPR_COMMON, "subquery", "subquery_type", "child", "comparison_type"),
                         "a subquery")
            if node.get("subquery_type") not in _SUBQUERY_KINDS:
                raise SqlShapeError(f"the subquery {node.get('subquery_type')!r} is not one the gateway knows")
            self.statement(node.get("subquery"), scope)
            self.optional(node.get("child"), scope)
        elif cls == "STAR":
            self._star(node, scope)
        elif cls == "LAMBDA":
            node = _keys(node, (*_EXPR_COMMON, "lhs", "expr", "syntax_type"), "a lambda")
            self.expression(node.get("lhs"), scope)
            self.expression(node.get("expr"), scope)
        elif cls == "COLLATE":
            node = _keys(node, (*_EXPR_COMMON, "child", "collation"), "COLLATE")
            _name(node.get("collation"), "the collation")
            self.expression(node.get("child"), scope)
        elif cls == "POSITIONAL_REFERENCE":
            if not isinstance(_keys(node, (*_EXPR_COMMON, "index"), "a positional reference").get("index"), int):
                raise SqlShapeError("a positional reference without a position")
        else:
            raise SqlShapeError(f"the expression {cls or kind!r} is not one the gateway knows")

    def function(self, node: Any, scope: Scope, allowed: frozenset[str], what: str) -> None:
        node = _keys(node, (*_EXPR_COMMON, "function_name", "schema", "catalog", "arguments", "children",
                            "filter", "order_bys", "distinct", "is_operator", "export_state",
                            "is_legacy_function_call", "qualified_name"), what)
        self._callee(node, allowed, what)
        if node.get("type") != "FUNCTION":
            raise SqlShapeError(f"{what} node {node.get('type')!r} is not one the gateway knows")
        _empty(node, ("export_state",), "EXPORT_STATE")
        self._arguments(node.get("arguments"), scope)
        self.expressions(node.get("children") or [], scope)
        self.optional(node.get("filter"), scope)
        order_bys = node.get("order_bys")
        if order_bys is not None:
            self._modifiers([order_bys], scope)

    def _window(self, node: dict[str, Any], scope: Scope) -> None:
        node = _keys(node, (*_EXPR_COMMON, "function_name", "schema", "catalog", "arguments", "children",
                            "partitions", "orders", "start", "end", "start_expr", "end_expr", "offset_expr",
                            "default_expr", "filter_expr", "arg_orders", "exclude_clause", "ignore_nulls",
                            "has_ignore_nulls", "distinct", "is_legacy_function_call", "qualified_name"),
                     "a window function")
        self._callee(node, AGGREGATES | WINDOW_FUNCTIONS, "the window function")
        if not str(node.get("type")).startswith("WINDOW_"):
            raise SqlShapeError(f"the window node {node.get('type')!r} is not one the gateway knows")
        self._arguments(node.get("arguments"), scope)
        self.expressions(node.get("children") or [], scope)
        self.expressions(node.get("partitions") or [], scope)
        self.orders(node.get("orders"), scope)
        self.orders(node.get("arg_orders"), scope)
        for key in ("start_expr", "end_expr", "offset_expr", "default_expr", "filter_expr"):
            self.optional(node.get(key), scope)
        for key in ("start", "end", "exclude_clause"):
            if not isinstance(node.get(key, ""), str):
                raise SqlShapeError(f"a window frame {key} the gateway does not know")

    def _callee(self, node: dict[str, Any], allowed: frozenset[str], what: str) -> None:
        name = _name(node.get("function_name"), what)
        if node.get("schema") or node.get("catalog"):
            raise SqlShapeError(f"{what} {node.get('function_name')!r} names a schema or catalog")
        qualified = _keys(node.get("qualified_name") or {"path": [node["function_name"]]}, ("path",), what)
        if qualified.get("path") != [node["function_name"]]:
            raise SqlShapeError(f"{what} {node.get('function_name')!r} names a schema or catalog")
        if name not in allowed:
            raise SqlShapeError(f"calls {name}(), which the gateway does not allow (it reads only its "
                                f"namespace's tables, with functions over values)")

    def _arguments(self, arguments: Any, scope: Scope) -> None:
        for argument in arguments or []:
            argument = _keys(argument, ("name", "expression"), "a function argument")
            if argument.get("name"):  # a named argument (name := value)
                _name(argument["name"], "the argument name")
            self.expression(argument.get("expression"), scope)

    def _star(self, node: dict[str, Any], scope: Scope) -> None:
        node = _keys(node, (*_EXPR_COMMON, "relation_name", "exclude_list", "replace_list", "columns", "expr",
                            "qualified_exclude_list", "rename_list", "unpacked"), "*")
        if not isinstance(node.get("relation_name", ""), str):
            raise SqlShapeError("a * over a relation the gateway does not know")
        _strings(node.get("exclude_list"), "EXCLUDE")
        for item in node.get("qualified_exclude_list") or []:
            _keys(item, ("column", "table", "schema", "catalog"), "EXCLUDE")
        for item in node.get("rename_list") or []:
            item = _keys(item, ("key", "value"), "RENAME")
            _keys(item.get("key"), ("column", "table", "schema", "catalog"), "RENAME")
        for item in node.get("replace_list") or []:
            self.expression(_keys(item, ("key", "value"), "REPLACE").get("value"), scope)
        self.optional(node.get("expr"), scope)

    def _type(self, node: Any, scope: Scope) -> None:
        node = _keys(node, (*_EXPR_COMMON, "type_name", "schema", "catalog", "children", "qualified_name"),
                     "a type")
        if node.get("class") != "TYPE":
            raise SqlShapeError(f"the type node {node.get('class')!r} is not one the gateway knows")
        name = node.get("type_name")
        if node.get("schema") or node.get("catalog") or not isinstance(name, str) or name.lower() not in TYPES:
            raise SqlShapeError(f"casts to the type {name!r}, which the gateway does not know")
        qualified = _keys(node.get("qualified_name") or {"path": [name]}, ("path",), "a type")
        if qualified.get("path") != [name]:
            raise SqlShapeError(f"casts to the type {name!r} of a schema or catalog")
        for child in node.get("children") or []:  # type parameters, fields, element types
            if isinstance(child, dict) and child.get("class") == "TYPE":
                self._type(child, scope)
            else:
                self.expression(child, scope)


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SqlShapeError(f"{what}: the parse tree holds something other than names")
    return value


def _literal(value: Any) -> None:
    """A constant is data: scalars, or lists and objects of them, never a parse-tree node."""
    if isinstance(value, dict):
        if "class" in value:
            raise SqlShapeError("a constant holds an expression")
        for item in value.values():
            _literal(item)
    elif isinstance(value, list):
        for item in value:
            _literal(item)
    elif value is not None and not isinstance(value, (str, int, float, bool)):
        raise SqlShapeError("a constant the gateway does not know")
