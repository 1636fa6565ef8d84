"""The guard's prefilter: Hyperscan over value bytes answers exactly the cells RE2 answers, for the
catalogue's prefixes and for the escape markers, over string and binary arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from contextful.engine.guard import prefilter
from contextful.engine.guard.catalogue import PREFIXES
from contextful.engine.guard.escapes import MARKER_PATTERN
from hypothesis import given, settings
from hypothesis import strategies as st

# Pieces that make matches, near-misses and matches split across neighbouring cells.
PIECES = [*PREFIXES, *(p[:-1] for p in PREFIXES if len(p) > 1), *(p[1:] for p in PREFIXES if len(p) > 1),
          "hello", " ", "é", "日本", "\x00", "S", "K", "-", "_", "\\", "/", "u", "%", "2F", "5f", "g", "0"]


def reference(arr: pa.Array, pattern: str = prefilter.PREFILTER_PATTERN) -> list[int]:
    return pc.indices_nonzero(pc.match_substring_regex(arr, pattern)).to_pylist()


cell = st.one_of(st.none(), st.lists(st.sampled_from(PIECES), max_size=6).map("".join))


@settings(max_examples=300, deadline=None)
@given(cells=st.lists(cell, max_size=40), kind=st.sampled_from([pa.string(), pa.large_string(), pa.binary(),
                                                                 pa.large_binary()]),
       cut=st.tuples(st.integers(0, 5), st.integers(0, 5)))
def test_hyperscan_answers_the_cells_re2_answers(cells: list[str | None], kind: pa.DataType,
                                                 cut: tuple[int, int]) -> None:
    arr = pa.array(cells, pa.string()).cast(kind)
    start = min(cut[0], len(arr))
    arr = arr.slice(start, max(0, len(arr) - start - cut[1]))  # offsets into a shared buffer
    got = prefilter._hyperscan_cells(arr, *prefilter._databases())
    assert got.prefixed.dtype == np.int64 and got.escaped.dtype == np.int64
    assert got.prefixed.tolist() == reference(arr)
    assert got.escaped.tolist() == reference(arr, MARKER_PATTERN)
    # each prefixed cell names exactly the prefixes it holds
    values = [None if v is None else (v if isinstance(v, bytes) else v.encode()) for v in arr.to_pylist()]
    assert got.prefixes is not None and set(got.prefixes) == set(got.prefixed.tolist())
    for c in got.prefixed.tolist():
        assert sorted(got.prefixes[c]) == [i for i, p in enumerate(PREFIXES) if p.encode() in values[c]]


def test_hyperscan_is_the_prefilter_here_and_re2_can_be_forced(monkeypatch) -> None:
    assert prefilter.engine_name() == "hyperscan"  # a declared dependency with wheels for this platform
    arr = pa.array(["x AKIA y", None, "ok", "-----BEGIN RSA", "SG.x", "xSGy", "a%2Fb", "c\\/d", "\\u0041", "5%"])
    assert prefilter.candidate_cells(arr).tolist() == [0, 3, 4]
    assert prefilter.candidates(arr).escaped.tolist() == [6, 7, 8]
    monkeypatch.setenv("CONTEXTFUL_GUARD_PREFILTER", "re2")
    monkeypatch.setattr(prefilter, "_local", type(prefilter._local)())
    assert prefilter.engine_name() == "re2"
    assert prefilter.candidate_cells(arr).tolist() == [0, 3, 4]
    assert prefilter.candidates(arr).escaped.tolist() == [6, 7, 8]


def test_a_null_cell_with_bytes_under_it_is_not_a_candidate() -> None:
    # Arrow lets a null slot span bytes; the cell is null whatever they say.
    data = pa.py_buffer(b"AKIAghp_")
    offsets = pa.py_buffer(np.array([0, 4, 8], dtype=np.int32).tobytes())
    validity = pa.py_buffer(bytes([0b10]))
    arr = pa.Array.from_buffers(pa.string(), 2, [validity, offsets, data], null_count=1)
    assert prefilter.candidate_cells(arr).tolist() == [1] == reference(arr)
