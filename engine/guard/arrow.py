"""The secret guard over Arrow: mask every credential in every string cell of a table or batch.

Implements ``run.guard-secrets.mask-only`` (decision ``secret-guard-has``) on the landing path,
after typed landing and before anything is staged: the guard masks and counts, it never raises on
content and blocks no run. Every string cell is scanned, at any depth: ``string``,
``large_string`` and ``string_view`` columns, and strings inside structs, lists (plain, large and
fixed-size), maps (keys and values), dictionaries and extension types (``arrow.json``) whatever
the nesting (``list<struct<list<string>>>``). Other leaves pass through untouched; so do union,
run-end-encoded and list-view arrays, which no decoder produces and Parquet cannot hold.

Column paths name a leaf: the top-level column, then ``.field`` per struct field; lists add
nothing (the cells of ``payload.commits.message`` are the messages of every commit of every row);
a map's keys and values are ``<map>.key`` and ``<map>.value``. ``masked`` maps a path to the
number of cells in which at least one span was masked, holding only paths with a masked cell.

Speed: one vectorized pass per string array (``engine.guard.prefilter``: a Hyperscan
multi-literal scan of the array's value bytes, or RE2 where Hyperscan is unavailable) selects the
candidate cells; only those are scanned in Python by the regex-free matchers; the array is
rebuilt with ``replace_with_mask`` so nulls, the type and every other cell stay as they were. An
array with no candidate comes back as the same object, and so does a table with none.

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

import pyarrow as pa
import pyarrow.compute as pc

from engine.guard.catalogue import mask_text
from engine.guard.prefilter import PREFILTER_PATTERN, candidate_cells

__all__ = ["PREFILTER_PATTERN", "GuardResult", "guard_table"]


@dataclass(frozen=True)
class GuardResult:
    """A guarded table and its masked-cell counts per column path."""

    table: pa.Table
    """The table with every credential span masked; the same object when nothing was masked."""
    masked: dict[str, int]
    """Column path -> cells masked there; only paths with at least one masked cell."""


@dataclass(frozen=True)
class BatchGuardResult:
    """A guarded record batch and its masked-cell counts per column path."""

    batch: pa.RecordBatch
    """The batch with every credential span masked; the same object when nothing was masked."""
    masked: dict[str, int]
    """Column path -> cells masked there; only paths with at least one masked cell."""


def guard_table(table: pa.Table) -> GuardResult:
    """Mask every credential in every string cell of ``table``; count masked cells per path."""
    masked: dict[str, int] = {}
    old = table.columns  # each access wraps anew: keep one set to compare identities against
    columns = [_guard_column(column, name, masked) for name, column in zip(table.column_names, old)]
    if all(new is column for new, column in zip(columns, old)):
        return GuardResult(table, masked)
    return GuardResult(pa.Table.from_arrays(columns, schema=table.schema), masked)


def guard_batch(batch: pa.RecordBatch) -> BatchGuardResult:
    """Mask every credential in every string cell of ``batch``; count masked cells per path."""
    masked: dict[str, int] = {}
    old = batch.columns
    columns = [_guard_array(column, name, masked) for name, column in zip(batch.schema.names, old)]
    if all(new is column for new, column in zip(columns, old)):
        return BatchGuardResult(batch, masked)
    return BatchGuardResult(pa.RecordBatch.from_arrays(columns, schema=batch.schema), masked)


def mask_message(text: str) -> str:
    """``text`` (an error message, a log line) with every credential span masked."""
    return mask_text(text)[0]


def _guard_column(column: pa.ChunkedArray, path: str, masked: dict[str, int]) -> pa.ChunkedArray:
    old = column.chunks
    chunks = [_guard_array(chunk, path, masked) for chunk in old]
    if all(new is chunk for new, chunk in zip(chunks, old)):
        return column
    return pa.chunked_array(chunks, type=column.type)


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


@lru_cache(maxsize=1024)
def _holds_text(t: pa.DataType) -> bool:
    """Whether an array of type ``t`` holds a string cell the guard reaches."""
    if _is_text(t):
        return True
    if pa.types.is_dictionary(t):
        return _holds_text(t.value_type)
    if isinstance(t, pa.BaseExtensionType):
        return _holds_text(t.storage_type)
    if pa.types.is_map(t):
        return _holds_text(t.key_type) or _holds_text(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _holds_text(t.value_type)
    if pa.types.is_struct(t):
        return any(_holds_text(t.field(i).type) for i in range(t.num_fields))
    return False


def _null_mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def _guard_array(arr: pa.Array, path: str, masked: dict[str, int]) -> pa.Array:
    """``arr`` with its string cells guarded: the same object when nothing in it was masked."""
    t = arr.type
    if not _holds_text(t) or len(arr) == 0:
        return arr
    if _is_text(t):
        new, changed = _mask_strings(arr)
        _count(masked, path, len(changed))
        return new
    if pa.types.is_dictionary(t):
        return _guard_dictionary(arr, path, masked)
    if isinstance(t, pa.BaseExtensionType):
        storage = arr.storage
        guarded_storage = _guard_array(storage, path, masked)
        return arr if guarded_storage is storage else pa.ExtensionArray.from_storage(t, guarded_storage)
    if pa.types.is_struct(t):
        children = [arr.field(i) for i in range(t.num_fields)]
        guarded = [_guard_array(child, f"{path}.{t.field(i).name}", masked) for i, child in enumerate(children)]
        if all(new is old for new, old in zip(guarded, children)):
            return arr
        return pa.StructArray.from_arrays(guarded, fields=list(t), mask=_null_mask(arr))
    if pa.types.is_fixed_size_list(t):
        size = t.list_size
        values = arr.values.slice(arr.offset * size, len(arr) * size)
        guarded_values = _guard_array(values, path, masked)
        if guarded_values is values:
            return arr
        return pa.FixedSizeListArray.from_arrays(guarded_values, type=t, mask=_null_mask(arr))
    return _guard_list(arr, path, masked)


def _guard_list(arr: pa.Array, path: str, masked: dict[str, int]) -> pa.Array:
    """A list, large list or map: guard the values its rows reference, keep its offsets."""
    t = arr.type
    offsets = arr.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    values = arr.values
    if first or len(values) != last:
        values = values.slice(first, last - first)
        offsets = pc.subtract(offsets, pa.scalar(first, offsets.type))
    # A map's entries are a struct<key, value>, so its paths come out as <map>.key / <map>.value.
    guarded = _guard_array(values, path, masked)
    if guarded is values:
        return arr
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(offsets, guarded.field(0), guarded.field(1), type=t, mask=_null_mask(arr))
    cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    return cls.from_arrays(offsets, guarded, type=t, mask=_null_mask(arr))


def _guard_dictionary(arr: pa.DictionaryArray, path: str, masked: dict[str, int]) -> pa.Array:
    """Guard the dictionary once; a cell counts as masked when its index names a masked entry."""
    dictionary = arr.dictionary
    if not _is_text(dictionary.type):
        guarded = _guard_array(dictionary, path, masked)  # nested dictionary values count per entry
    else:
        guarded, changed = _mask_strings(dictionary)
        if changed:
            hit = pc.is_in(arr.indices, value_set=pa.array(changed, type=arr.indices.type))
            _count(masked, path, pc.sum(hit).as_py() or 0)
    if guarded is dictionary:
        return arr
    return pa.DictionaryArray.from_arrays(arr.indices, guarded, ordered=arr.type.ordered)


def _mask_strings(arr: pa.Array) -> tuple[pa.Array, list[int]]:
    """A string array with its credentials masked, and the positions of the cells that changed."""
    if pa.types.is_string_view(arr.type):  # no compute kernels for views: scan a plain copy
        plain, positions = _mask_strings(arr.cast(pa.large_string()))
        return (plain.cast(arr.type) if positions else arr), positions
    candidates = pa.array(candidate_cells(arr), pa.int64())
    if len(candidates) == 0:
        return arr, []
    raw = pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()
    changed: list[int] = []
    replacements: list[bytes] = []
    # A Python loop bounded by the candidate cells the prefilter kept, not by the rows. Cells are
    # read as bytes and decoded with surrogateescape, so invalid UTF-8 neither raises nor changes.
    for position, value in zip(candidates.to_pylist(), arr.take(candidates).view(raw).to_pylist()):
        text, spans = mask_text(value.decode("utf-8", "surrogateescape"))
        if spans:
            changed.append(position)
            replacements.append(text.encode("utf-8", "surrogateescape"))
    if not changed:
        return arr, []
    bits = bytearray((len(arr) + 7) // 8)
    for position in changed:
        bits[position >> 3] |= 1 << (position & 7)
    mask = pa.Array.from_buffers(pa.bool_(), len(arr), [None, pa.py_buffer(bits)])
    new = pc.replace_with_mask(arr.view(raw), mask, pa.array(replacements, type=raw))
    return new.view(arr.type), changed


def _count(masked: dict[str, int], path: str, cells: int) -> None:
    if cells:
        masked[path] = masked.get(path, 0) + cells
