"""The guard's prefilter: which cells of a string or binary array can hold a credential.

A cell holding none of the catalogue's literal prefixes holds no plain credential, and a cell
holding none of the escape markers (``engine.guard.escapes.MARKERS``: ``\\/``, ``\\u``, ``%XX``)
holds no escaped one, so only the cells this answers are scanned by the exact matchers
(:func:`candidates` answers both sets from one scan; :func:`candidate_cells` the first). Two
implementations, one answer:

- **Hyperscan** (the default where the ``hyperscan`` package loads): the array's value bytes are
  scanned as one block by a multi-literal automaton (several GB/s), each match end is turned into
  its start (literals have fixed lengths) and mapped to its cell through the offsets buffer with
  one ``searchsorted``; a match straddling two cells (possible only because the cells are scanned
  back to back) is dropped, and so are null cells. One compiled database and scratch per thread.
- **RE2** (the fallback): ``pyarrow.compute.match_substring_regex`` over the alternation of the
  escaped literals (and the markers' compact form). It compiles the pattern on every call, which
  dominates on the many small arrays a nested batch is made of.

``CONTEXTFUL_GUARD_PREFILTER=re2`` forces the fallback. Both are tested to answer the same cells.
Binary arrays are scanned like strings: the literals are ASCII, so their bytes are the same.
"""

from __future__ import annotations

import logging
import os
import string
import threading
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
from contextful.engine.guard.catalogue import PREFIXES
from contextful.engine.guard.escapes import MARKER_PATTERN, MARKERS
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")

log = logging.getLogger(__name__)

_SAFE = frozenset(string.ascii_letters + string.digits)


def _literal_alternation(literals: tuple[str, ...]) -> str:
    """An RE2 pattern matching any of ``literals`` verbatim: each non-alphanumeric escaped."""
    return "|".join("".join(c if c in _SAFE else "\\" + c for c in literal) for literal in literals)


PREFILTER_PATTERN = _literal_alternation(PREFIXES)
"""The RE2 candidate test: a cell holding none of the catalogue's prefixes holds no credential."""

_PREFIX_LENGTHS = np.array([len(p.encode("utf-8")) for p in PREFIXES], dtype=np.int64)
_MARKER_LENGTHS = np.array([len(m.encode("utf-8")) for m in MARKERS], dtype=np.int64)
_local = threading.local()
_NONE = np.empty(0, np.int64)


class Candidates(NamedTuple):
    """The cells a scan must look at: sorted int64 indices of non-null cells."""

    prefixed: np.ndarray
    """Cells holding a catalogue prefix."""
    escaped: np.ndarray
    """Cells holding an escape marker."""
    prefixes: dict[int, list[int]] | None = None
    """Per prefixed cell, the indices (into ``PREFIXES``) of the prefixes seen in it, so the
    matchers look for those alone; None where the engine cannot tell (RE2: look for all)."""


def candidates(arr: pa.Array) -> Candidates:
    """The cells of a string or binary array holding a catalogue prefix, and those holding an
    escape marker."""
    databases = _databases()
    if databases is None:
        return Candidates(_re2_cells(arr, PREFILTER_PATTERN), _re2_cells(arr, MARKER_PATTERN))
    return _hyperscan_cells(arr, *databases)


def candidate_cells(arr: pa.Array) -> np.ndarray:
    """Sorted indices (int64) of the non-null cells of a string or binary array that contain a
    catalogue prefix."""
    return candidates(arr).prefixed


def engine_name() -> str:
    """``hyperscan`` or ``re2``: which implementation :func:`candidates` uses here."""
    return "re2" if _databases() is None else "hyperscan"


def _re2_cells(arr: pa.Array, pattern: str) -> np.ndarray:
    found = pc.indices_nonzero(pc.match_substring_regex(arr, pattern))
    return found.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _hyperscan_cells(arr: pa.Array, prefix_db: Any, marker_db: Any) -> Candidates:
    """Two scans of the value bytes: the prefixes, then the markers (kept apart, the many ``%XX``
    literals would slow the prefix scan; alone, they all start with a rare byte)."""
    if len(arr) == 0:
        return Candidates(_NONE, _NONE, {})
    _validity, offsets_buffer, data = arr.buffers()
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    all_offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
    offsets = all_offsets[arr.offset: arr.offset + len(arr) + 1].astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    if data is None or end <= start:
        return Candidates(_NONE, _NONE, {})
    block = memoryview(data)[start:end]
    cells, ids = _scan(prefix_db, block, offsets, start, _PREFIX_LENGTHS)
    escaped, _ = _scan(marker_db, block, offsets, start, _MARKER_LENGTHS)
    prefixed = _valid(arr, np.unique(cells))
    seen: dict[int, list[int]] = {int(c): [] for c in prefixed.tolist()}
    for cell, prefix in zip(cells.tolist(), ids.tolist()):
        if cell in seen and prefix not in seen[cell]:
            seen[cell].append(prefix)
    return Candidates(prefixed, _valid(arr, np.unique(escaped)), seen)


def _scan(database: Any, block: memoryview, offsets: np.ndarray, start: int,
          lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cell and the literal index of every match of ``database`` that lies inside one cell."""
    ends: list[int] = []
    ids: list[int] = []

    def on_match(pattern: int, _from: int, to: int, _flags: int, _context: Any) -> None:
        ids.append(pattern)
        ends.append(to)

    database.scan(block, match_event_handler=on_match)
    if not ends:
        return _NONE, _NONE
    pattern = np.asarray(ids, dtype=np.int64)
    match_end = np.asarray(ends, dtype=np.int64) + start
    match_start = match_end - lengths[pattern]
    cells = np.searchsorted(offsets, match_start, side="right") - 1
    inside = match_end <= offsets[cells + 1]  # a match across two cells is no cell's
    return cells[inside], pattern[inside]


def _valid(arr: pa.Array, cells: np.ndarray) -> np.ndarray:
    if arr.null_count and len(cells):
        cells = cells[arr.is_valid().take(pa.array(cells)).to_numpy(zero_copy_only=False)]
    return cells


def _compile(literals: tuple[str, ...]) -> Any:
    import hyperscan

    database = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    database.compile(expressions=[_literal_alternation((p,)).encode("utf-8") for p in literals],
                     ids=list(range(len(literals))), elements=len(literals), flags=[0] * len(literals))
    return database


def _databases() -> tuple[Any, Any] | None:
    """This thread's compiled Hyperscan databases (prefixes, markers), or None (not installed,
    refused, or forced off)."""
    if not hasattr(_local, "databases"):
        _local.databases = _load_databases()
    databases: tuple[Any, Any] | None = _local.databases
    return databases


def _load_databases() -> tuple[Any, Any] | None:
    if os.environ.get("CONTEXTFUL_GUARD_PREFILTER", "").lower() == "re2":
        return None
    try:
        return _compile(PREFIXES), _compile(MARKERS)
    except Exception as exc:  # noqa: BLE001 - any failure means the RE2 fallback
        log.info("guard prefilter: Hyperscan unavailable (%s); using RE2", exc)
        return None
