"""An input parsed in blocks of whole records, several blocks at once on worker threads.

Part of decision "decoder-child-owns" (``engine.land.decode_child``): the blocks come from a ring
of reused buffers, so a decode's memory is a few blocks whatever the input's size. What a record
is (a line, a CSV record) is the ``cut`` the format passes in.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from contextful.engine.land.decode_source import _Malformed
from contextful.engine.land.decode_wire import READ_BYTES

PARSING = min(4, max(2, os.cpu_count() or 2))
"""Blocks parsing at once, one thread each: a decode uses up to 4 cores and a bounded memory."""
_MAX_BLOCK = (1 << 31) - 1  # pyarrow's block sizes are 32-bit


class _LastNewline:
    """Where the last whole line in ``buffer[start:stop]`` ends (-1: none)."""

    def __call__(self, buffer: bytearray, start: int, stop: int) -> int:
        at = buffer.rfind(b"\n", start, stop)
        return at + 1 if at >= 0 else -1


_Parsed = TypeVar("_Parsed")


def _records(readinto: Callable[[memoryview], int], cut: Callable[[bytearray, int, int], int],
             parse: Callable[[memoryview], _Parsed], *, header: bool = False,
             block: int = READ_BYTES) -> Generator[_Parsed, None, None]:
    """Parse the stream in blocks of whole records, read into a ring of reused buffers of ``block`` bytes.

    ``PARSING`` blocks parse at once, each on a worker thread of its own, while the next is read
    (and decompressed). A buffer is filled before it is cut, so the input's end is known when its
    last block is: that block takes everything left, a last record without its newline included
    (a record alone in a block of its own would be typed on its own). A block's tail (a record it
    does not end) moves to the front of the next buffer; the parsers copy what they keep, so a
    buffer is reused once its block's table is out. With a ``header``, the first block parses
    alone: the later blocks need its column names.
    """
    buffers = [bytearray(block)]  # grows to PARSING + 1 buffers as blocks come
    current, held, consumed = 0, 0, 0  # held: bytes at the front of the current buffer
    yielded = not header
    pending: deque[tuple[Future[_Parsed], int]] = deque()
    with ThreadPoolExecutor(PARSING, thread_name_prefix="decode-parse") as parser:
        while True:
            buffer = buffers[current]
            if held == len(buffer):  # one record longer than the buffer: it grows, up to the memory bound
                buffer = buffers[current] = buffer + bytearray(len(buffer))
            filled = held
            while filled < len(buffer) and (size := readinto(memoryview(buffer)[filled:])):
                filled += size
            last = filled < len(buffer)  # the input ended
            end = filled if last else cut(buffer, held, filled)
            if end < 0:
                held = filled
                continue
            following = (current + 1) % (PARSING + 1)
            if following == len(buffers):
                buffers.append(bytearray(block))
            if pending and len(pending) == (PARSING if yielded else 1):
                yield _parsed(*pending.popleft())  # frees ``following``, the oldest buffer in use
                yielded = True
            tail = filled - end
            if len(buffers[following]) <= tail:
                buffers[following] = bytearray(tail + block)
            buffers[following][:tail] = buffer[end:filled]
            if not last or buffer[:end].strip():
                pending.append((parser.submit(parse, memoryview(buffer)[:end]), consumed))
            if last:
                break
            consumed += end
            current, held = following, tail
        while pending:
            yield _parsed(*pending.popleft())


def _parsed(block: Future[_Parsed], consumed: int) -> _Parsed:
    try:
        return block.result()
    except _Malformed as exc:
        if exc.at is None and exc.offset is not None:
            exc.at = consumed + exc.offset
        raise
