"""The decoder's other side: the preloaded fork server, and one input decoded in a forked child.

Implements decision "decoder-child-owns" (``run.land.parse-deadline``, ``run.land.parse-memory``)
with :mod:`contextful.engine.land.decode`, which starts this module as a server process
(``python -m contextful.engine.land.decode_child <fd>``). The server imports pyarrow, numpy and fsspec once and
then forks one child per input: the child calls ``setsid`` (its own process group), decodes its one
input as a stream, and exits, so no parser state reaches another input.

The server is the children's parent and enforces both bounds, checking every ``WATCH_S``:

- deadline: ``deadline_s`` after the fork, it SIGKILLs the child's process group;
- memory: when the child's anonymous resident memory (``RssAnon + RssShmem`` of
  ``/proc/<pid>/status``) exceeds ``memory_bytes``, it SIGKILLs the group.

Why a resident-memory watchdog and not an rlimit: with pyarrow loaded a child reserves far more
address space than it touches (mimalloc arenas, an arena and a stack per thread), so RLIMIT_AS at
512 MiB fails ordinary inputs (measured: an allocation fails at 64 MiB resident), and RLIMIT_DATA
counts the same reservations (438 MiB VmData for 184 MiB resident with 16 threads), so its
effective bound would shift with the machine's core count. Resident anonymous memory is what the
child really takes from the host; file-backed pages (shared libraries, page cache) are not counted.
The price of polling is overshoot: a child can allocate for up to ``WATCH_S`` past the bound.
Killing from the parent also names the bound for certain, where an rlimit failure can surface as an
abort in a pyarrow thread that reads like any other crash. The server kills before it reaps, so the
group id cannot have been reused, and kills the group again when the child exits, so no grandchild
outlives its input. A child dies with the server (PR_SET_PDEATHSIG).

Wire protocol. Control socket (parent to server, SOCK_SEQPACKET): a pickled request with two file
descriptors, the status socket and the data pipe's write end. Status socket (server to parent,
JSON messages): ``{"pid"}`` at the fork, ``{"status", "bound", "rss"}`` once the child is reaped; a
parent closing its end abandons the input and the server kills the child. Data pipe (child to
parent): segments ``b"S"`` + an Arrow IPC stream, progress frames ``b"P"`` + 8-byte offset + 1-byte
phase (when the request asks for ``progress``: the input's bytes read so far, once per block read; phase 1: a first reading for a CSV's
types; the open IPC stream ends before one, and the next batch starts a segment of the same
schema), then ``b"E"`` + 4-byte length + a JSON trailer (``{"ok": true}`` or ``{"error": kind, ...}``).

Decoding. NDJSON, JSON documents and CSV are read in blocks of about ``READ_BYTES`` (the request's
``block_bytes``) that end at a record boundary (a record longer than that grows its block, up to
the memory bound; the input's last block takes everything left, a last line without its newline
included). Each block is parsed by pyarrow, ``PARSING`` blocks at a time on worker threads while
the next is read, and a writer thread sends the tables on. No text is read as a guessed type
(decision "values land as they arrived"): JSON strings pyarrow types as timestamps are read again
as strings (:class:`_JsonBlocks`); a CSV input's columns take the types of the whole input (each
block's guess, temporal guesses as text, merged), decided in one reading whose tables are held to
its end (:class:`_CsvOnePass`) or, past ``HOLD_BLOCKS`` blocks, in a first reading of their own
(:func:`_csv_types`) before the second (:class:`_CsvBlocks`). JSON blocks otherwise type their values
on their own: the first non-empty block fixes the
stream's schema; a later block that fits it (missing columns, a null or narrower type) is cast to
it, and a block that does not (a new column, int meeting float or string) starts a new IPC segment
whose schema widens the last one: columns keep their order and new ones follow, int and float widen
to float64 (to text where an integer beyond 2**53 arrived), int and decimal(38, 0) to decimal(38, 0),
values of mixed kinds to string (objects and lists as JSON text). Number columns are typed from their
literals wherever the reader may have rounded an integer (``engine.land.json_numbers``), JSON and
CSV alike, so integers land exactly. So the batches of one
input change schema only at a widening, and every earlier batch conforms to the last schema
(:func:`conform`). Within a block, pyarrow's JSON reader refuses a column whose values change kind
("Column(/a) changed from number to string"); such a block is re-read with polars, which gives the
column the common supertype (string). Gzip, zstd and bz2 are decompressed as a stream, by name.
Parquet is read with ``ParquetFile.iter_batches``. A malformed record's line is counted once, by
reading the input again up to the record (only a failing input pays).
"""

from __future__ import annotations

import base64
import codecs
import ctypes
import dataclasses
import functools
import gc
import io
import json
import os
import pickle
import queue
import re
import select
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
from contextful.engine.land.csv_options import SNIFF_BYTES, sniff_delimiter
from contextful.engine.land.decode_wire import (
    READ,
    READ_BYTES,
    SEGMENT,
    TRAILER,
    local_path,
    split_compression,
)
from contextful.engine.land.json_numbers import (
    exact_numbers,
    literal_type,
    lost_columns,
    wide_integer,
    wide_integer_paths,
)
from contextful.storage.errors import ContextfulError, first_line
from contextful.storage.lazy import lazy_module, preload
from pyarrow import ipc

if TYPE_CHECKING:  # the landing process imports this module for its constants; the server preloads these
    import fsspec
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from contextful.engine.land.input_landing import InputLanding
else:
    fsspec = lazy_module("fsspec")
    pc = lazy_module("pyarrow.compute")
    pq = lazy_module("pyarrow.parquet")

PARSING = min(4, max(2, os.cpu_count() or 2))
"""Blocks parsing at once, one thread each: a decode uses up to 4 cores and a bounded memory."""
HOLD_BLOCKS = 16
"""A CSV input of up to this many blocks is read once, its tables held until its end shows the types."""
SAMPLE_BYTES = 64 << 10
"""The head of a CSV input whose guessed types its first block reads with (:class:`_CsvOnePass`)."""
WATCH_S = 0.01
"""How often the server checks its children's deadlines and resident memory."""

_MAX_BLOCK = (1 << 31) - 1  # pyarrow's block sizes are 32-bit
_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


# --- the server --------------------------------------------------------------------------------


@dataclass
class _Child:
    pid: int
    pidfd: int
    status: socket.socket
    deadline_at: float
    memory_bytes: int
    bound: str | None = None
    rss: int = 0
    abandoned: bool = False


def serve(control_fd: int) -> None:
    """Fork one child per request on ``control_fd`` and watch them, until the parent hangs up."""
    control = socket.socket(fileno=control_fd)
    children: dict[int, _Child] = {}
    try:
        while True:
            poller = select.poll()
            poller.register(control, select.POLLIN)
            for child in children.values():
                poller.register(child.pidfd, select.POLLIN)
                if not child.abandoned:
                    poller.register(child.status, select.POLLIN)
            events = dict(poller.poll(WATCH_S * 1000 if children else None))
            if control.fileno() in events and not _spawn(control, children):
                return
            for child in list(children.values()):
                if child.pidfd in events:
                    _reap(child)
                    del children[child.pid]
                elif not child.abandoned and child.status.fileno() in events:
                    child.abandoned = True  # the parent stopped reading this input
                    _kill(child.pid)
            _watch(children.values())
    finally:
        for child in children.values():
            _kill(child.pid)
            os.waitpid(child.pid, 0)


def _spawn(control: socket.socket, children: dict[int, _Child]) -> bool:
    message, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 2)
    if not message:
        return False
    status_fd, data_fd = fds
    status = socket.socket(fileno=status_fd)
    try:
        request = pickle.loads(message)
    except Exception as exc:  # noqa: BLE001 - e.g. storage options of a class this server cannot import
        _tell(status, {"error": f"unreadable request: {exc}"})
        status.close()
        os.close(data_fd)
        return True
    _preload_for(request)
    inherited = [control.fileno(), status_fd]
    inherited += [fd for c in children.values() for fd in (c.pidfd, c.status.fileno())]
    server = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        _tell(status, {"error": f"fork failed: {exc}"})
        status.close()
        os.close(data_fd)
        return True
    if pid == 0:
        _child(request, data_fd, inherited, server)
    spawned = time.monotonic()
    os.close(data_fd)
    children[pid] = _Child(pid, os.pidfd_open(pid), status, spawned + request["deadline_s"], request["memory_bytes"])
    _tell(status, {"pid": pid})
    return True


def _preload_for(request: dict[str, Any]) -> None:
    """Import, before forking, what this request's child needs beyond the server's start-up set: the
    HTTP client for a page, fsspec for a remote input. Once imported here every later child shares
    it, and a run of local files never pays for either (their imports start a small run's clock)."""
    if request.get("kind") == "http":
        import contextful.engine.land.http_fetch  # noqa: F401
    elif local_path(request["path"]) is None:
        preload(fsspec)
    land = request.get("land")
    if land is not None:  # a landing child's chain (engine.land.input_landing): imported once, shared
        from contextful.engine.land.input_landing import load_landing

        load_landing(land.spec)
        if local_path(land.root) is None:
            preload(fsspec)


def _reap(child: _Child) -> None:
    _kill(child.pid)  # what is left of its group; the zombie still holds the id
    _, status = os.waitpid(child.pid, 0)
    os.close(child.pidfd)
    _tell(child.status, {"status": status, "bound": child.bound, "rss": child.rss})
    child.status.close()


def _watch(children: Iterable[_Child]) -> None:
    now = time.monotonic()
    for child in children:
        if child.bound is not None:
            continue
        if now >= child.deadline_at:
            child.bound = "deadline"
        else:
            child.rss = max(child.rss, _resident(child.pid))
            if child.rss > child.memory_bytes:
                child.bound = "memory"
        if child.bound is not None:
            _kill(child.pid)


def _resident(pid: int) -> int:
    """Anonymous resident bytes of ``pid`` (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            text = fh.read()
    except OSError:
        return 0
    total = 0
    for key in (b"RssAnon:", b"RssShmem:"):
        at = text.find(key)
        if at >= 0:
            total += int(text[at + len(key):].split(None, 1)[0]) * 1024
    return total


def _kill(pid: int) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)):  # os.kill: a child not yet in its own group
        try:
            kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tell(status: socket.socket, message: dict[str, Any]) -> None:
    try:
        status.send(json.dumps(message).encode())
    except OSError:
        pass  # the parent has gone away; nothing to tell


def _child(request: dict[str, Any], data_fd: int, inherited: list[int], server: int) -> NoReturn:
    code = 0
    try:
        for fd in inherited:
            os.close(fd)
        os.setsid()
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != server:
            raise SystemExit("the fork server died before this child could watch it")
        decode_input(request, data_fd)
    except BrokenPipeError:
        code = 70  # the parent stopped reading
    except BaseException:  # noqa: BLE001 - the child's last word: print it and exit non-zero
        code = 70
        traceback.print_exc()
    finally:
        os._exit(code)


# --- one input -----------------------------------------------------------------------------------


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


def decode_input(request: dict[str, Any], data_fd: int) -> None:
    """Decode one input to ``data_fd`` as IPC segments and a trailer (runs in the child)."""
    sink = _Sink(data_fd, request["batch_rows"])
    trailer: dict[str, Any]
    if request.get("kind") == "http":
        sink.finish(_fetch(request, sink))
        return
    notes: list[str] = []  # what the decode decided that its caller reports (a sniffed delimiter)
    landing = _landing(request)
    try:
        tables = _tables(request, notes, sink.read if request.get("progress") else None)
        if landing is None:
            for table in tables:
                sink.send(table)
            trailer = {"ok": True, "notes": notes}
        else:  # the child lands its input itself (engine.land.input_landing)
            landing.land(Widening().batches(tables))
            trailer = {"ok": True, "notes": notes, "landed": landing.report()}
    except ContextfulError as exc:  # a landing child's typed landing, guard, keys or schema refused it
        trailer = {"error": "landing", "exception": base64.b64encode(pickle.dumps(exc)).decode("ascii")}
    except _Malformed as exc:
        line = exc.line if exc.line is not None else \
            _line_at(request, exc.at) if exc.at is not None and _rereadable(request["path"]) else None
        trailer = {"error": "malformed", "line": line, "reason": exc.reason}
    except UnicodeDecodeError as exc:  # a CSV header (or other text pyarrow names a column by) not UTF-8
        trailer = {"error": "malformed", "line": None,
                   "reason": f"{exc.reason} at byte 0x{exc.object[exc.start]:02x}: the file is not UTF-8 (declare its "
                             "`encoding`, e.g. latin-1 or cp1252)"}
    except FileNotFoundError:
        trailer = {"error": "not-found"}
    except MemoryError as exc:
        trailer = {"error": "memory", "reason": str(exc) or "an allocation failed"}
    except BrokenPipeError:
        raise  # the parent stopped reading: nobody to tell
    except pa.ArrowInvalid as exc:
        trailer = {"error": "malformed", "line": None, "reason": first_line(exc)}
    except (OSError, pa.ArrowNotImplementedError) as exc:
        trailer = {"error": "unreadable", "reason": first_line(exc)}
    except Exception as exc:  # noqa: BLE001 - any other failure is a crash the parent names
        trailer = {"error": "crash", "reason": f"{type(exc).__name__}: {first_line(exc)}"}
        traceback.print_exc()
    if landing is not None and "error" in trailer:
        landing.remove()  # none of a failed input lands
    sink.finish(trailer)


def _landing(request: dict[str, Any]) -> InputLanding | None:
    """The landing of a request that asks the child to land its input (None: send the batches back)."""
    if request.get("land") is None:
        return None
    from contextful.engine.land.input_landing import InputLanding

    return InputLanding(request["land"])


def _fetch(request: dict[str, Any], sink: _Sink) -> dict[str, Any]:
    """One page of a JSON API (``contextful.engine.land.http_fetch``) to ``sink``; the trailer carries its meta."""
    from contextful.engine.land.http_fetch import FetchFailed, fetch_page

    def parse(data: bytes) -> Iterator[pa.Table]:
        return _records(io.BytesIO(data).readinto, _LastNewline(), _JsonBlocks(),
                        block=request.get("block_bytes", READ_BYTES))

    try:
        meta, tables = fetch_page(request, parse)
        for table in tables:
            sink.send(table)
        return {"ok": True, "page": meta}
    except FetchFailed as exc:
        return exc.trailer()
    except _Malformed as exc:
        return {"error": "malformed", "line": None, "reason": exc.reason}
    except MemoryError as exc:
        return {"error": "memory", "reason": str(exc) or "an allocation failed"}
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - any other failure is a crash the parent names
        traceback.print_exc()
        return {"error": "crash", "reason": f"{type(exc).__name__}: {first_line(exc)}"}


_Report = Callable[[int, bool], None]
"""Told the input's bytes read so far after each read, and whether the reading is a CSV's first
(:func:`_csv_types`); the sink sends it on as a progress frame."""


def _tables(request: dict[str, Any], notes: list[str] | None = None,
            report: _Report | None = None) -> Iterator[pa.Table]:
    """The input's tables; what the decode decided on its own (a sniffed delimiter) goes to ``notes``."""
    path, fmt = request["path"], request["fmt"]
    block = request.get("block_bytes", READ_BYTES)
    if fmt == "parquet":
        yield from _parquet_tables(_open(path, request["storage_options"]), request["batch_rows"])
    elif fmt == "ndjson":
        yield from _records(_reader(request, report), _LastNewline(), _JsonBlocks(), block=block)
    elif fmt == "json":
        yield from _records(_DocumentRows(_reader(request, report)).readinto, _LastNewline(), _JsonBlocks(),
                            block=block)
    elif fmt == "csv":
        yield from _csv_tables(request, block, [] if notes is None else notes, report)
    else:
        raise ValueError(f"format {fmt!r}")


def _csv_tables(request: dict[str, Any], block: int, notes: list[str],
                report: _Report | None = None) -> Iterator[pa.Table]:
    """A CSV input's tables, each column of one type for the whole input: the merge of every block's
    guess, temporal guesses as text (an input read only once, a FIFO, lands every undeclared column
    as text rather than guess a type per block).

    An input of up to ``csv_hold_bytes`` (default ``HOLD_BLOCKS`` blocks) is read once
    (:class:`_CsvOnePass`: its tables are held until its end shows the types); a larger one is read
    twice, the first time for the types (:func:`_csv_types`), so memory stays bounded. The input's
    dialect (``engine.land.csv_options``) is read from its head first: a sniffed delimiter other than
    the name's default goes to ``notes``.
    """
    path = request["path"]
    declared = request.get("declared") or {}
    hold = request.get("csv_hold_bytes", HOLD_BLOCKS * block)
    rereadable = _rereadable(path)
    size = None
    if rereadable:
        local, window = local_path(path), request.get("window")
        size = (window[1] - window[0] if window else os.path.getsize(local)) if local is not None else None
    one_pass = not rereadable or size is None or split_compression(path)[1] is not None or size <= hold
    # the head read for the dialect is read again by the first pass: a scan for the types when the
    # input is too large to hold (its progress is reported as the scan's)
    first = _Peeked(_reader(request, report, scanning=not one_pass), SNIFF_BYTES)
    dialect = _dialect(request, first.head, notes)
    readers = iter([first.readinto])

    def reader(scanning: bool = False) -> Callable[[memoryview], int]:
        return next(readers, None) or _reader(request, report, scanning=scanning)

    header = dialect.names is None
    if not rereadable:
        yield from _records(reader(), _CsvCut(dialect.quote), _CsvBlocks(dialect, None, declared), header=header,
                            block=block)
        return
    if one_pass:
        tables = _csv_one_pass(reader(), dialect, declared, block, hold)
        if tables is not None:
            yield from tables
            return
    types = _csv_types(reader(scanning=True), dialect, declared, block)
    yield from _records(reader(), _CsvCut(dialect.quote), _CsvBlocks(dialect, types, declared), header=header,
                        block=block)

def _dialect(request: dict[str, Any], head: bytes, notes: list[str]) -> _Dialect:
    """The input's dialect: as declared, the delimiter sniffed from ``head`` when undeclared, and
    with no header the generated column names, one per field of the first record."""
    options = request.get("csv") or {}
    default = "\t" if split_compression(request["path"])[0].endswith(".tsv") else ","
    quote = options.get("quote", '"')
    delimiter = options.get("delimiter")
    sniffed = delimiter is None
    if delimiter is None:
        delimiter = sniff_delimiter(head, quote, default)
        if delimiter != default:
            notes.append(f"delimiter {delimiter!r} sniffed")
    nulls = options.get("null_values")
    dialect = _Dialect(delimiter, quote, None, None if nulls is None else tuple(nulls), sniffed)
    if options.get("header", True):
        return dialect
    end = _CsvCut(quote)(bytearray(head), 0, len(head))
    record = head[:end] if end > 0 else head
    count = pcsv.read_csv(pa.BufferReader(record), read_options=pcsv.ReadOptions(autogenerate_column_names=True),
                          parse_options=dialect.parse_options(record)).num_columns if record.strip() else 0
    return dataclasses.replace(dialect, names=[f"column_{i + 1}" for i in range(count)])


@dataclass(frozen=True)
class _Dialect:
    """How one CSV input is read (``engine.land.csv_options``), as the child decided it."""

    delimiter: str
    quote: str
    """The quote character; empty: no quoting."""
    names: list[str] | None
    """The column names when the input has no header (None: its first line is the header)."""
    nulls: tuple[str, ...] | None
    """The declared null texts, null in every column (None: pyarrow's, in typed columns only)."""
    sniffed: bool = False

    def parse_options(self, block: bytes, **more: Any) -> pcsv.ParseOptions:
        return pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote or False,
                                 newlines_in_values=bool(self.quote) and self.quote.encode() in block, **more)

    def convert(self, **more: Any) -> pcsv.ConvertOptions:
        if self.nulls is not None:
            more.update(null_values=list(self.nulls), strings_can_be_null=True)
        return pcsv.ConvertOptions(**more)

    def null_texts(self) -> pa.Array:
        return _csv_nulls() if self.nulls is None else pa.array(list(self.nulls), pa.string())

    def hint(self, reason: str) -> str:
        """``reason`` with a hint when a row's field count disagrees (the delimiter read may be wrong)
        or its text is not UTF-8 (the file's encoding is another)."""
        if "invalid UTF8" in reason:
            return f"{reason} (the file is not UTF-8: declare its `encoding`, e.g. latin-1 or cp1252)"
        if not _FIELD_COUNT.search(reason):
            return reason
        how = "sniffed" if self.sniffed else "declared"
        return (f"{reason} (delimiter {self.delimiter!r} {how}; if the file uses another, declare it: `delimiter` "
                "in [pipeline.source.config], `--delimiter` on table load)")


_FIELD_COUNT = re.compile(r"Expected \d+ columns, got \d+")


class _Peeked:
    """A reader whose first ``size`` bytes are read at once into ``head`` (fewer if the input is shorter)
    and then read again through :meth:`readinto`, so a FIFO's head serves both the sniff and the parse."""

    def __init__(self, readinto: Callable[[memoryview], int], size: int) -> None:
        buffer = bytearray(size)
        filled = 0
        while filled < size and (n := readinto(memoryview(buffer)[filled:])):
            filled += n
        self.head = bytes(buffer[:filled])
        self._at = 0
        self._rest = readinto

    def readinto(self, target: memoryview) -> int:
        if self._at < len(self.head):
            n = min(len(target), len(self.head) - self._at)
            target[:n] = self.head[self._at:self._at + n]
            self._at += n
            return n
        return self._rest(target)


def _csv_one_pass(readinto: Callable[[memoryview], int], dialect: _Dialect, declared: dict[str, pa.DataType],
                  block: int, hold: int) -> Iterator[pa.Table] | None:
    """The input's tables from one reading, or None once it holds more than ``hold`` bytes."""
    parse = _CsvOnePass(dialect, declared)
    held: list[tuple[pa.Table, bytes]] = []
    size = 0
    blocks = _records(readinto, _CsvCut(dialect.quote), parse, header=dialect.names is None, block=block)
    try:
        for table, text in blocks:
            size += len(text)
            if size > hold:
                return None
            held.append((table, text))
    finally:
        blocks.close()
    return (parse.conformed(table, text, first=i == 0) for i, (table, text) in enumerate(held))


def _csv_declared(declared: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
    """The type a CSV reader gives each declared column: the declared one where the reader converts
    text to it exactly, text for a zoned timestamp (typed landing reads zone-less text as UTC,
    which the reader refuses) and for a decimal (typed landing converts the text as written and
    names a value the decimal does not hold, which the reader does not), and no declaration for
    nested types (the guess is cast)."""
    direct = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_date,
              pa.types.is_string, pa.types.is_large_string)
    read: dict[str, pa.DataType] = {}
    for name, t in declared.items():
        if any(f(t) for f in direct) or (pa.types.is_timestamp(t) and t.tz is None):
            read[name] = t
        elif _read_as_text(t):
            read[name] = pa.string()
    return read


def _read_as_text(t: pa.DataType) -> bool:
    """Whether a CSV column declared ``t`` is read as text for typed landing to convert."""
    return pa.types.is_decimal(t) or (pa.types.is_timestamp(t) and t.tz is not None)


def _csv_types(readinto: Callable[[memoryview], int], dialect: _Dialect, declared: dict[str, pa.DataType],
               block: int) -> dict[str, pa.DataType]:
    """Every CSV column's type for the whole input: each block's guess, temporal guesses as text,
    merged as the decoder widens (int and float to float64, mixed kinds to text)."""
    schema: pa.Schema | None = None
    wide: set[str] = set()  # columns where an integer beyond ±2**53 arrived: they meet a float as text
    for table in _records(readinto, _CsvCut(dialect.quote), _CsvBlocks(dialect, None, declared, guess=True),
                          header=dialect.names is None, block=block):
        wide |= wide_integer_paths(table)
        guessed = pa.schema([f.with_type(_temporal_as_text(f.type) or f.type) for f in table.schema])
        schema = guessed if schema is None else merged_schema(schema, guessed, wide)
    return {} if schema is None else {f.name: f.type for f in schema if not pa.types.is_null(f.type)}


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


def _parquet_tables(source: pa.NativeFile, batch_rows: int) -> Iterator[pa.Table]:
    try:
        parquet = pq.ParquetFile(source)
    except pa.ArrowInvalid as exc:
        raise _Malformed(f"not a Parquet file: {first_line(exc)}") from exc
    for batch in parquet.iter_batches(batch_size=batch_rows):
        yield pa.Table.from_batches([batch])


# --- blocks of whole records ------------------------------------------------------------------


class _LastNewline:
    """Where the last whole line in ``buffer[start:stop]`` ends (-1: none)."""

    def __call__(self, buffer: bytearray, start: int, stop: int) -> int:
        at = buffer.rfind(b"\n", start, stop)
        return at + 1 if at >= 0 else -1


class _CsvCut:
    """Where the last whole CSV record in ``buffer[start:stop]`` ends: after a newline outside quotes."""

    def __init__(self, quote: str = '"') -> None:
        self._open = False  # inside a quoted field at ``start``
        self._quote = quote.encode()

    def __call__(self, buffer: bytearray, start: int, stop: int) -> int:
        quote = self._quote
        if not quote:  # no quoting: every newline ends a record
            at = buffer.rfind(b"\n", start, stop)
            return at + 1 if at >= 0 else -1
        parity = (self._open + buffer.count(quote, start, stop)) & 1
        end = stop
        # Walks back over newlines inside a quoted field only, so the walk is bounded by one record.
        while (newline := buffer.rfind(b"\n", start, end)) >= 0:
            parity ^= buffer.count(quote, newline, end) & 1
            if not parity:
                self._open = bool(buffer.count(quote, newline + 1, stop) & 1)
                return newline + 1
            end = newline
        self._open = bool(parity)
        return -1


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


# --- JSON ------------------------------------------------------------------------------------------

_KIND_CHANGED = re.compile(r"Column\(/[^)]*\) changed from")


class _JsonBlocks:
    """Parses NDJSON blocks, every JSON string landing as the text it is.

    pyarrow's reader guesses ``timestamp[s]`` for strings that read as ISO-8601 instants or dates,
    and that guess loses the text ("2024-01-01T02:00:05+02:00" becomes 00:00:05 without a zone);
    a later block with other text then casts it back to a different string. JSON has no temporal
    type, so any temporal column came from strings: the block is read again with those paths
    declared as strings. The paths found are kept (``_text``) and declared up front to the blocks
    that follow, so a file of timestamps reads most blocks once; a block whose shapes differ from
    what was kept is read without them.
    """

    def __init__(self) -> None:
        self._text: pa.Schema | None = None
        self._order: _Order = {}
        """Columns and struct fields in the order the input wrote them, as far as fresh readings saw
        it: a reading with declared paths puts those first; its columns are put back in order."""

    def __call__(self, block: memoryview) -> pa.Table:
        known = self._text
        if known is not None:
            try:
                table = _read_json(block, known)
                table.validate(full=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # shapes other than the kept ones, or not JSON at all: read afresh below
            else:
                if _text_schema(table.schema) is None:
                    return _exact(block, table, known)  # the sink conforms it to the order the first block set
        table = _json_table(block)
        _remember(self._order, list(table.schema))
        guessed = _text_schema(table.schema)
        if guessed is None:
            return _exact(block, table, None)
        self._text = guessed if known is None else merged_schema(known, guessed)
        return self._in_order(_exact(block, _json_table(block, guessed), guessed))

    def _in_order(self, table: pa.Table) -> pa.Table:
        """``table``'s columns and struct fields in the input's order (what no fresh reading saw
        stays after what it saw); columnar: a cast by field name."""
        schema = pa.schema(_arranged(list(table.schema), self._order))
        if schema.equals(table.schema):
            return table
        return table.select(schema.names).cast(schema)


_Order = dict[str, tuple[int, "_Order"]]
"""A name's place among its siblings, and the places of its struct's fields (through lists)."""


def _remember(order: _Order, fields: list[pa.Field]) -> None:
    for f in fields:
        _place, inner = order.setdefault(f.name, (len(order), {}))
        if (nested := _struct_fields(f.type)) is not None:
            _remember(inner, nested)


def _struct_fields(t: pa.DataType) -> list[pa.Field] | None:
    if pa.types.is_struct(t):
        return list(t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _struct_fields(t.value_type)
    return None


def _arranged(fields: list[pa.Field], order: _Order) -> list[pa.Field]:
    names = [f.name for f in fields]
    ranked = sorted(fields, key=lambda f: (order[f.name][0] if f.name in order else len(order), names.index(f.name)))
    return [f.with_type(_arranged_type(f.type, order[f.name][1] if f.name in order else {})) for f in ranked]


def _arranged_type(t: pa.DataType, order: _Order) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct(_arranged(list(t), order))
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_arranged_type(t.value_type, order)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_arranged_type(t.value_type, order)))
    return t


def _exact(block: memoryview, table: pa.Table, explicit: pa.Schema | None) -> pa.Table:
    """``table`` with its numbers typed from their literals where the reader may have rounded an
    integer (``engine.land.json_numbers``)."""
    return exact_numbers(block, table, lambda text: _json_table(memoryview(text), explicit))


def _read_json(block: memoryview, explicit: pa.Schema | None) -> pa.Table:
    options = pjson.ReadOptions(use_threads=False, block_size=min(len(block) + 1, _MAX_BLOCK))
    return pjson.read_json(pa.BufferReader(block), read_options=options,
                           parse_options=pjson.ParseOptions(explicit_schema=explicit))


def _temporal_as_text(t: pa.DataType) -> pa.DataType | None:
    """``t`` reduced to its temporal parts, each as a string (None: ``t`` holds none)."""
    if pa.types.is_temporal(t):
        return pa.string()
    if pa.types.is_struct(t):
        fields = [pa.field(f.name, u) for f in t if (u := _temporal_as_text(f.type)) is not None]
        return pa.struct(fields) if fields else None
    if pa.types.is_list(t):
        value = _temporal_as_text(t.value_type)
        return None if value is None else pa.list_(value)
    return None


def _text_schema(schema: pa.Schema) -> pa.Schema | None:
    """The columns and fields of ``schema`` a reader typed temporal, declared as strings."""
    fields = [pa.field(f.name, u) for f in schema if (u := _temporal_as_text(f.type)) is not None]
    return pa.schema(fields) if fields else None


def _json_table(block: memoryview, explicit: pa.Schema | None = None) -> pa.Table:
    """One block of newline-delimited JSON objects as a table.

    Parsed as one pyarrow block on one thread: no line straddles pyarrow's blocks, and inference
    does not hang on thread timing (pyarrow's threaded reader fails a struct promotion now and then:
    "JSON conversion to struct<...> is not supported"). Blocks parse in parallel instead.
    """
    try:
        table = _read_json(block, explicit)
    except pa.ArrowNotImplementedError as exc:
        return _mixed_json_table(block, str(exc))
    except pa.ArrowInvalid as exc:
        if _KIND_CHANGED.search(str(exc)):
            return _mixed_json_table(block, str(exc))
        raise _malformed_json(block, str(exc)) from exc
    try:
        table.validate(full=True)  # pyarrow's JSON reader does not check UTF-8
    except pa.ArrowInvalid as exc:
        raise _malformed_json(block, str(exc)) from exc
    return table


def _mixed_json_table(block: memoryview, message: str) -> pa.Table:
    """A block where a column's values change kind, read with polars' supertype inference."""
    import polars as pl  # only blocks with such a column pay for the import

    try:
        table = pl.read_ndjson(io.BytesIO(block), infer_schema_length=None).to_arrow()
    except Exception as exc:  # polars raises its own error classes
        raise _malformed_json(block, message) from exc
    return table.cast(pa.schema([pa.field(f.name, _small(f.type)) for f in table.schema]))


def _small(t: pa.DataType) -> pa.DataType:
    """The 32-bit-offset type pyarrow's readers give, for a polars (large or view) type."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(_small(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _small(f.type)) for f in (t.field(i) for i in range(t.num_fields))])
    return t


def _malformed_json(block: memoryview, message: str) -> _Malformed:
    """Name the first line of ``block`` that is not one JSON object; pyarrow's row numbers are per
    parser block, so the line is found here. A Python loop over the lines of one failed block."""
    start = 0
    for raw in bytes(block).split(b"\n"):
        text = raw.strip()
        if text:
            offset = start + len(raw) - len(raw.lstrip())
            try:
                value = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys)
            except UnicodeDecodeError as exc:
                return _Malformed(f"not UTF-8 (byte {exc.start + 1} of the record)", offset=offset)
            except json.JSONDecodeError as exc:
                return _Malformed(f"{exc.msg} at column {exc.colno}", offset=offset)
            except _DuplicateKey as exc:
                return _Malformed(f"key {exc.args[0]!r} appears twice in one object", offset=offset)
            if not isinstance(value, dict):
                return _Malformed(f"expected a JSON object, found {type(value).__name__}", offset=offset)
        start += len(raw) + 1
    return _Malformed(message.removeprefix("JSON parse error: "))


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


_MARKS = np.zeros(256, dtype=bool)
_MARKS[[ord(c) for c in "[]{},\n\r\t"]] = True
_DOCUMENT_READ = 4 << 20  # bytes rewritten at a time: numpy's position arrays take several times a read
_OPEN_ARRAY, _CLOSE_ARRAY, _OPEN_OBJECT, _CLOSE_OBJECT, _COMMA = (ord(c) for c in "[]{},")


class _DocumentRows:
    r"""A JSON document (an array of objects, or one object) rewritten as one object per line.

    The rewrite is byte for byte, so positions (and error lines) stay those of the source, and it
    works a read at a time, so memory stays bounded whatever the document's size. Outside strings,
    the commas between the top-level array's elements become newlines and the array's own brackets
    spaces; the document's newlines become tabs and its tabs and carriage returns spaces. Strings
    are found with numpy over the positions of quotes and backslashes.

    >>> source = io.BytesIO(b'[{"a": "x,]"},\n {"a": 2}]')
    >>> target = bytearray(100)
    >>> size = _DocumentRows(source.readinto).readinto(memoryview(target))
    >>> bytes(target[:size])
    b' {"a": "x,]"}\n\t {"a": 2} '
    """

    def __init__(self, readinto: Callable[[memoryview], int]) -> None:
        self._readinto = readinto
        self._in_string = False
        self._slashes = 0  # backslashes ending the previous read
        self._depth = 0
        self._kind = 0  # the top-level value's opening byte, once seen
        self._consumed = 0

    def readinto(self, target: memoryview) -> int:
        size = self._readinto(target[:_DOCUMENT_READ])
        if size:
            self._rewrite(np.frombuffer(target, dtype=np.uint8, count=size))
            self._consumed += size
        elif self._in_string or self._depth:
            raise _Malformed("the document ends inside a " + ("string" if self._in_string else "value"),
                             at=self._consumed)
        return size

    def _rewrite(self, data: np.ndarray) -> None:
        quotes = np.flatnonzero(data == ord('"'))
        slashes = np.flatnonzero(data == ord("\\"))
        if slashes.size or self._slashes:
            quotes = quotes[~self._escaped(quotes, slashes)]
        marks = np.flatnonzero(_MARKS[data])
        marks = marks[((np.searchsorted(quotes, marks) + self._in_string) & 1) == 0]  # outside strings
        byte = data[marks]
        step = (byte == _OPEN_ARRAY).astype(np.int64) + (byte == _OPEN_OBJECT)
        step -= (byte == _CLOSE_ARRAY).astype(np.int64) + (byte == _CLOSE_OBJECT)
        after = self._depth + np.cumsum(step)
        before = after - step
        if after.size and after.min() < 0:
            self._fail(marks[np.argmax(after < 0)], "a closing bracket without its opening one")
        tops = marks[(before == 0) & (step == 1)]
        if tops.size:
            second = tops[0] if self._kind else tops[1] if tops.size > 1 else None
            if second is not None:
                self._fail(second, "more than one top-level value (one object per line is format ndjson)")
            self._kind = int(data[tops[0]])
        strays = marks[(before == 0) & (byte == _COMMA)]
        if strays.size:
            self._fail(strays[0], "a comma outside the top-level value")
        if self._kind == _OPEN_ARRAY:
            data[marks[(byte == _COMMA) & (before == 1)]] = ord("\n")
            data[marks[(step != 0) & (np.minimum(before, after) == 0)]] = ord(" ")
        data[marks[byte == ord("\n")]] = ord("\t")
        data[marks[(byte == ord("\r")) | (byte == ord("\t"))]] = ord(" ")
        self._depth = int(after[-1]) if after.size else self._depth
        self._in_string ^= bool(quotes.size & 1)
        self._slashes = self._trailing_slashes(data.size, slashes)

    def _escaped(self, quotes: np.ndarray, slashes: np.ndarray) -> np.ndarray:
        """Which quotes follow an odd run of backslashes (the run may begin in the previous read)."""
        run = np.zeros(quotes.size, dtype=np.int64)
        if slashes.size:
            starts = np.maximum.accumulate(np.where(np.diff(slashes, prepend=-2) != 1, slashes, 0))
            last = np.searchsorted(slashes, quotes) - 1
            at = np.maximum(last, 0)
            follows = (last >= 0) & (slashes[at] == quotes - 1)
            run = np.where(follows, quotes - starts[at], 0)
            run += np.where(follows & (starts[at] == 0), self._slashes, 0)
        run = np.where(quotes == 0, self._slashes, run)
        return (run & 1) == 1

    def _trailing_slashes(self, size: int, slashes: np.ndarray) -> int:
        if not slashes.size or slashes[-1] != size - 1:
            return 0
        breaks = np.flatnonzero(np.diff(slashes) != 1)
        start = int(slashes[breaks[-1] + 1]) if breaks.size else int(slashes[0])
        return size - start + (self._slashes if start == 0 else 0)

    def _fail(self, position: int, reason: str) -> NoReturn:
        raise _Malformed(reason, at=self._consumed + int(position))


# --- CSV -------------------------------------------------------------------------------------------


class _CsvBlocks:
    """Parses CSV blocks: the first holds the header, later ones reuse its column names.

    Every field of a CSV file is text, so a block must not guess its own types: ``types`` holds the
    whole input's (:func:`_csv_types`), ``None`` reads every column as text, and the ``declared``
    columns (:func:`_csv_declared`) are read as declared; a field the reader takes for null
    ("", "NA", "null", ...) is null in those even where they are read as text. ``guess`` lets
    pyarrow guess (the first reading of :func:`_csv_types`).
    """

    def __init__(self, dialect: _Dialect, types: dict[str, pa.DataType] | None,
                 declared: dict[str, pa.DataType] | None = None, *, guess: bool = False) -> None:
        self._dialect = dialect
        self._names: list[str] | None = dialect.names
        self._read = _csv_declared(declared or {})
        # zoned timestamps and decimals, read as text for typed landing: their null fields are null, not text
        self._as_text = [name for name, t in (declared or {}).items() if _read_as_text(t)]
        if types is None and not guess:
            self._convert = dialect.convert(default_column_type=pa.string(), column_types=self._read)
        else:
            self._convert = self.typed({} if guess else types or {})

    def typed(self, types: dict[str, pa.DataType]) -> pcsv.ConvertOptions:
        """Options reading ``types`` and the declared columns as such, guessing the others."""
        return self._dialect.convert(column_types={**types, **self._read})

    def __call__(self, view: memoryview) -> pa.Table:
        return self.parse(bytes(view), self._convert)  # parsing CSV costs far more than this copy

    def parse(self, block: bytes, convert: pcsv.ConvertOptions) -> pa.Table:
        refused: list[str] = []

        def refuse(row: Any) -> str:
            refused.append(row.text)
            return "error"

        try:
            table = pcsv.read_csv(
                pa.BufferReader(block),
                read_options=pcsv.ReadOptions(column_names=self._names, use_threads=False,
                                              block_size=min(len(block) + 1, _MAX_BLOCK)),
                parse_options=self._dialect.parse_options(block, invalid_row_handler=refuse),
                convert_options=convert)
        except pa.ArrowInvalid as exc:
            raise _Malformed(self._dialect.hint(first_line(exc).removeprefix("CSV parse error: ")),
                             offset=_row_offset(block, refused[0]) if refused else None) from exc
        table = self._exact(block, table, self._names)  # names None: the block holds the header
        if self._names is None:
            self._names = table.column_names
        for name in self._as_text:
            at = table.schema.get_field_index(name)
            if at >= 0:
                column = table.column(at)
                table = table.set_column(at, name, pc.if_else(pc.is_in(column, value_set=self._dialect.null_texts()), None, column))
        return table


    def _exact(self, block: bytes, table: pa.Table, names: list[str] | None) -> pa.Table:
        """``table`` with each undeclared float column where an integer may have been rounded typed
        from its text (``engine.land.json_numbers.literal_type``: int64, decimal(38, 0) or text)."""
        lost = [name for name in lost_columns(table) if name not in self._read]
        if not lost:
            return table
        text = pcsv.read_csv(
            pa.BufferReader(block),
            read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                          block_size=min(len(block) + 1, _MAX_BLOCK)),
            parse_options=self._dialect.parse_options(block),
            convert_options=self._dialect.convert(column_types=dict.fromkeys(lost, pa.string()), include_columns=lost))
        for name in lost:
            at = table.schema.get_field_index(name)
            raw = text.column(name).combine_chunks()
            typed = literal_type(pc.if_else(pc.is_in(raw, value_set=self._dialect.null_texts()), None, raw))
            if pa.types.is_string(typed.type):
                typed = raw  # as a text column reads: "" and "NA" are text
            table = table.set_column(at, pa.field(name, typed.type), typed)
        return table


class _CsvOnePass:
    """Parses CSV blocks for a reading that decides the types as it goes: each block with the types
    the blocks before it showed, ``schema`` the merge of every block's own guess so far (temporal
    guesses as text), which at the input's end is what :func:`_csv_types` decides.

    A column so far int64, float64 or text is read as that: a block that reads so would have guessed
    a type the merge keeps (a block's guess is the first of pyarrow's kinds that reads all its
    values, so int64 reads only values guessed null or int64, float64 only null, int64 or float64),
    and a block that does not (text in a number column) is parsed again, guessing. A column so far
    null or boolean is guessed per block: "0" and "1" read as booleans but guess int64, and int64
    meeting boolean is text. The first block reads with the types guessed on its head
    (``SAMPLE_BYTES``), so a timestamp column is text from the start rather than parsed twice: the
    head's rows are the block's, so the block guesses the head's kind or a later one.
    :meth:`conformed` gives a held table the final types: a column of nulls is cast, and a block a
    later one widened (int64 meeting float64 or text) is parsed again with the input's types.
    """

    def __init__(self, dialect: _Dialect, declared: dict[str, pa.DataType]) -> None:
        self._dialect = dialect
        self._declared = declared
        self._blocks = _CsvBlocks(dialect, None, declared, guess=True)
        self._fixed = set(_csv_declared(declared))
        self._lock = threading.Lock()
        self._wide: set[str] = set()  # columns where an integer beyond ±2**53 arrived (json_numbers)
        self.schema: pa.Schema | None = None

    def __call__(self, view: memoryview) -> tuple[pa.Table, bytes]:
        block = bytes(view)
        with self._lock:
            schema = self.schema
        known = self._known(self._head_schema(block) if schema is None else schema)
        try:
            table = self._blocks.parse(block, self._blocks.typed(known))
        except _Malformed:
            table = self._blocks.parse(block, self._blocks.typed({}))  # malformed indeed, or a type it widens
            known = {}
        guessed = pa.schema([f if f.name in known or f.name in self._fixed
                             else f.with_type(_temporal_as_text(f.type) or f.type) for f in table.schema])
        with self._lock:
            self._wide |= wide_integer_paths(table)
            self.schema = guessed if self.schema is None else merged_schema(self.schema, guessed, self._wide)
        return table, block

    def conformed(self, table: pa.Table, block: bytes, *, first: bool) -> pa.Table:
        """``table`` (of ``block``, the ``first`` holding the header) as the input's types read it."""
        schema = self.schema
        assert schema is not None
        if table.schema.equals(schema):
            return table
        columns = []
        for f in schema:
            column = table.column(f.name)
            if column.type.equals(f.type):
                columns.append(column)
            elif pa.types.is_null(column.type) and not _is_text(f.type):  # text reads "" and "NA" as text
                columns.append(pa.chunked_array([pa.nulls(table.num_rows, f.type)], type=f.type))
            else:
                types = {f.name: f.type for f in schema if not pa.types.is_null(f.type)}
                blocks = _CsvBlocks(self._dialect, None, self._declared) if first else self._blocks
                return blocks.parse(block, blocks.typed(types))
        return pa.Table.from_arrays(columns, schema=schema)

    def _head_schema(self, block: bytes) -> pa.Schema:
        """The types guessed on the block's first records (its header's columns, null without records)."""
        end = _CsvCut(self._dialect.quote)(bytearray(block[:SAMPLE_BYTES]), 0, min(len(block), SAMPLE_BYTES))
        if end < 0:
            return pa.schema([])
        try:
            head = _CsvBlocks(self._dialect, None, self._declared, guess=True).parse(block[:end], self._blocks.typed({}))
        except _Malformed:
            return pa.schema([])  # the block's own parse names it
        return pa.schema([f.with_type(_temporal_as_text(f.type) or f.type) for f in head.schema])

    def _known(self, schema: pa.Schema) -> dict[str, pa.DataType]:
        return {f.name: f.type for f in schema
                if f.name not in self._fixed and (pa.types.is_int64(f.type) or pa.types.is_float64(f.type)
                                                  or pa.types.is_string(f.type))}


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


@functools.cache
def _csv_nulls() -> pa.Array:
    """The texts pyarrow's CSV reader reads as null (built on first use: ``pa.array`` of a list
    imports pandas, 0.3 s of every start otherwise)."""
    return pa.array(pcsv.ConvertOptions().null_values)


def _row_offset(block: bytes, text: str) -> int | None:
    row = text.encode()
    if block.startswith(row):
        return 0
    at = block.find(b"\n" + row)
    return None if at < 0 else at + 1


# --- to the parent ---------------------------------------------------------------------------------


class _Sink:
    """Tables to the parent as IPC segments, widening the schema when a table does not fit it.

    A thread of its own writes, so the next block parses while this one goes out (measured: the
    writes are about 5% of a decode's time); two blocks at most wait for it.
    """

    def __init__(self, fd: int, batch_rows: int) -> None:
        self._file = os.fdopen(fd, "wb", buffering=1 << 20)
        self._out = pa.PythonFile(self._file, mode="w")
        self._batch_rows = batch_rows
        self._widening = Widening()
        self._queue: queue.Queue[tuple[pa.Schema | None, pa.Table] | bytes | None] = queue.Queue(maxsize=2)
        self._told = (-1, False)  # the last progress frame sent: a read that moved nothing sends none
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._write, name="decode-sink", daemon=True)
        self._thread.start()

    def send(self, table: pa.Table) -> None:
        if not table.num_rows:
            return  # a source reporting no rows offers no guessed columns
        before = self._widening.schema
        table = self._widening(table)
        segment = table.schema if before is None or not table.schema.equals(before) else None
        self._put((segment, table))

    def read(self, offset: int, scanning: bool) -> None:
        """A progress frame: the input's bytes read so far, ``scanning`` in a CSV's first reading."""
        if (offset, scanning) != self._told:
            self._told = (offset, scanning)
            self._put(READ + offset.to_bytes(8, "big") + bytes([scanning]))

    def finish(self, trailer: dict[str, Any]) -> None:
        self._put(None)
        self._thread.join()
        if self._failure is not None:
            raise self._failure
        body = json.dumps(trailer).encode()
        self._file.write(TRAILER + len(body).to_bytes(4, "big") + body)
        self._file.flush()  # PythonFile.flush does not reach the Python file

    def _put(self, item: tuple[pa.Schema | None, pa.Table] | bytes | None) -> None:
        while True:
            if self._failure is not None:
                raise self._failure
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _write(self) -> None:
        writer: ipc.RecordBatchStreamWriter | None = None
        schema: pa.Schema | None = None
        try:
            while (item := self._queue.get()) is not None:
                if isinstance(item, bytes):  # progress: between two IPC streams
                    if writer is not None:
                        writer.close()
                        writer = None
                    self._out.write(item)
                    self._file.flush()  # the parent shows it now, not when the pipe buffer fills
                    continue
                segment, table = item
                if segment is not None or writer is None:
                    if writer is not None:
                        writer.close()
                    schema = segment if segment is not None else schema
                    self._out.write(SEGMENT)
                    writer = ipc.new_stream(self._out, schema)
                assert writer is not None
                for batch in table.to_batches(max_chunksize=self._batch_rows):
                    writer.write_batch(batch)
            if writer is not None:
                writer.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the decoding thread at its next send
            self._failure = exc


class Widening:
    """An input's tables conformed to the schema of every table so far (a later table widens it)."""

    def __init__(self) -> None:
        self.schema: pa.Schema | None = None
        self._wide: set[str] = set()  # paths where an integer beyond ±2**53 arrived (json_numbers)

    def __call__(self, table: pa.Table) -> pa.Table:
        self._wide |= wide_integer_paths(table)
        schema = table.schema if self.schema is None else merged_schema(self.schema, table.schema, self._wide)
        self.schema = schema
        return conform(table, schema)

    def batches(self, tables: Iterable[pa.Table]) -> Iterator[pa.RecordBatch]:
        """``tables`` widened, as batches (a table with no rows offers no guessed columns)."""
        for table in tables:
            if table.num_rows:
                yield from self(table).to_batches()


def merged_schema(a: pa.Schema, b: pa.Schema, wide: set[str] | frozenset[str] = frozenset()) -> pa.Schema:
    """The narrowest schema both ``a`` and ``b`` cast to; ``a``'s columns first. ``wide``: the paths
    where an integer beyond ±2**53 arrived, which a float64 would round (they meet a float as text)."""
    if a.equals(b):
        return a
    merged = _merged_type(pa.struct(list(a)), pa.struct(list(b)), wide, "")
    return pa.schema([merged.field(i) for i in range(merged.num_fields)])


def _merged_type(a: pa.DataType, b: pa.DataType, wide: set[str] | frozenset[str], path: str) -> pa.DataType:
    if a.equals(b) or pa.types.is_null(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = {a.field(i).name: a.field(i).type for i in range(a.num_fields)}
        for f in (b.field(i) for i in range(b.num_fields)):
            within = f"{path}.{f.name}" if path else f.name
            fields[f.name] = _merged_type(fields[f.name], f.type, wide, within) if f.name in fields else f.type
        return pa.struct(list(fields.items()))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(_merged_type(a.value_type, b.value_type, wide, f"{path}[]"))
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return pa.int64()
    exact = (pa.types.is_integer, pa.types.is_decimal)  # the JSON decoder's integers (json_numbers)
    if any(f(a) for f in exact) and any(f(b) for f in exact):
        return wide_integer()
    numeric = (pa.types.is_integer, pa.types.is_floating)
    if any(f(a) for f in numeric) and any(f(b) for f in numeric) and path not in wide:
        return pa.float64()
    return pa.string()  # mixed kinds, or an integer float64 would round meeting a float: each as text


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` cast to ``schema`` (a merge of its own): missing columns null, types widened."""
    if table.schema.equals(schema):
        return table
    columns = []
    for f in schema:
        at = table.schema.get_field_index(f.name)
        columns.append(pa.nulls(table.num_rows, f.type) if at < 0 else _conform_column(table.column(at), f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _conform_column(column: pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray:
    if column.type.equals(t):
        return column
    try:
        return column.cast(t, safe=False)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
        # An object or list meeting a string: Arrow has no cast to JSON text. A Python loop over the
        # values of this one column of this one block, which only inputs mixing those kinds pay.
        return pa.chunked_array([pa.array([_as_text(v, t) for v in column.to_pylist()], type=t)], type=t)


def _as_text(value: Any, t: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_string(t):
        if isinstance(value, str):
            return value
        if isinstance(value, bool):
            return "true" if value else "false"
        return json.dumps(value, ensure_ascii=False, default=str) if isinstance(value, (dict, list)) else str(value)
    if pa.types.is_struct(t):
        return {f.name: _as_text(value.get(f.name), f.type) for f in (t.field(i) for i in range(t.num_fields))}
    if pa.types.is_list(t):
        return [_as_text(v, t.value_type) for v in value]
    return value


if __name__ == "__main__":
    preload(pc, pq)  # imported once here: no child pays for them (the rest: _preload_for)

    gc.freeze()  # the preloaded objects: a child's collections skip them, so their pages stay shared
    serve(int(sys.argv[1]))
    sys.stderr.flush()
    os._exit(0)  # nothing left to finalize: the parent waits on this exit, not on an interpreter teardown
