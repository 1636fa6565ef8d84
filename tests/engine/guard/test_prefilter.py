"""The guard's prefilter: Hyperscan over value bytes answers exactly the cells RE2 answers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.guard import prefilter
from engine.guard.catalogue import PREFIXES

# Pieces that make matches, near-misses and matches split across neighbouring cells.
PIECES = [*PREFIXES, *(p[:-1] for p in PREFIXES if len(p) > 1), *(p[1:] for p in PREFIXES if len(p) > 1),
          "hello", " ", "é", "日本", "\x00", "S", "K", "-", "_"]


def reference(arr: pa.Array) -> list[int]:
    return pc.indices_nonzero(pc.match_substring_regex(arr, prefilter.PREFILTER_PATTERN)).to_pylist()


cell = st.one_of(st.none(), st.lists(st.sampled_from(PIECES), max_size=6).map("".join))


@settings(max_examples=300, deadline=None)
@given(cells=st.lists(cell, max_size=40), large=st.booleans(), cut=st.tuples(st.integers(0, 5), st.integers(0, 5)))
def test_hyperscan_answers_the_cells_re2_answers(cells: list[str | None], large: bool, cut: tuple[int, int]) -> None:
    arr = pa.array(cells, pa.large_string() if large else pa.string())
    start = min(cut[0], len(arr))
    arr = arr.slice(start, max(0, len(arr) - start - cut[1]))  # offsets into a shared buffer
    got = prefilter._hyperscan_cells(arr, prefilter._database())
    assert got.dtype == np.int64
    assert got.tolist() == reference(arr)


def test_hyperscan_is_the_prefilter_here_and_re2_can_be_forced(monkeypatch) -> None:
    assert prefilter.engine_name() == "hyperscan"  # a declared dependency with wheels for this platform
    arr = pa.array(["x AKIA y", None, "ok", "-----BEGIN RSA", "SG.x", "xSGy"])
    assert prefilter.candidate_cells(arr).tolist() == [0, 3, 4]
    monkeypatch.setenv("CONTEXTFUL_GUARD_PREFILTER", "re2")
    monkeypatch.setattr(prefilter, "_local", type(prefilter._local)())
    assert prefilter.engine_name() == "re2"
    assert prefilter.candidate_cells(arr).tolist() == [0, 3, 4]


def test_a_null_cell_with_bytes_under_it_is_not_a_candidate() -> None:
    # Arrow lets a null slot span bytes; the cell is null whatever they say.
    data = pa.py_buffer(b"AKIAghp_")
    offsets = pa.py_buffer(np.array([0, 4, 8], dtype=np.int32).tobytes())
    validity = pa.py_buffer(bytes([0b10]))
    arr = pa.Array.from_buffers(pa.string(), 2, [validity, offsets, data], null_count=1)
    assert prefilter.candidate_cells(arr).tolist() == [1] == reference(arr)
