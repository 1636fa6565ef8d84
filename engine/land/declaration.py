"""A landing pipeline's declaration of its table, compared with the one the table landed under.

A table keeps what its first landing declared in the catalog's table head: its primary key and
``order_by`` (its merge) and its normalize mode (``TableHead.declared``, from
:func:`table_declaration`). A table landed before the mode was kept there shows it in its columns
instead (a relational root carries ``_cf_id``, a nested one lands it only when its data holds one). A manifest that now declares otherwise would land rows under
a mix of the two (a key the table does not merge by, struct columns beside their shredded
columns), so ``pipeline validate``, ``plan`` and ``run`` refuse each difference by name
(:class:`TableDeclarationChanged`: the table, the setting, both values, the commands that migrate),
before anything is read or staged. docs/manifest.md, "Changing a landed table's declaration".

Each compared setting is one entry of :data:`COMPARED`: how to read it from the table, how the
manifest declares it, and how to migrate. A setting a table does not show (no rows landed yet:
no columns to tell the normalize mode by; ``order_by`` never declared) is not compared.

    >>> [c.setting for c in COMPARED]
    ['primary_key', 'order_by', 'normalize']
    >>> from contextful.storage.catalog import TableHead
    >>> old = TableHead("orders", "", 1, 1, None, ("id",), 0, 0)
    >>> [_normalize_of(old, lambda: c) for c in (["_cf_id", "id", "user__name"], ["id", "user"], None)]
    ['relational', 'nested', None]
    >>> _normalize_of(TableHead("orders", "", 1, 1, None, (), 0, 0, declared=(("normalize", "nested"),)), lambda: ["_cf_id"])
    'nested'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import TableDeclarationChanged

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest, PipelineSpec
    from contextful.storage import Store
    from contextful.storage.catalog import TableHead

RELATIONAL_ID = "_cf_id"
"""The column every relational root row carries (``engine.normalize.relational.ID``)."""


def _keys(key: tuple[str, ...]) -> str:
    return repr(list(key)) if key else "none"


def _text(value: str | None) -> str:
    return "none" if value is None else repr(value)


def table_declaration(spec: PipelineSpec) -> dict[str, str]:
    """What a landing pipeline declares of its root table beside its merge, kept with the table
    when it is created (``Store.create_table(declared=...)``)."""
    return {"normalize": spec.normalize}


def _normalize_of(head: TableHead, columns: Callable[[], list[str] | None]) -> str | None:
    """The normalize mode ``head`` was created under, else the one its columns show (None: no rows yet)."""
    kept = dict(head.declared).get("normalize")
    if kept is not None:
        return kept
    names = columns()
    return None if names is None else "relational" if RELATIONAL_ID in names else "nested"


@dataclass(frozen=True)
class Compared:
    """One setting of a pipeline's table that its landed table keeps."""

    setting: str
    """The manifest key (``[[pipeline]] primary_key``, ...)."""
    declared: Callable[[PipelineSpec], Any]
    """The value the manifest declares."""
    stored: Callable[[TableHead, Callable[[], list[str] | None]], Any]
    """The value the table landed under, from its head and its columns (read only when asked: a
    no-op run imports no pyarrow); None: not shown, not compared."""
    spelled: Callable[[Any], str]
    """A value as the manifest spells it."""
    rekey: bool = False
    """Whether the rows can be kept under the new value by re-landing them with ``table load``."""


COMPARED: tuple[Compared, ...] = (
    Compared("primary_key", lambda spec: spec.primary_key, lambda head, _columns: head.primary_key, _keys,
             rekey=True),
    Compared("order_by", lambda spec: spec.order_by, lambda head, _columns: head.order_by, _text),
    Compared("normalize", lambda spec: spec.normalize, _normalize_of, _text),
)


def declaration_changes(store: Store, spec: PipelineSpec) -> list[TableDeclarationChanged]:
    """Each setting ``spec`` declares otherwise than its landed table holds (none: no such table yet,
    or a derive pipeline, whose tables the derive path declares)."""
    if spec.source.kind == "derive":
        return []
    head = store.catalog.load_head(spec.table)
    if head is None:
        return []
    schema = head.schema

    def columns() -> list[str] | None:
        if schema is None:
            return None
        from contextful.storage.manifest import schema_from_text

        return list(schema_from_text(schema).names)

    problems = []
    for c in COMPARED:
        stored, declared = c.stored(head, columns), c.declared(spec)
        if stored is None or stored == declared:
            continue
        problems.append(TableDeclarationChanged(head.name, spec.id, c.setting, c.spelled(stored), c.spelled(declared),
                                                _migration(store, spec, head.name, c)))
    return problems


def refuse_changed_declaration(store: Store, spec: PipelineSpec) -> None:
    """Raise the first :func:`declaration_changes` problem of ``spec`` (a run lands nothing under a mix)."""
    if problems := declaration_changes(store, spec):
        raise problems[0]


def manifest_declaration_changes(manifest: Manifest, store: str | None = None) -> list[TableDeclarationChanged]:
    """:func:`declaration_changes` of every pipeline of ``manifest`` against its store (``store``, else
    the project's), when that store exists (reading never creates one)."""
    from contextful.engine.model.inputs import store_exists
    from contextful.engine.project import open_store

    if not store_exists(manifest, store):
        return []
    with open_store(store or manifest.root) as opened:
        return [p for spec in manifest.pipelines for p in declaration_changes(opened, spec)]


def _migration(store: Store, spec: PipelineSpec, table: str, compared: Compared) -> str:
    """The commands that move ``table`` to ``spec``'s declaration, each working today."""
    children = sorted(n for n in store.table_names() if n.lower().startswith(table.lower() + "__"))
    drop = "; ".join(f"`contextful table drop {name}`" for name in (table, *children))
    steps = [(f"land into a new table (give pipeline {spec.id!r} `table = \"{table}_v2\"`: its first run lands "
              f"every input there), or drop the table ({drop}: the pipeline's cursor goes with it, so its next run "
              "lands every input again under the new declaration)")]
    if compared.rekey and spec.primary_key:
        key = ",".join(spec.primary_key)
        steps.append(f"or re-key the rows as they are: `contextful sql --format parquet -o {table}.parquet \"SELECT * FROM {table}\"`, "
                     f"`contextful table drop {table}`, `contextful table load {table} {table}.parquet "
                     f"--primary-key {key}`")
    return "; ".join(steps)
