"""Reassemble the canonical nested table from its relational projection: the inverse of ``shred``.

Implements the reversibility half of decision "nested-arrow-canonical": the column names say the
nesting (``engine.normalize.relational`` writes every path so it splits back into exactly one
path), the marker columns say which structs and lists were null, and the keys put each child row
back in its list. Root rows keep the order they are given in; child rows may come in any order:
each is placed by its parent's position and its ``_cf_list_idx``. Child rows whose parent is not
among the given rows (orphans, e.g. after filtering root rows) are dropped. The details and the
type normalisations are in ``docs/normalization.md``.

    >>> import pyarrow as pa
    >>> from engine.normalize.relational import shred
    >>> t = pa.table({"id": [1, 2], "tags": [["a", "b"], None]})
    >>> reassemble(shred(t, "events", id_prefix="r1"), "events").equals(t)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from contextful.engine.normalize.relational import (
    ELEMENT_NULL,
    ID,
    LEN_PREFIX,
    LIST_IDX,
    NULL_PREFIX,
    PARENT_ID,
    RESERVED_PREFIX,
    VALUE,
    Path,
    check_child,
    child_table_name,
    split_column,
)
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")


@dataclass
class _Leaf:
    column: str


@dataclass
class _List:
    column: str
    """The length column (``_cf_len__<path>``)."""
    path: Path
    """The list's path relative to its table's row."""


@dataclass
class _Struct:
    children: dict[str, _Leaf | _List | _Struct] = field(default_factory=dict)
    marker: str | None = None
    """The column that is true where the struct itself is null."""


def _parse(table: str, names: list[str]) -> _Struct:
    """The nesting a relational table's column names spell, in order of first appearance."""
    top = _Struct()
    for name in names:
        if name == ELEMENT_NULL:
            top.marker = name
            continue
        node: _Leaf | _List | None
        if name.startswith(LEN_PREFIX):
            path = split_column(name[len(LEN_PREFIX):])
            node = _List(name, path)
        elif name.startswith(NULL_PREFIX):
            path, node = split_column(name[len(NULL_PREFIX):]), None
        elif name.startswith(RESERVED_PREFIX):
            continue  # keys, and columns the engine may add; user fields never start with it
        else:
            path, node = split_column(name), _Leaf(name)
        parent = top
        for token in path[:-1]:
            parent = _struct_at(table, name, parent, token)
        if node is None:
            _struct_at(table, name, parent, path[-1]).marker = name
        elif path[-1] in parent.children:
            raise ValueError(f"table {table!r}: column {name!r} repeats a field of another column")
        else:
            parent.children[path[-1]] = node
    return top


def _struct_at(table: str, column: str, parent: _Struct, token: str) -> _Struct:
    node = parent.children.setdefault(token, _Struct())
    if isinstance(node, _Struct):
        return node
    raise ValueError(f"table {table!r}: column {column!r} nests under a field that is not a struct")


def _single(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class _Assembler:
    def __init__(self, tables: Mapping[str, pa.Table], root: str) -> None:
        self.tables = tables
        self.root = root

    def build(self, node: _Leaf | _List | _Struct, name: str, full: Path, t: pa.Table) -> pa.Array:
        """The nested array of ``node`` over the rows of ``t`` (table ``name`` at path ``full``)."""
        if isinstance(node, _Leaf):
            return _single(t.column(node.column))
        if isinstance(node, _List):
            return self.list_array(name, full, node, t)
        arrays = [self.build(child, name, full, t) for child in node.children.values()]
        fields = [pa.field(key, a.type) for key, a in zip(node.children, arrays, strict=True)]
        mask = None
        if node.marker is not None:
            mask = pc.fill_null(_single(t.column(node.marker)), False)
        return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)

    def list_array(self, parent: str, parent_full: Path, node: _List, t: pa.Table) -> pa.Array:
        full = parent_full + node.path
        name = child_table_name(self.root, full)
        list_path = ".".join(node.path)
        lengths = _single(t.column(node.column))
        counts = pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        child = self.tables.get(name)
        if child is None:
            if counts.sum():
                raise ValueError(f"table {parent!r}: list {list_path} has elements but no child table {name!r}")
            values: pa.Array = pa.nulls(0)
        else:
            check_child(parent, list_path, name, child)
            if ID not in t.column_names:
                raise ValueError(f"table {parent!r} has no {ID} column for its child table {name!r}")
            child = _in_list_order(parent, list_path, name, _single(t.column(ID)), child, counts)
            values = self.element(name, full, child)
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values,
                                        type=pa.list_(pa.field("item", values.type)),
                                        mask=pc.is_null(lengths))

    def element(self, name: str, full: Path, child: pa.Table) -> pa.Array:
        top = _parse(name, child.column_names)
        if top.marker is not None:
            return self.build(top, name, full, child)
        if list(top.children) != [VALUE]:
            raise ValueError(f"table {name!r}: a child table holds a struct element (with {ELEMENT_NULL}) "
                             f"or one column {VALUE!r}, not {list(top.children)}")
        return self.build(top.children[VALUE], name, full, child)


def _in_list_order(parent: str, list_path: str, name: str, parent_ids: pa.Array, child: pa.Table,
                   counts: np.ndarray) -> pa.Table:
    """``child``'s rows of the given parents, ordered by parent position then list index.

    The rows must fill each parent's list exactly (``counts``): ``_cf_list_idx`` 0..len-1 once each.
    """
    child_parents = _single(child.column(PARENT_ID))
    if child_parents.type != parent_ids.type:
        child_parents = child_parents.cast(parent_ids.type)
    position = pc.index_in(child_parents, value_set=parent_ids)
    if position.null_count:  # orphans: their parent row is not among the given rows
        keep = position.is_valid()
        child, position = child.filter(keep), position.filter(keep)
    index = _single(child.column(LIST_IDX)).to_numpy(zero_copy_only=False).astype(np.int64)
    key = (position.to_numpy(zero_copy_only=False).astype(np.int64) << 32) + index
    starts = np.cumsum(counts) - counts
    n = int(counts.sum())
    expected = (np.repeat(np.arange(len(counts), dtype=np.int64) << 32, counts)
                + np.arange(n, dtype=np.int64) - np.repeat(starts, counts))
    if np.array_equal(key, expected):
        return child
    order = np.argsort(key, kind="stable")
    if not np.array_equal(key[order], expected):
        raise ValueError(f"child table {name!r} of {parent!r} (list {list_path}): its rows do not fill the "
                         "parent's lists (a list index is missing, repeated or beyond the list's length)")
    return child.take(pa.array(order))


def reassemble(tables: Mapping[str, pa.Table], root: str) -> pa.Table:
    """The canonical nested table of ``root`` from its relational tables, key columns dropped.

    Root rows come back in the order ``tables[root]`` holds them. A child table that is absent
    counts as empty; a list whose child table is absent and whose lists are all null or empty comes
    back as ``list<null>``.
    """
    t = tables[root]
    top = _parse(root, t.column_names)
    if top.marker is not None:
        raise ValueError(f"table {root!r}: a root table has no {ELEMENT_NULL} column")
    assembler = _Assembler(tables, root)
    arrays = [assembler.build(node, root, (), t) for node in top.children.values()]
    return pa.Table.from_arrays(arrays, names=list(top.children))
