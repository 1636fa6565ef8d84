"""Column and field names that differ only in case, refused at landing.

DuckDB resolves names case-insensitively, so a table holding ``ID`` and ``id`` answers
``SELECT id`` from whichever it meets first, and Arrow readers raise on the ambiguity: a batch
bringing such names would land values that are read for each other. Landing refuses it with
:class:`ColumnNamesCollide`, naming the table, the two names and the input, before anything of the
batch is staged. :class:`LandedNames` holds the names a table has (its landed schema and what the
run staged so far), so a new column, or a new struct field at any depth, that differs in case
from one already there is refused the same way. Struct fields are siblings within their struct;
a list's elements and a map's values are looked into as their own level (``l[].x``).

Example::

    >>> names = LandedNames("t", pa.schema([("id", pa.int64())]))
    >>> names.admit(pa.schema([("id", pa.int64()), ("v", pa.string())]), "input a.ndjson")
    >>> try:
    ...     names.admit(pa.schema([("ID", pa.int64())]), "input b.ndjson")
    ... except ColumnNamesCollide as exc:
    ...     print(exc.table, exc.first, exc.second, exc.where)
    t id ID input b.ndjson
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from contextful.storage.errors import ColumnNamesCollide
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_module("pyarrow")

_Level = dict[str, tuple[str, "_Level"]]  # case-folded name -> (the name, the names beneath it)


class LandedNames:
    """The names of one table, every level: refuses a schema whose names collide in case."""

    def __init__(self, table: str, landed: pa.Schema | None = None) -> None:
        self.table = table
        self._names: _Level = {}
        if landed is not None:
            _add(landed, self._names)

    def admit(self, schema: pa.Schema, where: str) -> None:
        """Check ``schema`` against itself and the names held, then hold its names too."""
        _check(self.table, schema, self._names, where, "")
        _add(schema, self._names)


def _below(t: pa.DataType) -> tuple[Iterable[pa.Field], str]:
    """The fields one level beneath a value of type ``t``, and the path suffix that reaches them."""
    if pa.types.is_struct(t):
        return list(t), "."
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        fields, _ = _below(t.value_type)
        return fields, "[]."
    if pa.types.is_map(t):
        fields, _ = _below(t.item_type)
        return fields, "{value}."
    return [], ""


def _check(table: str, fields: Iterable[pa.Field], held: _Level, where: str, prefix: str) -> None:
    here: dict[str, str] = {}
    for field in fields:
        key = field.name.casefold()
        if key in here and here[key] != field.name:
            raise ColumnNamesCollide(table, prefix + here[key], prefix + field.name, where)
        here[key] = field.name
        known, beneath = held.get(key, (field.name, {}))
        if known != field.name:
            raise ColumnNamesCollide(table, prefix + known, prefix + field.name, where)
        children, step = _below(field.type)
        _check(table, children, beneath, where, prefix + field.name + step)


def _add(fields: Iterable[pa.Field], held: _Level) -> None:
    for field in fields:
        _name, beneath = held.setdefault(field.name.casefold(), (field.name, {}))
        _add(_below(field.type)[0], beneath)
