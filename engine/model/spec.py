"""The ``[[model]]`` block (``run.model.model-block``): ModelSpec with its statement source,
contract, model policy, data tests and the opt-out-record switch.

``parse_model`` collects every problem of one block into the manifest's problem list (unknown
keys refuse as ``ManifestKeyUnknown`` naming the key and the block). The tables a model reads
default to the names its SQL references that are store tables or models
(:func:`referenced_tables`: DuckDB's own parser, ``json_serialize_sql``, walked scope by scope for
base tables; :func:`resolve_table` matches them case-insensitively, as DuckDB does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import ContextfulError, ManifestValueInvalid
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import duckdb
else:
    duckdb = lazy_module("duckdb")

if TYPE_CHECKING:
    from contextful.engine.config.parse import _Problems

MODEL_KEYS = ("name", "sql", "sql_file", "inputs", "contract", "policy", "tests", "record")
CONTRACT_KEYS = ("version", "grain", "columns")
COLUMN_KEYS = ("type", "nullable")
POLICY_KEYS = ("max_lag",)
TEST_KINDS = ("not_null", "unique", "accepted_values", "relationships")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
_VERSION = re.compile(r"(\d+)\.(\d+)")
_LAG = re.compile(r"(\d+)\s*(s|m|h|d)")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class ColumnContract:
    type: str
    """Type spelling (docs/manifest.md), e.g. ``string``, ``bigint``, ``double``."""
    nullable: bool = True
    """Whether the column may hold nulls."""


@dataclass(frozen=True)
class Contract:
    version: str
    """``major.minor``: a minor bump admits only what an old reader still reads."""
    grain: tuple[str, ...]
    """Columns whose values identify one row (unique in every build)."""
    columns: dict[str, ColumnContract]
    """Every published column, in order."""

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def minor(self) -> int:
        return int(self.version.split(".")[1])

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "grain": list(self.grain),
                "columns": {c: {"type": v.type, "nullable": v.nullable} for c, v in self.columns.items()}}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Contract:
        return cls(doc["version"], tuple(doc["grain"]),
                   {c: ColumnContract(v["type"], v["nullable"]) for c, v in doc["columns"].items()})


@dataclass(frozen=True)
class ModelPolicy:
    max_lag_seconds: float | None = None
    """How far behind its inputs a published build may fall (``max_lag = "1h"``)."""


@dataclass(frozen=True)
class ModelTest:
    kind: str
    """``not_null``, ``unique``, ``accepted_values`` or ``relationships``."""
    columns: tuple[str, ...]
    """The column(s) tested."""
    values: tuple[Any, ...] = ()
    """accepted_values: the values allowed."""
    to: str | None = None
    """relationships: the table or model every value must appear in."""
    field: str | None = None
    """relationships: the column of ``to`` holding the values."""

    def describe(self) -> str:
        return f"{self.kind}({', '.join(self.columns)})"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    """The model's store table (a letter, then letters, digits or '_')."""
    sql: str
    """The statement (inline ``sql`` or read from ``sql_file``)."""
    sql_file: str | None = None
    """Where the statement came from, relative to the project (None when inline)."""
    inputs: tuple[str, ...] | None = None
    """Declared inputs; None means the store tables and models the SQL names."""
    referenced: tuple[str, ...] = ()
    """Every base-table name the SQL references, as spelled (references a CTE answers excluded)."""
    contract: Contract | None = None
    """Columns, types, nullability, grain and version every build must satisfy."""
    policy: ModelPolicy = field(default_factory=ModelPolicy)
    """Model policy (``max_lag``)."""
    tests: tuple[ModelTest, ...] = ()
    """Data tests run over the staged result before it publishes."""
    record: bool = True
    """Whether a build writes a ``_runs`` record (``record = false`` opts out)."""

    def input_names(self, known: set[str]) -> tuple[str, ...]:
        """The tables this model reads: declared, else referenced ones in ``known``; plus the
        targets of its relationships tests. Each name is resolved against ``known`` as DuckDB
        resolves identifiers (:func:`resolve_table`); a declared one ``known`` lacks stays as is."""
        if self.inputs is not None:
            base = tuple(n for name in self.inputs for n in resolve_table(name, known) or (name,))
        else:
            base = tuple(n for name in self.referenced for n in resolve_table(name, known))
        extra = tuple(n for t in self.tests if t.to is not None for n in resolve_table(t.to, known) or (t.to,))
        return tuple(dict.fromkeys(base + extra))


def referenced_tables(sql: str) -> tuple[str, ...] | str:
    """Base-table names ``sql`` references, in order of appearance; a parser message when it does
    not parse. A reference a CTE in scope answers is not a base table, so it is left out."""
    con = duckdb.connect()
    try:
        doc = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])  # type: ignore[index]
    finally:
        con.close()
    if doc.get("error"):
        return str(doc.get("error_message", "does not parse"))
    found: list[str] = []
    _walk(doc.get("statements", []), frozenset(), found)
    return tuple(dict.fromkeys(found))


_STORE_SCHEMAS = {("", "main"), ("", "memory"), ("memory", "main")}
"""The qualifications under which a name is one of a build's views (its connection's default
catalog and schema); ``information_schema.tables`` and the like are DuckDB's own."""


def _walk(node: Any, ctes: frozenset[str], found: list[str]) -> None:
    """Append to ``found`` the base tables ``node`` (DuckDB's serialized syntax tree) references,
    where ``ctes`` (lower-cased) are the CTE names in scope. DuckDB's scoping: a WITH's names are
    visible in its query and the queries nested in it; each CTE sees the CTEs declared before it,
    and itself only in a recursive CTE's recursive arm; a qualified name is never a CTE, and a
    store table only in the default schema; names compare case-insensitively, quoted or not."""
    if isinstance(node, list):
        for value in node:  # bounded by the size of one statement's syntax tree
            _walk(value, ctes, found)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "BASE_TABLE" and node.get("table_name"):
        name = node["table_name"]
        where = ((node.get("catalog_name") or "").lower(), (node.get("schema_name") or "").lower())
        if (where == ("", "") and name.lower() not in ctes) or where in _STORE_SCHEMAS:
            found.append(name)
    cte_map = node.get("cte_map")
    for entry in cte_map.get("map", []) if isinstance(cte_map, dict) else []:
        _walk(entry.get("value"), ctes, found)
        ctes = ctes | {entry["key"].lower()}
    recursive = node["cte_name"].lower() if node.get("type") == "RECURSIVE_CTE_NODE" and node.get("cte_name") else None
    for key, value in node.items():
        if key != "cte_map":  # only a recursive CTE's recursive arm sees the CTE itself
            _walk(value, ctes | {recursive} if recursive and key == "right" else ctes, found)


def resolve_table(name: str, known: set[str]) -> tuple[str, ...]:
    """The tables of ``known`` a reference to ``name`` means: ``name`` itself when known, else every
    known name equal to it but for case (DuckDB's identifiers are case-insensitive, quoted or not).
    More than one is ambiguous: :func:`case_clash` finds it and the build refuses."""
    if name in known:
        return (name,)
    return tuple(sorted(k for k in known if k.lower() == name.lower()))


def case_clash(names: tuple[str, ...]) -> tuple[str, ...]:
    """The first group of ``names`` that differ only in case (empty when none do): one DuckDB
    connection cannot hold a view for each."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.lower(), []).append(name)
    return next((tuple(group) for group in groups.values() if len(group) > 1), ())


def parse_model(block: Any, n: int, root: Path, problems: _Problems,
                inlined: Mapping[str, str] | None = None) -> ModelSpec | None:
    """One ``[[model]]`` block; ``inlined`` (an applied version's ``[snapshot.models]``) holds the
    text each ``sql_file`` had when the version was claimed, read in place of the file."""
    opened = problems.open_block("model", n, block, "name", MODEL_KEYS, _NAME,
                                 "a table name (a letter, then letters, digits or '_')")
    if opened is None:
        return None
    where, name = opened
    sql = _statement(block, where, root, problems, (inlined or {}).get(name or ""))
    referenced: tuple[str, ...] = ()
    if sql is not None:
        parsed = referenced_tables(sql)
        if isinstance(parsed, str):
            problems.add(ManifestValueInvalid(where, "sql", f"does not parse: {parsed}"))
            sql = None
        else:
            referenced = parsed
    inputs = problems.strings(where, block, "inputs") if "inputs" in block else None
    contract = _contract(block.get("contract"), where, problems) if "contract" in block else None
    policy = _policy(block.get("policy", {}), where, problems)
    tests = _tests(block.get("tests", []), where, problems)
    record = block.get("record", True)
    if not isinstance(record, bool):
        problems.add(ManifestValueInvalid(where, "record", f"must be true or false, not {record!r}"))
        record = True
    if name is None or sql is None:
        return None
    return ModelSpec(name=name, sql=sql, sql_file=block.get("sql_file"), inputs=inputs, referenced=referenced,
                     contract=contract, policy=policy, tests=tests, record=record)


def _statement(block: dict[str, Any], where: str, root: Path, problems: _Problems,
               inlined: str | None) -> str | None:
    """The statement source: exactly one of ``sql`` and ``sql_file`` (whose text is ``inlined``
    when an applied version holds it)."""
    if ("sql" in block) == ("sql_file" in block):
        problems.add(ManifestValueInvalid(where, "sql", "declare exactly one of sql and sql_file"))
        return None
    if "sql" in block:
        return problems.string(where, block, "sql")
    path = problems.string(where, block, "sql_file")
    if path is None:
        return None
    if inlined is not None:
        return inlined
    file = root / path
    if not file.is_file():
        problems.add(ManifestValueInvalid(where, "sql_file", f"no file at {file}"))
        return None
    return file.read_text(encoding="utf-8")


def _contract(block: Any, where: str, problems: _Problems) -> Contract | None:
    here = f"{where} contract"
    if not isinstance(block, dict):
        problems.add(ManifestValueInvalid(where, "contract", "must be a table"))
        return None
    problems.unknown_keys(here, block, CONTRACT_KEYS)
    version = problems.string(here, block, "version", required=True)
    if version is not None and not _VERSION.fullmatch(version):
        problems.add(ManifestValueInvalid(here, "version", f"{version!r} is not 'major.minor'"))
        version = None
    grain = problems.strings(here, block, "grain")
    raw = block.get("columns", {})
    if not isinstance(raw, dict) or not raw:
        problems.add(ManifestValueInvalid(here, "columns", "must map each column to {type, nullable}"))
        raw = {}
    columns: dict[str, ColumnContract] = {}
    from contextful.engine.land.typed import parse_type

    for column, spec in raw.items():
        at = f"{here}.columns.{column}"
        if not isinstance(spec, dict):
            problems.add(ManifestValueInvalid(here, f"columns.{column}", "must be a table {type, nullable}"))
            continue
        problems.unknown_keys(at, spec, COLUMN_KEYS)
        spelling = problems.string(at, spec, "type", required=True)
        nullable = spec.get("nullable", True)
        if not isinstance(nullable, bool):
            problems.add(ManifestValueInvalid(at, "nullable", f"must be true or false, not {nullable!r}"))
            nullable = True
        if spelling is None:
            continue
        try:
            parse_type(spelling, column)
        except ContextfulError as exc:
            problems.add(exc)
            continue
        columns[column] = ColumnContract(spelling, nullable)
    for column in grain:
        if raw and column not in raw:
            problems.add(ManifestValueInvalid(here, "grain", f"{column!r} is not a contract column"))
    if version is None:
        return None
    return Contract(version, grain, columns)


def _policy(block: Any, where: str, problems: _Problems) -> ModelPolicy:
    here = f"{where} policy"
    if not isinstance(block, dict):
        problems.add(ManifestValueInvalid(where, "policy", "must be a table"))
        return ModelPolicy()
    problems.unknown_keys(here, block, POLICY_KEYS)
    lag = None
    if "max_lag" in block:
        match = _LAG.fullmatch(str(block["max_lag"]).strip())
        if match is None:
            problems.add(ManifestValueInvalid(here, "max_lag", f"{block['max_lag']!r} is not '<n><s|m|h|d>'"))
        else:
            lag = float(int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    return ModelPolicy(lag)


def _tests(block: Any, where: str, problems: _Problems) -> tuple[ModelTest, ...]:
    if not isinstance(block, list):
        problems.add(ManifestValueInvalid(where, "tests", "must be a list of {<kind> = …} tables"))
        return ()
    tests = []
    for i, entry in enumerate(block, 1):
        here = f"{where} tests #{i}"
        if not isinstance(entry, dict) or len(entry) != 1:
            problems.add(ManifestValueInvalid(here, "test", f"must be one of {', '.join(TEST_KINDS)} = …"))
            continue
        problems.unknown_keys(here, entry, TEST_KINDS)
        (kind, arg), = entry.items()
        if kind in ("not_null", "unique"):
            cols = [arg] if isinstance(arg, str) else arg
            if not isinstance(cols, list) or not cols or not all(isinstance(c, str) for c in cols):
                problems.add(ManifestValueInvalid(here, kind, "names a column or a list of columns"))
                continue
            tests.append(ModelTest(kind, tuple(cols)))
        elif kind == "accepted_values":
            if not isinstance(arg, dict) or set(arg) != {"column", "values"} or not isinstance(arg["values"], list):
                problems.add(ManifestValueInvalid(here, kind, "takes {column = …, values = [...]}"))
                continue
            tests.append(ModelTest(kind, (arg["column"],), values=tuple(arg["values"])))
        elif kind == "relationships":
            if not isinstance(arg, dict) or set(arg) != {"column", "to", "field"}:
                problems.add(ManifestValueInvalid(here, kind, "takes {column = …, to = …, field = …}"))
                continue
            tests.append(ModelTest(kind, (arg["column"],), to=arg["to"], field=arg["field"]))
    return tuple(tests)
