"""The secret guard over Arrow: mask every credential in every cell and every name of a table or batch.

Implements ``run.guard-secrets.mask-only`` (decision ``secret-guard-has``) on the landing path,
after typed landing and before anything is staged: the guard masks and counts, it never raises on
content and blocks no run. Every string and binary cell is scanned, at any depth: ``string``,
``large_string``, ``string_view``, ``binary``, ``large_binary`` and ``binary_view`` columns, and
those inside structs, lists (plain, large and fixed-size), maps, dictionaries and extension types
(``arrow.json``) whatever the nesting (``list<struct<list<string>>>``). Binary is read as bytes
and masked in place, so it stays binary. Every name is masked too (``engine.guard.names``):
columns, struct fields, list and map fields, schema and field metadata, and map keys (masked as
names, unique within each map). Credentials behind JSON or URL escapes are found through
``engine.guard.escapes``. Other leaves pass through untouched; so do union, run-end-encoded and
list-view arrays, which no decoder produces and Parquet cannot hold. A ``fixed_size_binary`` cell
(a Parquet input may bring one) keeps its width: each token is cut or padded with ``*`` to its span.

Why here, after typed landing and not before it: the guard must see each batch exactly as it will
be staged, so that nothing a ``types`` declaration does (a string declared ``binary``, an object
declared ``map<…>``) and nothing an input format brings (Parquet binary, maps, metadata) routes a
value or a name around it. Masking before typing would leave the staged form unchecked.

Column paths name a leaf, built from masked names: the top-level column, then ``.field`` per
struct field; lists add nothing (the cells of ``payload.commits.message`` are the messages of
every commit of every row); a map's keys and values are ``<map>.key`` and ``<map>.value``.
``masked`` maps a path to the number of cells in which at least one span was masked, holding only
paths with a masked cell; ``renamed`` lists the paths whose names were masked.

Speed: one vectorized pass per array (``engine.guard.prefilter``: Hyperscan scans of the array's
value bytes for the prefixes and the escape markers, or RE2 where Hyperscan is unavailable)
selects the candidate cells; only those are scanned in Python by the regex-free matchers, each for
the prefixes seen in it; the array is rebuilt with ``replace_with_mask`` so nulls, the type and
every other cell stay as they were. An array with no candidate and no masked name comes back as
the same object, and so does a table with none.

    >>> import pyarrow as pa
    >>> key = "AKIA" + "Q" * 16
    >>> table = pa.table({"id": [1, 2], "event": [{"msg": f"login with {key}"}, {"msg": "ok"}]})
    >>> result = guard_table(table)
    >>> result.table.column("event").to_pylist()
    [{'msg': 'login with [masked:aws-access-key-id]'}, {'msg': 'ok'}]
    >>> result.masked
    {'event.msg': 1}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from contextful.engine.guard.catalogue import replace_spans, scan_text
from contextful.engine.guard.escapes import Piece, decode, decoded_text, findings
from contextful.engine.guard.names import disambiguate, mask_metadata, mask_name, mask_names
from contextful.engine.guard.prefilter import PREFILTER_PATTERN, Candidates, candidate_cells, candidates
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")

__all__ = ["PREFILTER_PATTERN", "GuardResult", "guard_table"]


@dataclass(frozen=True)
class GuardResult:
    """A guarded table, its masked-cell counts per column path, and the paths of masked names."""

    table: pa.Table
    """The table with every credential span masked; the same object when nothing was masked."""
    masked: dict[str, int]
    """Column path -> cells masked there; only paths with at least one masked cell."""
    renamed: tuple[str, ...] = ()
    """The (masked) paths of the columns and fields whose names held a credential."""


@dataclass(frozen=True)
class BatchGuardResult:
    """A guarded record batch, its masked-cell counts per column path, and the paths of masked names."""

    batch: pa.RecordBatch
    """The batch with every credential span masked; the same object when nothing was masked."""
    masked: dict[str, int]
    """Column path -> cells masked there; only paths with at least one masked cell."""
    renamed: tuple[str, ...] = ()
    """The (masked) paths of the columns and fields whose names held a credential."""


class _Counts:
    """What one guard pass found: masked cells per path, and renamed paths."""

    def __init__(self) -> None:
        self.masked: dict[str, int] = {}
        self.renamed: dict[str, None] = {}  # an ordered set: a path renamed in several chunks once

    def cells(self, path: str, cells: int) -> None:
        if cells:
            self.masked[path] = self.masked.get(path, 0) + cells


def guard_table(table: pa.Table) -> GuardResult:
    """Mask every credential in every string or binary cell and every name of ``table``."""
    counts = _Counts()
    original = table.schema  # each access wraps anew: keep one to compare identities against
    schema = _guard_schema(original, counts)
    old = table.columns
    columns = [_guard_column(column, name, counts) for name, column in zip(schema.names, old)]
    if schema is original and all(new is column for new, column in zip(columns, old)):
        return GuardResult(table, counts.masked)
    schema = _with_types(schema, [c.type for c in columns])
    return GuardResult(pa.Table.from_arrays(columns, schema=schema), counts.masked, tuple(counts.renamed))


def guard_batch(batch: pa.RecordBatch) -> BatchGuardResult:
    """Mask every credential in every string or binary cell and every name of ``batch``."""
    counts = _Counts()
    original = batch.schema
    schema = _guard_schema(original, counts)
    old = batch.columns
    columns = [_guard_array(column, name, counts) for name, column in zip(schema.names, old)]
    if schema is original and all(new is column for new, column in zip(columns, old)):
        return BatchGuardResult(batch, counts.masked)
    schema = _with_types(schema, [c.type for c in columns])
    return BatchGuardResult(pa.RecordBatch.from_arrays(columns, schema=schema), counts.masked,
                            tuple(counts.renamed))


def _guard_schema(schema: pa.Schema, counts: _Counts) -> pa.Schema:
    """``schema`` with its top-level names and metadata masked (the same object when none changes)."""
    names = tuple(schema.names)
    masked = mask_names(names)
    metadata = mask_metadata(schema.metadata)
    old = list(schema)
    fields = [_renamed_field(field, name, name, counts) for field, name in zip(old, masked)]
    if masked == names and metadata == schema.metadata and all(f is o for f, o in zip(fields, old)):
        return schema
    return pa.schema(fields, metadata=metadata)


def _renamed_field(field: pa.Field, name: str, path: str, counts: _Counts) -> pa.Field:
    """``field`` under its masked ``name`` (its metadata masked too), the renamed path counted."""
    metadata = mask_metadata(field.metadata)
    if name == field.name and metadata == field.metadata:
        return field
    if name != field.name:
        counts.renamed[path] = None
    return pa.field(name, field.type, field.nullable, metadata)


def _with_types(schema: pa.Schema, types: list[pa.DataType]) -> pa.Schema:
    fields = [f if f.type == t else f.with_type(t) for f, t in zip(schema, types)]
    return pa.schema(fields, metadata=schema.metadata)


def _guard_column(column: pa.ChunkedArray, path: str, counts: _Counts) -> pa.ChunkedArray:
    old = column.chunks
    if not old:
        new_type = _guard_array(pa.array([], column.type), path, _Counts()).type
        return column if new_type == column.type else pa.chunked_array([], type=new_type)
    chunks = [_guard_array(chunk, path, counts) for chunk in old]
    if all(new is chunk for new, chunk in zip(chunks, old)):
        return column
    return pa.chunked_array(chunks)


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t))


@lru_cache(maxsize=1024)
def _holds_text(t: pa.DataType) -> bool:
    """Whether an array of type ``t`` holds a string or binary cell, or a name the guard masks."""
    if _is_text(t) or pa.types.is_fixed_size_binary(t):
        return True
    if pa.types.is_dictionary(t):
        return _holds_text(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return _holds_text(t.storage_type)
    if pa.types.is_map(t):
        return any(_holds_text(f.type) or _renames(f) for f in (t.key_field, t.item_field))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _holds_text(t.value_type) or _renames(t.value_field)
    if pa.types.is_struct(t):
        return any(_holds_text(f.type) or _renames(f) for f in t)
    return False


def _renames(field: pa.Field) -> bool:
    """Whether the guard masks something in ``field``'s name or metadata."""
    return mask_name(field.name) != field.name or mask_metadata(field.metadata) != field.metadata


def _null_mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def _guard_array(arr: pa.Array, path: str, counts: _Counts) -> pa.Array:
    """``arr`` with its cells and names guarded: the same object when nothing in it was masked."""
    t = arr.type
    if not _holds_text(t):
        return arr
    if _is_text(t):
        new, changed = _mask_strings(arr)
        counts.cells(path, len(changed))
        return new
    if pa.types.is_fixed_size_binary(t):
        new, changed = _mask_fixed_width(arr)
        counts.cells(path, len(changed))
        return new
    if pa.types.is_dictionary(t):
        return _guard_dictionary(arr, path, counts)
    if isinstance(t, pa.BaseExtensionType):
        storage = arr.storage
        guarded_storage = _guard_array(storage, path, counts)
        if guarded_storage is storage:
            return arr
        if guarded_storage.type != t.storage_type:  # a name inside changed: the extension cannot hold it
            return guarded_storage
        return pa.ExtensionArray.from_storage(t, guarded_storage)
    if pa.types.is_struct(t):
        old_fields = list(t)
        names = mask_names(tuple(f.name for f in old_fields))
        children = [arr.field(i) for i in range(t.num_fields)]
        guarded = [_guard_array(child, f"{path}.{names[i]}", counts) for i, child in enumerate(children)]
        fields = [_renamed_field(f, names[i], f"{path}.{names[i]}", counts) for i, f in enumerate(old_fields)]
        if (all(new is old for new, old in zip(guarded, children))
                and all(f is o for f, o in zip(fields, old_fields))):
            return arr
        fields = [f.with_type(g.type) for f, g in zip(fields, guarded)]
        return pa.StructArray.from_arrays(guarded, fields=fields, mask=_null_mask(arr))
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = arr.values.slice(arr.offset * size, len(arr) * size)
        guarded_values = _guard_array(values, path, counts)
        value_field = t.value_field
        field = _value_field(value_field, guarded_values, path, counts)
        if guarded_values is values and field is value_field:
            return arr
        return pa.FixedSizeListArray.from_arrays(guarded_values, type=pa.list_(field, size), mask=_null_mask(arr))
    return _guard_list(arr, path, counts)


def _value_field(field: pa.Field, values: pa.Array, path: str, counts: _Counts) -> pa.Field:
    """A list's value field (or a map's key/item field) under its masked name and the values' type."""
    renamed = _renamed_field(field, mask_name(field.name), path, counts)
    return renamed if renamed.type.equals(values.type) else renamed.with_type(values.type)


def _guard_list(arr: pa.Array, path: str, counts: _Counts) -> pa.Array:
    """A list, large list or map: guard the values its rows reference, keep its offsets."""
    t = arr.type
    offsets = arr.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    if pa.types.is_map(t):
        keys, items = arr.keys, arr.items
        if first or len(keys) != last:
            keys, items = keys.slice(first, last - first), items.slice(first, last - first)
            offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
        guarded_keys = _guard_map_keys(keys, offsets, f"{path}.key", counts)
        guarded_items = _guard_array(items, f"{path}.value", counts)
        old_key, old_item = t.key_field, t.item_field
        key_field = _value_field(old_key, guarded_keys, f"{path}.key", counts)
        item_field = _value_field(old_item, guarded_items, f"{path}.value", counts)
        if guarded_keys is keys and guarded_items is items and key_field is old_key and item_field is old_item:
            return arr
        return pa.MapArray.from_arrays(offsets, guarded_keys, guarded_items,
                                       type=pa.map_(key_field, item_field, t.keys_sorted), mask=_null_mask(arr))
    values = arr.values
    if first or len(values) != last:
        values = values.slice(first, last - first)
        offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
    guarded = _guard_array(values, path, counts)
    value_field = t.value_field
    field = _value_field(value_field, guarded, path, counts)
    if guarded is values and field is value_field:
        return arr
    if pa.types.is_large_list(t):
        return pa.LargeListArray.from_arrays(offsets, guarded, type=pa.large_list(field), mask=_null_mask(arr))
    return pa.ListArray.from_arrays(offsets, guarded, type=pa.list_(field), mask=_null_mask(arr))


def _guard_map_keys(keys: pa.Array, offsets: pa.Array, path: str, counts: _Counts) -> pa.Array:
    """A map's keys masked as names (:func:`engine.guard.names.mask_name`), unique within each map.

    Keys are names: a masked key keeps the digest suffix so that two keys never become one (DuckDB
    refuses a map holding a key twice); a map whose masked key still equals another of its keys
    takes the ``~n`` suffix (``engine.guard.names.disambiguate``). Only the rows holding a masked
    key are looked at.
    """
    if not _is_text(keys.type):
        return _guard_array(keys, path, counts)
    guarded, changed = _mask_strings(keys, as_name=True)
    counts.cells(path, len(changed))
    if not changed:
        return guarded
    bounds = offsets.to_numpy(zero_copy_only=False)
    rows = np.unique(np.searchsorted(bounds, np.asarray(changed), side="right") - 1)
    raw = _raw_type(guarded.type)
    plain = guarded.cast(raw) if pa.types.is_binary_view(raw) else guarded.view(raw)
    fixes: dict[int, bytes] = {}
    changed_set = set(changed)
    for row in rows.tolist():
        lo, hi = int(bounds[row]), int(bounds[row + 1])
        row_keys = plain.slice(lo, hi - lo).to_pylist()
        if len(set(row_keys)) == len(row_keys):
            continue
        texts = [k.decode("utf-8", "surrogateescape") if k is not None else "" for k in row_keys]
        unique = disambiguate(texts, [i - lo for i in range(lo, hi) if i in changed_set])
        for i, (old, new) in enumerate(zip(texts, unique)):
            if old != new:
                fixes[lo + i] = new.encode("utf-8", "surrogateescape")
    return _replace(guarded, fixes) if fixes else guarded


def _guard_dictionary(arr: pa.DictionaryArray, path: str, counts: _Counts) -> pa.Array:
    """Guard the dictionary once; a cell counts as masked when its index names a masked entry."""
    dictionary = arr.dictionary
    if not _is_text(dictionary.type):
        guarded = _guard_array(dictionary, path, counts)  # nested dictionary values count per entry
    else:
        guarded, changed = _mask_strings(dictionary)
        if changed:
            hit = pc.is_in(arr.indices, value_set=pa.array(changed, type=arr.indices.type))
            counts.cells(path, pc.sum(hit).as_py() or 0)
    if guarded is dictionary:
        return arr
    return pa.DictionaryArray.from_arrays(arr.indices, guarded, ordered=arr.type.ordered)


def _raw_type(t: pa.DataType) -> pa.DataType:
    """The binary type whose layout ``t`` shares (views are read through a large copy)."""
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return pa.large_binary()
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return pa.large_binary()
    return pa.binary()


def _mask_strings(arr: pa.Array, *, as_name: bool = False, keep_width: bool = False) -> tuple[pa.Array, list[int]]:
    """A string or binary array with its credentials masked, and the positions of the cells that changed.

    Plain credentials in the cells holding a prefix; in the cells holding an escape marker whose
    decoded form holds a prefix (prefiltered again as one array), credentials read both as written
    and decoded (``engine.guard.escapes.findings``). ``as_name`` masks each changed cell as a name
    (``engine.guard.names.mask_name``); ``keep_width`` fits each token to its span.
    """
    if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):  # no kernels for views
        plain_type = pa.large_string() if pa.types.is_string_view(arr.type) else pa.large_binary()
        plain, positions = _mask_strings(arr.cast(plain_type), as_name=as_name)
        return (plain.cast(arr.type) if positions else arr), positions
    found = candidates(arr)
    if len(found.prefixed) == 0 and len(found.escaped) == 0:
        return arr, []
    # Python loops bounded by the candidate cells the prefilter kept, not by the rows. Cells are read
    # as bytes and decoded with surrogateescape, so invalid UTF-8 neither raises nor changes.
    cells = np.union1d(found.prefixed, found.escaped)
    values = arr.take(pa.array(cells)).view(_raw_type(arr.type)).to_pylist()
    texts = {p: v.decode("utf-8", "surrogateescape") for p, v in zip(cells.tolist(), values)}
    masked: dict[int, str] = {}
    if as_name:
        for position, text in texts.items():
            name = mask_name(text)
            if name != text:
                masked[position] = name
        return _replace_texts(arr, masked)
    escaped = _decoded_with_prefix(found, texts)
    for position in found.prefixed.tolist():
        if position not in escaped:
            spans = scan_text(texts[position], None if found.prefixes is None else found.prefixes[position])
            if spans:
                masked[position] = replace_spans(texts[position], spans, keep_width=keep_width)
    for position, pieces in escaped.items():
        spans = findings(texts[position], pieces)
        if spans:
            masked[position] = replace_spans(texts[position], spans, keep_width=keep_width)
    return _replace_texts(arr, masked)


def _mask_fixed_width(arr: pa.Array) -> tuple[pa.Array, list[int]]:
    """A ``fixed_size_binary`` array masked in place, each token fitted to its span's width."""
    plain, changed = _mask_strings(arr.cast(pa.binary()), keep_width=True)
    return (plain.cast(arr.type) if changed else arr), changed


def _decoded_with_prefix(found: Candidates, texts: dict[int, str]) -> dict[int, list[Piece]]:
    """The escape-marked cells worth a two-way scan, with their decoded pieces: those whose decoded
    form holds a prefix (the decoded cells prefiltered again, as one array) or that hold one as written."""
    decoded: list[tuple[int, list[Piece]]] = []
    for position in found.escaped.tolist():
        pieces = decode(texts[position])
        if pieces:
            decoded.append((position, pieces))
    if not decoded:
        return {}
    plain = pa.array([decoded_text(p).encode("utf-8", "surrogatepass") for _, p in decoded], pa.large_binary())
    hits = set(candidate_cells(plain).tolist())
    prefixed = set(found.prefixed.tolist())
    return {position: pieces for i, (position, pieces) in enumerate(decoded) if i in hits or position in prefixed}


def _replace_texts(arr: pa.Array, texts: dict[int, str]) -> tuple[pa.Array, list[int]]:
    if not texts:
        return arr, []
    changed = sorted(texts)
    return _replace(arr, {p: texts[p].encode("utf-8", "surrogateescape") for p in changed}), changed


def _replace(arr: pa.Array, values: dict[int, bytes]) -> pa.Array:
    """``arr`` with the cells at ``values``' positions replaced by its bytes, in the same type."""
    raw = _raw_type(arr.type)
    positions = sorted(values)
    bits = bytearray((len(arr) + 7) // 8)
    for position in positions:
        bits[position >> 3] |= 1 << (position & 7)
    mask = pa.Array.from_buffers(pa.bool_(), len(arr), [None, pa.py_buffer(bits)])
    replacements = pa.array([values[p] for p in positions], type=raw)
    if pa.types.is_string_view(arr.type) or pa.types.is_binary_view(arr.type):
        return pc.replace_with_mask(arr.cast(raw), mask, replacements).cast(arr.type)
    return pc.replace_with_mask(arr.view(raw), mask, replacements).view(arr.type)
