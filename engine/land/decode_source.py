"""An input's bytes as its decoder child reads them: opened, decompressed, windowed, transcoded.

Part of decision "decoder-child-owns" (``engine.land.decode_child``): every reader here streams a
read at a time, so a child's memory stays bounded whatever the input's size. :class:`_Malformed`
is the decode's one error for an input that is not the format it claims; its line is counted
from the file's start only when it is reported (:func:`_line_at`).
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from contextful.engine.land.decode_wire import READ_BYTES, local_path, split_compression
from contextful.storage.errors import first_line
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import fsspec
else:
    fsspec = lazy_module("fsspec")


class _Malformed(Exception):
    """The input is not the format it claims. ``offset`` locates the record in its block, ``at`` in
    the (decompressed) input; the line is counted from ``at`` once, when the error is reported."""

    def __init__(self, reason: str, *, offset: int | None = None, at: int | None = None,
                 line: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset
        self.at = at
        self.line = line
        """The 1-based line, when the reader that found it knew it (``at`` is counted otherwise)."""


_Report = Callable[[int, bool], None]
"""Told the input's bytes read so far after each read, and whether the reading is a CSV's first
(:func:`_csv_types`); the sink sends it on as a progress frame."""


def _open(path: str, options: dict[str, Any]) -> pa.NativeFile:
    """The input as an Arrow file: native for a local file, a FIFO included, else through fsspec."""
    local = local_path(path)
    if local is None:
        return pa.PythonFile(fsspec.open(path, "rb", **options).open(), mode="r")
    if stat.S_ISREG(os.stat(local).st_mode):
        return pa.OSFile(local)
    return pa.PythonFile(open(local, "rb", buffering=0), mode="r")  # OSFile would seek


def _reader(request: dict[str, Any], report: _Report | None = None, *,
            scanning: bool = False) -> Callable[[memoryview], int]:
    """``readinto`` of the input's bytes, decompressed by its name's suffix, and transcoded to UTF-8
    from a CSV input's declared ``encoding`` (``engine.land.csv_options``) as it streams; after each
    read it tells ``report`` the input's bytes read so far (:func:`_bytes_reader`)."""
    read = _bytes_reader(request, report, scanning=scanning)
    encoding = (request.get("csv") or {}).get("encoding", "utf-8")
    return read if encoding == "utf-8" else _Transcoded(read, encoding).readinto


def _bytes_reader(request: dict[str, Any], report: _Report | None = None, *,
                  scanning: bool = False) -> Callable[[memoryview], int]:
    """``readinto`` of the input's bytes, decompressed by its name's suffix; after each read it
    tells ``report`` the input's bytes read so far (of the file as stored: a compressed input's
    compressed bytes; a window's bytes from its start). An input that cannot tell (a FIFO) reports nothing."""
    stream = _open(request["path"], request["storage_options"])
    readinto = _decoded(stream, request)
    if report is None or not stream.seekable():
        return readinto
    start = request["window"][0] if request.get("window") else 0

    def counted(target: memoryview) -> int:
        size = readinto(target)
        report(stream.tell() - start, scanning)
        return size
    return counted


def _decoded(stream: pa.NativeFile, request: dict[str, Any]) -> Callable[[memoryview], int]:
    codec = split_compression(request["path"])[1]
    if request.get("window"):
        return _window(stream, *request["window"])
    if codec is None:
        return stream.readinto
    decompressed = pa.CompressedInputStream(stream, codec)

    def readinto(target: memoryview) -> int:
        try:
            return decompressed.readinto(target)
        except OSError as exc:
            if exc.errno is not None:
                raise  # the system's error reading the file, not the codec's
            raise _Malformed(f"compressed stream: {first_line(exc)}") from exc
    return readinto


class _Transcoded:
    """A reader's bytes, decoded from ``encoding`` and encoded as UTF-8 a chunk at a time (the
    codec's incremental decoder: a character split between chunks is completed by the next), so
    memory stays one chunk. Bytes that do not read as ``encoding`` are malformed, at their line."""

    CHUNK = 1 << 20

    def __init__(self, read: Callable[[memoryview], int], encoding: str) -> None:
        self._read = read
        self._encoding = encoding
        self._decoder = codecs.getincrementaldecoder(encoding)()
        self._raw = bytearray(self.CHUNK)
        self._pending = memoryview(b"")
        self._lines = 0  # newlines read so far: a bad byte's line
        self._done = False

    def readinto(self, target: memoryview) -> int:
        while not self._pending and not self._done:
            size = self._read(memoryview(self._raw)[: min(len(target), self.CHUNK)])
            raw = bytes(self._raw[:size])
            self._done = size == 0
            try:
                text = self._decoder.decode(raw, final=self._done)
            except UnicodeDecodeError as exc:
                line = self._lines + raw.count(b"\n", 0, exc.start) + 1
                raise _Malformed(f"byte 0x{raw[exc.start]:02x} does not read as {self._encoding} (declare the "
                                 "file's `encoding`)", line=line) from exc
            self._lines += raw.count(b"\n")
            self._pending = memoryview(text.encode("utf-8"))
        size = min(len(target), len(self._pending))
        target[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def _window(stream: pa.NativeFile, start: int, stop: int) -> Callable[[memoryview], int]:
    """``readinto`` of bytes ``start`` to ``stop`` of an uncompressed file (what a cursor has not landed)."""
    stream.seek(start)
    left = [stop - start]

    def readinto(target: memoryview) -> int:
        size = stream.readinto(target[: left[0]]) if left[0] > 0 else 0
        left[0] -= size
        return size
    return readinto


def _rereadable(path: str) -> bool:
    local = local_path(path)
    return local is None or stat.S_ISREG(os.stat(local).st_mode)  # not a FIFO


def _line_at(request: dict[str, Any], at: int) -> int:
    """The 1-based line of the file holding byte ``at`` of the decompressed input: counted again
    from the file's start, since only a failing input needs it (a JSON document's rewrite keeps byte
    positions). A window's byte ``at`` is ``start + at`` of the file: its line is the file's line,
    as an editor shows it, not its place in the appended bytes."""
    if request.get("window"):
        at += request["window"][0]
        request = {**request, "window": None}
    readinto, buffer = _reader(request), bytearray(READ_BYTES)
    line = 1
    while at > 0 and (size := readinto(memoryview(buffer))):
        line += buffer.count(b"\n", 0, min(size, at))
        at -= size
    return line
