"""The ``[[export]]`` block (kind ``iceberg``): ExportSpec with its source, catalog, namespace, table,
admitted credential, format version, snapshot retention, and what its gateway entry serves — declared query templates
and whether caller SQL is allowed (decision "iceberg-audience", docs/exports.md).

``parse_export`` collects every problem of one block into the manifest's problem list; unknown keys
refuse as ``ManifestKeyUnknown`` naming the key and the block. Which exports may share what is the
preflight's business (``engine.export.preflight``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.export.sql_shape import SqlShapeError, read_shape
from contextful.storage.errors import ManifestValueInvalid

if TYPE_CHECKING:
    from contextful.engine.config.parse import _Problems

EXPORT_KEYS = ("name", "kind", "source", "catalog", "namespace", "table", "credential", "format_version",
               "templates", "caller_sql", "max_answer_bytes", "keep_snapshots",
               "max_snapshot_age")
EXPORT_KINDS = ("iceberg",)
CATALOG_TYPES = ("sql", "rest")
FORMAT_VERSIONS = (1, 2)
DEFAULT_CATALOG_NAME = "contextful"
DEFAULT_MAX_ANSWER_BYTES = 64 << 20
"""The most bytes a gateway answer carries unless an export declares ``max_answer_bytes``."""
DEFAULT_CATALOG_DB = Path(".contextful") / "iceberg" / "catalog.sqlite"
DEFAULT_WAREHOUSE = Path(".contextful") / "iceberg" / "warehouse"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
_ICEBERG_NAME = re.compile(r"[a-z_][a-z0-9_]{0,127}")
DEFAULT_KEEP_SNAPSHOTS = 10
_AGE = re.compile(r"([1-9][0-9]{0,8})([smhd])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass(frozen=True)
class CatalogSpec:
    name: str
    """The catalog's name (default ``contextful``); a SQL catalog keeps each name's tables apart."""
    type: str
    """``sql`` (SQLite or PostgreSQL through SQLAlchemy) or ``rest``."""
    uri: str
    """The catalog's URI: a SQLAlchemy URL for ``sql``, the REST endpoint for ``rest``."""
    warehouse: str | None = None
    """Where table files go (a ``file://`` URI by default for ``sql``; None leaves it to a REST server)."""
    properties: dict[str, str] = field(default_factory=dict)
    """Any other key of the block, passed through to pyiceberg as a catalog property."""

    @property
    def key(self) -> tuple[str, str, str, str | None]:
        """What identifies the catalog when comparing exports."""
        return (self.name, self.type, self.uri, self.warehouse)

    @property
    def warehouse_key(self) -> tuple[str, ...]:
        """What one catalog token reads whole: a SQL catalog's database (every catalog name in it),
        or a REST endpoint's warehouse."""
        if self.type == "sql":
            return ("sql", self.uri)
        return ("rest", self.uri, self.warehouse or "")

    def pyiceberg_properties(self) -> dict[str, str]:
        """The properties ``pyiceberg.catalog.load_catalog`` takes."""
        props = {**self.properties, "type": self.type, "uri": self.uri}
        if self.warehouse is not None:
            props["warehouse"] = self.warehouse
        return props


@dataclass(frozen=True)
class Template:
    """A declared query of a gateway entry: one SELECT over tables of the entry's namespace."""

    name: str
    sql: str
    """The checked statement as the engine runs it: DuckDB's rendering of its parse tree."""
    parameters: tuple[str, ...]
    """Its ``$name`` parameters, sorted; a request binds exactly these."""
    tables: tuple[str, ...]
    """The tables it reads (bare names in the entry's namespace)."""
    rescanned: frozenset[str] = frozenset()
    """The tables the engine may scan more than once (see ``SqlShape.rescanned``)."""


@dataclass(frozen=True)
class ExportSpec:
    name: str
    """The export's name (a letter, then letters, digits or '_'); names its state file."""
    source: str
    """A store table (exported at its head) or a model (exported at its latest published build)."""
    catalog: CatalogSpec
    """The Iceberg catalog the export commits through."""
    namespace: str
    """The Iceberg namespace: the one the credential's readers see."""
    table: str
    """The Iceberg table name (default: the export's name)."""
    credential: str
    """The admitted credential (audience key) this export publishes for."""
    format_version: int = 2
    """The Iceberg format version a new table is created at: 1 or 2."""
    kind: str = "iceberg"
    """The export kind; only ``iceberg``."""
    templates: dict[str, Template] = field(default_factory=dict)
    """The gateway entry's declared queries, by name."""
    caller_sql: bool = False
    """Whether the gateway runs readers' own SQL for this entry (only on a single-audience warehouse)."""
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    """The most bytes a gateway answer for this entry carries; a request's ``max_bytes`` may only lower it."""
    keep_snapshots: int = DEFAULT_KEEP_SNAPSHOTS
    """At most this many Iceberg snapshots stay after each export (the newest); older ones expire."""
    max_snapshot_age: timedelta | None = None
    """Snapshots older than this expire too (``"7d"``, ``"12h"``); never the current one."""

    @property
    def identifier(self) -> str:
        """``namespace.table`` as pyiceberg names it."""
        return f"{self.namespace}.{self.table}"


def parse_export(block: Any, n: int, root: Path, problems: _Problems) -> ExportSpec | None:
    opened = problems.open_block("export", n, block, "name", EXPORT_KEYS, _NAME,
                                 "a name (a letter, then letters, digits or '_')")
    if opened is None:
        return None
    where, name = opened
    kind = problems.string(where, block, "kind", "iceberg") or "iceberg"
    if kind not in EXPORT_KINDS:
        problems.add(ManifestValueInvalid(where, "kind", f"{kind!r} is not one of {', '.join(EXPORT_KINDS)}"))
    source = problems.string(where, block, "source", required=True)
    namespace = problems.string(where, block, "namespace", required=True)
    table = problems.string(where, block, "table", name)
    for key, value in (("namespace", namespace), ("table", table)):
        if value is not None and not _ICEBERG_NAME.fullmatch(value):
            problems.add(ManifestValueInvalid(where, key, f"{value!r} is not an Iceberg name ([a-z_][a-z0-9_]*)"))
    credential = problems.string(where, block, "credential", required=True)
    version = block.get("format_version", 2)
    if version not in FORMAT_VERSIONS or isinstance(version, bool):
        problems.add(ManifestValueInvalid(where, "format_version", f"must be 1 or 2, not {version!r}"))
        version = 2
    catalog = _catalog(block.get("catalog", {}), where, root, problems)
    templates = _templates(block.get("templates", {}), where, problems)
    caller_sql = block.get("caller_sql", False)
    if not isinstance(caller_sql, bool):
        problems.add(ManifestValueInvalid(where, "caller_sql", f"must be true or false, not {caller_sql!r}"))
        caller_sql = False
    max_answer_bytes = block.get("max_answer_bytes", DEFAULT_MAX_ANSWER_BYTES)
    if isinstance(max_answer_bytes, bool) or not isinstance(max_answer_bytes, int) or max_answer_bytes < 1:
        problems.add(ManifestValueInvalid(where, "max_answer_bytes", f"must be a positive byte count, not "
                                                                     f"{max_answer_bytes!r}"))
        max_answer_bytes = DEFAULT_MAX_ANSWER_BYTES
    keep = block.get("keep_snapshots", DEFAULT_KEEP_SNAPSHOTS)
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        problems.add(ManifestValueInvalid(where, "keep_snapshots", f"must be a whole number of at least 1, not {keep!r}"))
        keep = DEFAULT_KEEP_SNAPSHOTS
    max_age = _age(block.get("max_snapshot_age"), where, problems)
    if None in (name, source, namespace, table, credential, catalog):
        return None
    assert name and source and namespace and table and credential and catalog
    return ExportSpec(name=name, source=source, catalog=catalog, namespace=namespace, table=table,
                      credential=credential, format_version=version, kind=kind, templates=templates,
                      caller_sql=caller_sql, max_answer_bytes=max_answer_bytes,
                      keep_snapshots=keep, max_snapshot_age=max_age)


def _age(value: Any, where: str, problems: _Problems) -> timedelta | None:
    """``max_snapshot_age = "7d"``: a whole number of seconds, minutes, hours or days (s, m, h, d)."""
    if value is None:
        return None
    found = _AGE.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        problems.add(ManifestValueInvalid(where, "max_snapshot_age",
                                          f"must be a duration like \"7d\" (s, m, h or d), not {value!r}"))
        return None
    return timedelta(**{_AGE_UNITS[found.group(2)]: int(found.group(1))})


def _templates(block: Any, where: str, problems: _Problems) -> dict[str, Template]:
    """``[export.templates]``: name = one SELECT with ``$name`` parameters over bare table names."""
    if not isinstance(block, dict):
        problems.add(ManifestValueInvalid(where, "templates", "must be a table of name = \"SELECT ...\""))
        return {}
    found: dict[str, Template] = {}
    for name, sql in block.items():
        key = f"templates.{name}"
        if not _NAME.fullmatch(name):
            problems.add(ManifestValueInvalid(where, key, "a template name is a letter, then letters, digits or '_'"))
            continue
        if not isinstance(sql, str) or not sql.strip():
            problems.add(ManifestValueInvalid(where, key, f"must be a SELECT statement, not {sql!r}"))
            continue
        try:
            shape = read_shape(sql)
        except SqlShapeError as exc:
            problems.add(ManifestValueInvalid(where, key, exc.reason))
            continue
        if shape.positional:
            problems.add(ManifestValueInvalid(where, key, "has positional parameters; name them ($since)"))
            continue
        found[name] = Template(name, shape.sql, tuple(sorted(shape.parameters)), shape.tables, shape.rescanned)
    return found


def _catalog(block: Any, where: str, root: Path, problems: _Problems) -> CatalogSpec | None:
    """``catalog = { type = "sql" | "rest", name, uri, warehouse, <pyiceberg properties> }``."""
    where = f"{where} catalog"
    if not isinstance(block, dict):
        problems.add(ManifestValueInvalid(where, "catalog", "must be a table with a type"))
        return None
    kind = problems.string(where, block, "type", "sql") or "sql"
    if kind not in CATALOG_TYPES:
        problems.add(ManifestValueInvalid(where, "type", f"{kind!r} is not one of {', '.join(CATALOG_TYPES)}"))
        return None
    name = problems.string(where, block, "name", DEFAULT_CATALOG_NAME) or DEFAULT_CATALOG_NAME
    extra: dict[str, str] = {}
    for key, value in block.items():
        if key in ("name", "type", "uri", "warehouse"):
            continue
        if isinstance(value, (dict, list)):
            problems.add(ManifestValueInvalid(where, key, "a catalog property must be a string, number or boolean"))
            continue
        extra[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if kind == "rest":
        uri = problems.string(where, block, "uri", required=True)
        warehouse = problems.string(where, block, "warehouse")
        return CatalogSpec(name, "rest", uri, warehouse, extra) if uri else None
    uri = problems.string(where, block, "uri") or f"sqlite:///{(root / DEFAULT_CATALOG_DB).resolve()}"
    warehouse = problems.string(where, block, "warehouse") or str(DEFAULT_WAREHOUSE)
    if "://" not in warehouse:
        warehouse = (root / warehouse).resolve().as_uri()
    return CatalogSpec(name, "sql", uri, warehouse, extra)
