"""Fixtures of the command-line tests."""

from __future__ import annotations

import functools

import pytest
from contextful.engine.land.decode import Decoder

SMALL_BLOCK = 64 << 10
"""The decoder block size of ``small_blocks``: many reads, and many blocks, in an input of a few MiB."""


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """A pipeline run's decoder reads ``SMALL_BLOCK`` bytes at a time instead of 4 MiB (the knob that
    puts many blocks in a small input; nothing else of the run changes). Returns the block size."""
    monkeypatch.setattr("contextful.engine.run.units.Decoder", functools.partial(Decoder, block_bytes=SMALL_BLOCK))
    return SMALL_BLOCK
