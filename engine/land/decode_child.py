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
``block_bytes``; a CSV input of up to ``HOLD_BLOCKS`` blocks is held whole and parsed at once, by
``engine.land.decode_csv``) that end at a record boundary (a record longer than that grows its
block, up to the memory bound; the input's last block takes everything left, a last line without its newline
included). Each block is parsed by pyarrow, ``PARSING`` blocks at a time on worker threads while
the next is read, and a writer thread sends the tables on. No text is read as a guessed type
(decision "values land as they arrived"): JSON strings pyarrow types as timestamps are read again
as strings (:class:`_JsonBlocks`); a CSV input's columns take the types of the whole input
(``engine.land.decode_csv``). The input's bytes come from ``engine.land.decode_source``, its
blocks from ``engine.land.decode_blocks``, and blocks' types merge by ``engine.land.decode_schema``.
JSON blocks otherwise type their values on their own: the first non-empty block fixes the stream's
schema; a later block that fits it (missing columns, a null or narrower type) is cast to
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
import ctypes
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
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.json as pjson
from contextful.engine.land.decode_blocks import _MAX_BLOCK, _LastNewline, _records
from contextful.engine.land.decode_csv import _csv_tables
from contextful.engine.land.decode_schema import _temporal_as_text, merged_schema
from contextful.engine.land.decode_source import _line_at, _Malformed, _open, _reader, _Report, _rereadable
from contextful.engine.land.decode_wire import (
    READ,
    READ_BYTES,
    SEGMENT,
    TRAILER,
    local_path,
)
from contextful.engine.land.json_numbers import (
    exact_numbers,
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

WATCH_S = 0.01
"""How often the server checks its children's deadlines and resident memory."""

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


def _parquet_tables(source: pa.NativeFile, batch_rows: int) -> Iterator[pa.Table]:
    try:
        parquet = pq.ParquetFile(source)
    except pa.ArrowInvalid as exc:
        raise _Malformed(f"not a Parquet file: {first_line(exc)}") from exc
    for batch in parquet.iter_batches(batch_size=batch_rows):
        yield pa.Table.from_batches([batch])


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
