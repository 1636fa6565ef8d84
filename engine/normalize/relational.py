"""Shred a nested Arrow table into relational tables: structs flatten, every list becomes a child table.

Implements decision "nested-arrow-canonical": nested Arrow is canonical and the relational shape
is a reversible projection of it (``engine.normalize.reassemble`` inverts it). The list index makes
the shredding reversible, so a child table without it is refused before it is staged
(``run.normalize.list-index-missing``, :class:`PipelineListIndexMissing`). The naming and key
columns are documented in ``docs/normalization.md``; in short:

* a struct field's column is its path joined with ``__`` (``payload__action``); a path token that
  could be misread (empty, containing ``__``, ending in ``_``, starting with ``%`` or ``_cf_``) is
  written ``%`` + the name with ``%`` and ``_`` percent-escaped, so every column name splits back
  into exactly one path;
* a nullable struct adds a boolean ``_cf_null__<path>`` (true: the struct itself is null, not
  only an enclosing one); a list adds a nullable int32 ``_cf_len__<path>`` (null: a null list,
  0: an empty one);
* a list becomes the table ``<root>__<path>`` (list elements of a list step in as ``value``),
  whose rows carry ``_cf_id``, ``_cf_parent_id``, ``_cf_root_id`` and ``_cf_list_idx``; a struct
  element's fields are its columns (with an always-present ``_cf_null``), any other element is
  the column ``value``;
* a root row's id is ``<id_prefix>.<n>`` (``n`` its 0-based position in the batch) or, when the
  root table has a primary key, ``k`` + the MD5 hex digest of its key values (:func:`key_ids`), so
  the same key always gets the same id; a child row's id is its parent's id, ``.`` and its list
  index: a re-landed keyed root row gives its children the same ids, and the child tables of a
  keyed root are keyed on ``_cf_id`` (:func:`child_primary_key`), so they replace rather than pile up;
* a keyed root row and every row descending from it carry its version ``_cf_version``
  (:func:`root_versions`, one per landing), and the child tables of a keyed root follow it
  (:func:`child_follows`, ``storage.follows``): a child row lives exactly as long as the root row
  version that landed it.

Everything is columnar: struct ``flatten``, list ``flatten`` and ``list_value_length``, ``take``,
and numpy ``repeat``/``arange`` for the parent positions and list indexes.

    >>> import pyarrow as pa
    >>> t = pa.table({"id": [1, 2], "tags": [["a", "b"], None]})
    >>> out = shred(t, "events", id_prefix="r1")
    >>> list(out)
    ['events', 'events__tags']
    >>> out["events"].column_names
    ['_cf_id', 'id', '_cf_len__tags']
    >>> out["events__tags"].to_pydict()["_cf_list_idx"]
    [0, 1]
    >>> out["events__tags"].to_pydict()["_cf_id"]
    ['r1.0.0', 'r1.0.1']
    >>> out.children["events__tags"].list_path
    'tags'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
from contextful.storage.errors import PipelineListIndexMissing, SchemaIrreconcilable
from contextful.storage.follows import Follows
from contextful.storage.keys import check_keys
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")

ID = "_cf_id"
PARENT_ID = "_cf_parent_id"
ROOT_ID = "_cf_root_id"
LIST_IDX = "_cf_list_idx"
ORDER = "_cf_order"
VERSION = "_cf_version"
CHILD_KEYS = (ID, PARENT_ID, ROOT_ID, LIST_IDX)
ELEMENT_NULL = "_cf_null"
NULL_PREFIX = "_cf_null__"
LEN_PREFIX = "_cf_len__"
RESERVED_PREFIX = "_cf_"
SEP = "__"
VALUE = "value"
MAX_NAME = 128

_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_HASH_HEX = 8

Path = tuple[str, ...]
Column: TypeAlias = "pa.Array | pa.ChunkedArray"
"""Columns stay chunked as they arrive: struct and list kernels work chunk by chunk, no copy."""


# --- naming -------------------------------------------------------------------------------------

def encode_token(name: str) -> str:
    """A field name as one path token of a column name; plain names stay as they are.

    >>> encode_token("action"), encode_token("_id"), encode_token("a__b"), encode_token("")
    ('action', '_id', '%a%5F%5Fb', '%')
    """
    if (name and SEP not in name and not name.endswith("_") and not name.startswith("%")
            and not name.startswith(RESERVED_PREFIX)):
        return name
    return "%" + name.replace("%", "%25").replace("_", "%5F")


def decode_token(token: str) -> str:
    return unquote(token[1:]) if token.startswith("%") else token


def column_name(path: Path) -> str:
    """The relational column name of a field path (raw names)."""
    return SEP.join(encode_token(name) for name in path)


def split_column(name: str) -> Path:
    """The field path a relational column name stands for (inverse of :func:`column_name`).

    No token contains ``__`` or ends with ``_``, so the leftmost ``__`` always separates tokens.
    """
    return tuple(decode_token(token) for token in name.split(SEP))


def child_table_name(root: str, path: Path) -> str:
    """The table a list at ``path`` (raw names from the root row) lands in.

    ``<root>__<encoded path>`` when that is a valid table name; otherwise unsafe characters become
    ``_``, the name is cut to 119 characters and ``_`` + 8 hex digits of the BLAKE2b digest of the
    full unsanitized name are appended, so distinct paths keep distinct names.
    """
    name = root + SEP + column_name(path)
    if _TABLE_NAME.fullmatch(name):
        return name
    digest = hashlib.blake2b(name.encode(), digest_size=_HASH_HEX // 2).hexdigest()
    return _UNSAFE.sub("_", name)[: MAX_NAME - 1 - _HASH_HEX] + "_" + digest


def _is_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t) or pa.types.is_map(t))


def _as_list(array: Column) -> Column:
    """Maps shred as lists of their ``key``/``value`` entries (list kernels have no map kernels)."""
    if pa.types.is_map(array.type):
        return array.cast(pa.list_(pa.field("entries", _element_type(array.type), nullable=False)))
    return array


def _element_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_map(t):
        return pa.struct([t.key_field, t.item_field])
    return t.value_type


# --- schema walk ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChildSpec:
    """A child table: where its rows come from and how they join their parent."""

    name: str
    """The child table's name (``events__payload__commits``)."""
    parent: str
    """The parent table's name; child ``_cf_parent_id`` joins the parent's ``_cf_id``."""
    list_path: str
    """The list's field path relative to a parent row, dotted (``payload.commits``; ``value``
    for the element lists of a list of lists)."""
    length_column: str
    """The parent column holding each list's length (null for a null list)."""


def _check_names(table: str, where: Path, names: list[str], t: pa.DataType | None) -> None:
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SchemaIrreconcilable(table, ".".join(where) or "<root>", "relational projection",
                                   str(t) if t is not None else "table", f"duplicate field name {dup!r}")


def _lists_of_fields(root: str, prefix: Path, rel: Path, fields: list[pa.Field],
                     t: pa.DataType | None) -> Iterator[tuple[Path, pa.DataType]]:
    """(relative path, list type) of every list under these fields, outside nested lists."""
    _check_names(root, prefix + rel, [f.name for f in fields], t)
    for f in fields:
        path = rel + (f.name,)
        if pa.types.is_struct(f.type):
            yield from _lists_of_fields(root, prefix, path, list(f.type), f.type)
        elif _is_list(f.type):
            yield path, f.type


def _element_lists(root: str, prefix: Path, list_type: pa.DataType) -> Iterator[tuple[Path, pa.DataType]]:
    element = _element_type(list_type)
    if pa.types.is_struct(element):
        yield from _lists_of_fields(root, prefix, (), list(element), element)
    elif _is_list(element):
        yield (VALUE,), element


def _walk(root: str, table: str, prefix: Path, lists: Iterator[tuple[Path, pa.DataType]]
          ) -> Iterator[ChildSpec]:
    for rel, list_type in lists:
        full = prefix + rel
        name = child_table_name(root, full)
        yield ChildSpec(name, table, ".".join(rel), LEN_PREFIX + column_name(rel))
        yield from _walk(root, name, full, _element_lists(root, full, list_type))


def child_tables_of(schema: pa.Schema, root: str) -> list[ChildSpec]:
    """The child tables a batch of ``schema`` shreds into, parents before children.

    >>> s = pa.schema([("a", pa.list_(pa.list_(pa.int64())))])
    >>> [(c.name, c.parent, c.list_path) for c in child_tables_of(s, "t")]
    [('t__a', 't', 'a'), ('t__a__value', 't__a', 'value')]
    """
    return list(_walk(root, root, (), _lists_of_fields(root, (), (), list(schema), None)))


# --- shredding -------------------------------------------------------------------------------

class RelationalTables(Mapping[str, pa.Table]):
    """Table name -> relational table, parents before children, with each child's :class:`ChildSpec`."""

    def __init__(self, root: str, tables: Mapping[str, pa.Table], children: Mapping[str, ChildSpec]) -> None:
        self.root = root
        self._tables = dict(tables)
        self.children: dict[str, ChildSpec] = dict(children)
        """Child table name -> its spec (every table but the root)."""

    def __getitem__(self, name: str) -> pa.Table:
        return self._tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def __repr__(self) -> str:
        return f"RelationalTables({self.root!r}, {[(n, t.num_rows) for n, t in self._tables.items()]})"


def _ids(prefix: str, n: int) -> pa.Array:
    return pc.binary_join_element_wise(prefix + ".", pc.cast(pa.array(np.arange(n, dtype=np.int64)),
                                                            pa.string()), "")


def key_ids(table: pa.Table, primary_key: tuple[str, ...]) -> pa.Array:
    """The ids of root rows keyed by ``primary_key``: ``k`` + the MD5 hex digest of the JSON object of
    their key values (DuckDB's ``to_json``, zoned timestamps in UTC: the same values always give the
    same id, whatever batch, run or machine they land on). Columnar: one DuckDB query over the key
    columns.

    >>> key_ids(pa.table({"id": [1, 2, 1]}), ("id",)).to_pylist()[0] == key_ids(pa.table({"id": [1]}), ("id",))[0].as_py()
    True
    """
    import duckdb

    keys = pa.table({f"k{i}": table.column(name) for i, name in enumerate(primary_key)})
    packed = ", ".join(f"k{i} := k{i}" for i in range(len(primary_key)))
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")  # zoned timestamps print as UTC, whatever the machine's zone
        con.register("__cf_keys", keys)
        ids = con.sql(f"SELECT 'k' || md5(to_json(struct_pack({packed}))) AS id FROM __cf_keys").to_arrow_table()
    finally:
        con.close()
    return ids.column("id").combine_chunks().cast(pa.string())


def root_versions(id_prefix: str, n: int) -> pa.Array:
    """The versions of a batch's ``n`` keyed root rows: ``base + i`` for row ``i``, ``base`` the first
    62 bits of the BLAKE2b digest of ``id_prefix`` (unique per batch of the table). Two landings of a
    root row so get different versions (as unkeyed root ids differ, whose uniqueness rests on the
    same prefix); every descendant row carries its root row's, and a child table answers only the
    rows of the version its root answers (``storage.follows``).

    >>> root_versions("r1.1", 2).to_pylist()[1] - root_versions("r1.1", 2).to_pylist()[0]
    1
    """
    base = int.from_bytes(hashlib.blake2b(id_prefix.encode(), digest_size=8).digest(), "big") >> 2
    return pa.array(np.arange(base, base + n, dtype=np.int64))


def child_follows(root: str, root_primary_key: tuple[str, ...]) -> Follows | None:
    """The lifetime rule of a child table of ``root``: under a keyed root its rows follow the root
    row versions that landed them (``storage.follows``); an unkeyed root's rows never merge, so its
    children need none."""
    return Follows(root, ID, ROOT_ID, VERSION) if root_primary_key else None


def child_primary_key(root_primary_key: tuple[str, ...]) -> tuple[str, ...]:
    """The primary key of a child table: ``_cf_id`` under a keyed root (its ids follow the root's
    key, so a re-landed root row's elements replace the earlier ones), none under an unkeyed one."""
    return (ID,) if root_primary_key else ()


def child_order_by(root_primary_key: tuple[str, ...], root_order_by: str | None) -> str | None:
    """The ``order_by`` of a child table: ``_cf_order`` (its root row's ``order_by`` value) under a
    keyed root merging by ``order_by``, so an element's winner comes from the root row's winner."""
    return ORDER if root_primary_key and root_order_by else None


def _child_ids(parents: pa.Array, list_idx: np.ndarray) -> pa.Array:
    """A child row's id: its parent's id, ``.``, its list index.

    The suffixes ``.0`` … ``.<longest list - 1>`` are printed once and taken per row: a take of
    short strings costs a quarter of printing every row's index.

    >>> _child_ids(pa.array(["r.0", "r.0", "r.1"]), np.array([0, 1, 0], dtype=np.int32)).to_pylist()
    ['r.0.0', 'r.0.1', 'r.1.0']
    """
    longest = int(list_idx.max()) + 1 if len(list_idx) else 0
    suffixes = pc.binary_join_element_wise(".", pc.cast(pa.array(np.arange(longest, dtype=np.int32)), pa.string()), "")
    return pc.binary_join_element_wise(parents, suffixes.take(pa.array(list_idx)), "")


class _Shredder:
    def __init__(self, root: str) -> None:
        self.root = root
        self.out: dict[str, pa.Table] = {}

    def flatten(self, path: Path, array: Column, nullable: bool, parent: Column | None,
                columns: list[tuple[str, Column]], lists: list[tuple[Path, Column, Column]]) -> None:
        """Append ``array``'s relational columns (at ``path``) and collect its lists.

        ``array`` carries its ancestors' nulls (struct ``flatten`` merges them into the fields;
        ``parent`` is the enclosing struct, if any), so the null marker of a struct records only
        its own nulls: where it is null and every ancestor is valid. A nullable struct always has
        its marker, so a schema always shreds into the same columns.
        """
        t = array.type
        if pa.types.is_struct(t):
            ancestor_nulls = 0 if parent is None else parent.null_count
            if nullable or t.num_fields == 0 or array.null_count > ancestor_nulls:
                own = array.is_null() if parent is None else pc.and_(array.is_null(), parent.is_valid())
                columns.append((NULL_PREFIX + column_name(path), own))
            for field, child in zip(t, array.flatten(), strict=True):
                self.flatten(path + (field.name,), child, field.nullable, array, columns, lists)
        elif _is_list(t):
            array = _as_list(array)
            lengths = pc.list_value_length(array)
            columns.append((LEN_PREFIX + column_name(path), lengths.cast(pa.int32())))
            lists.append((path, array, lengths))
        else:
            columns.append((column_name(path), array))

    def emit(self, name: str, full: Path, keys: list[tuple[str, Column]],
             columns: list[tuple[str, Column]], lists: list[tuple[Path, Column, Column]],
             ids: pa.Array, inherited: list[tuple[str, Column]]) -> None:
        """Output table ``name`` and shred its lists; ``inherited`` are the columns every
        descendant row takes from its root row (``_cf_root_id``, and ``_cf_order`` when kept)."""
        cols = keys + columns
        self.out[name] = pa.Table.from_arrays([a for _, a in cols], names=[c for c, _ in cols])
        for rel, array, lengths in lists:
            self.child(full + rel, array, lengths, ids, inherited)

    def child(self, full: Path, array: Column, lengths: Column, parent_ids: pa.Array,
              parent_inherited: list[tuple[str, Column]]) -> None:
        name = child_table_name(self.root, full)
        counts = pc.fill_null(lengths, 0).to_numpy()
        values = pc.list_flatten(array)  # skips null lists even when their offsets span values
        n = len(values)
        positions = np.repeat(np.arange(len(array), dtype=np.int64), counts)
        parent_pos = pa.array(positions)
        starts = np.cumsum(counts) - counts
        list_idx = (np.arange(n, dtype=np.int64) - starts[positions]).astype(np.int32)
        parents = parent_ids.take(parent_pos)
        indexes = pa.array(list_idx, pa.int32())
        ids = _child_ids(parents, list_idx)
        # a list of the root row: its parent is its root, so one take serves both keys
        inherited = [(column, parents if values_of is parent_ids else values_of.take(parent_pos))
                     for column, values_of in parent_inherited]
        keys: list[tuple[str, Column]] = [(ID, ids), (PARENT_ID, parents), inherited[0], (LIST_IDX, indexes),
                                          *inherited[1:]]
        columns: list[tuple[str, Column]] = []
        lists: list[tuple[Path, Column, Column]] = []
        if pa.types.is_struct(values.type):
            columns.append((ELEMENT_NULL, values.is_null()))
            for field, child in zip(values.type, values.flatten(), strict=True):
                self.flatten((field.name,), child, field.nullable, values, columns, lists)
        else:
            self.flatten((VALUE,), values, True, None, columns, lists)
        self.emit(name, full, keys, columns, lists, ids, inherited)


def shred(table: pa.Table, root: str, *, id_prefix: str, primary_key: tuple[str, ...] = (),
          order_by: str | None = None, input: str | None = None, first_row: int = 0) -> RelationalTables:
    """The relational projection of ``table``: the root table ``root`` and one table per list.

    Every child table of the schema is returned, empty when no row has an element there.
    Without ``primary_key``, root ids are ``<id_prefix>.<n>`` and ``id_prefix`` must be unique per
    batch of the table (the run id and a batch counter). With it (columns of the root table, struct
    fields by their ``__`` names), root ids derive from the key values (:func:`key_ids`), after
    :func:`storage.keys.check_keys` refused a missing key column or a null key (naming ``input``
    and the row, ``first_row`` being the batch's first row's position in it). With ``primary_key``
    and ``order_by`` (a root column), every child row carries its root row's ``order_by`` value as
    ``_cf_order``, so child tables merge by the root's rule (:func:`child_order_by`). With
    ``primary_key``, ``id_prefix`` (unique per batch of the table) gives each root row its version
    ``_cf_version`` (:func:`root_versions`), which every descendant row carries too.
    """
    specs = {spec.name: spec for spec in child_tables_of(table.schema, root)}
    shredder = _Shredder(root)
    columns: list[tuple[str, Column]] = []
    lists: list[tuple[Path, Column, Column]] = []
    for field, column in zip(table.schema, table.columns, strict=True):
        shredder.flatten((field.name,), column, field.nullable, None, columns, lists)
    inherited: list[tuple[str, Column]] = []
    keys: list[tuple[str, Column]]
    if primary_key:
        flat = pa.Table.from_arrays([a for _, a in columns], names=[c for c, _ in columns])
        check_keys(root, primary_key, flat, input=input, first_row=first_row)
        ids = key_ids(flat, primary_key)
        if order_by is not None:
            order = flat.column(order_by) if order_by in flat.column_names else pa.nulls(flat.num_rows)
            inherited.append((ORDER, order))
        versions = root_versions(id_prefix, table.num_rows)
        inherited.append((VERSION, versions))
        keys = [(ID, ids), (VERSION, versions)]
    else:
        ids = _ids(id_prefix, table.num_rows)
        keys = [(ID, ids)]
    shredder.emit(root, (), keys, columns, lists, ids, [(ROOT_ID, ids), *inherited])
    return RelationalTables(root, shredder.out, specs)


# --- writing ------------------------------------------------------------------------------------

def check_child(parent: str, list_path: str, name: str, table: pa.Table) -> None:
    """Raise PipelineListIndexMissing unless ``table`` carries every key and a list index per row."""
    missing = [key for key in CHILD_KEYS if key not in table.column_names]
    if missing or table.column(LIST_IDX).null_count:
        raise PipelineListIndexMissing(parent, list_path, name)


def write_relational(tables: RelationalTables, stage: Callable[[str, pa.Table], None]) -> None:
    """Check every child table, then stage every table (parents first); nothing stages if one fails."""
    for name, spec in tables.children.items():
        check_child(spec.parent, spec.list_path, name, tables[name])
    for name, table in tables.items():
        stage(name, table)
