"""Decode one input file to Arrow batches in a bounded child process.

Implements decision "decoder-child-owns": a decoder child owns one input and two bounds.

- ``run.land.parse-deadline``: a decode runs for at most ``deadline_s`` (60 s) from child spawn;
  expiry kills the child's process group and raises :class:`ParseCrashed` naming the deadline.
- ``run.land.parse-memory``: a decoder child gets at most ``memory_bytes`` (512 MiB) of resident
  memory; exceeding it kills the group and fails that input alone under :class:`ParseCrashed`.

A :class:`Decoder` owns a fork server (``engine.land.decode_child``) that imports pyarrow, numpy and
fsspec once; each :meth:`Decoder.decode` forks a fresh child from it that decodes one input and
exits, so many small inputs pay no interpreter start and no parser state carries to another input.
The child streams Arrow IPC through a pipe and :meth:`~Decoder.decode` yields the batches as they
arrive, so the serving process holds about one batch at a time. The server, the child's parent,
enforces the bounds (why a resident-memory watchdog and not an rlimit: see ``decode_child``). The
deadline is wall time from the fork and includes time the child waits on a full pipe, so a consumer
must keep taking batches: a decode is not paused by a slow consumer.

A decode raises, after the batches that came before the failure:
:class:`InputNotFound` (no such file), :class:`InputUnreadable` (unknown format, unreadable
file), :class:`InputMalformed` (a bad JSON line or CSV row with its line number, a damaged gzip or
zstd stream, not Parquet), :class:`ParseCrashed` (a bound, or the child died: exit code or signal).

Schemas ("values land as they arrived", docs/manifest.md): text is never read as a guessed type.
JSON strings stay strings (pyarrow's timestamp guesses are undone by reading the block again);
a CSV input's column types are decided over the whole input by a first reading, and declared
columns (``declared``) are read from their text in their declared type. JSON blocks of about
``block_bytes`` (4 MiB) are otherwise typed on their own and merged into the schema so far: the
batches of one input share a schema unless a later block brings a new column or a wider type;
then the schema widens (int and float to float64 unless an integer beyond 2**53 arrived, then
text; int and decimal(38, 0) to decimal(38, 0); mixed kinds to string; new columns last: the rule
of ``engine.land.json_numbers``, so integers land exactly) and every earlier batch conforms to the
new one (``engine.land.decode_child.conform``: missing columns
null, types cast). A caller that needs one table conforms its batches to the last batch's schema.

Example::

    with Decoder() as decoder:
        for batch in decoder.decode("events.ndjson.gz"):
            ...
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from contextful.engine.land.csv_options import CsvOptions
from contextful.engine.land.decode_wire import (
    READ,
    READ_BYTES,
    SEGMENT,
    TRAILER,
    local_path,
    split_compression,
)
from contextful.storage.errors import (
    ConnectorBoundHit,
    InputMalformed,
    InputNotFound,
    InputUnreadable,
    ParseCrashed,
    RateLimited,
    SourceRequestRefused,
    SourceResponseMalformed,
    SourceUnavailable,
)
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.land.input_landing import LandRequest
    from pyarrow import ipc
else:
    pa = lazy_module("pyarrow")
    ipc = lazy_module("pyarrow.ipc")

DEFAULT_DEADLINE_S = 60.0
DEFAULT_MEMORY_BYTES = 512 * 1024 * 1024
FORMATS = ("ndjson", "json", "csv", "parquet")

_SUFFIXES = {".ndjson": "ndjson", ".jsonl": "ndjson", ".json": "json", ".csv": "csv", ".tsv": "csv",
             ".parquet": "parquet", ".pq": "parquet"}
_ROOT = str(Path(__file__).resolve().parents[2])
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = 1031
_ABANDON_WAIT_S = 10.0
_SERVER_GONE = "the decoder fork server exited"


def detect_format(path: str) -> str:
    """The input's format by its name, a .gz/.zst/.zstd/.bz2 suffix stripped."""
    name, _codec = split_compression(path)
    for suffix, fmt in _SUFFIXES.items():
        if name.endswith(suffix):
            return fmt
    raise InputUnreadable(path, f"cannot tell the format from the name; pass one of {', '.join(FORMATS)}")


class Decoder:
    """Decodes inputs, each in its own child forked from one preloaded server; a context manager."""

    def __init__(self, *, deadline_s: float = DEFAULT_DEADLINE_S, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 batch_rows: int = 131072, block_bytes: int = READ_BYTES) -> None:
        if deadline_s <= 0 or memory_bytes <= 0 or batch_rows <= 0 or block_bytes <= 0:
            raise ValueError("deadline_s, memory_bytes, batch_rows and block_bytes must be positive")
        self.deadline_s = deadline_s
        self.memory_bytes = memory_bytes
        self.batch_rows = batch_rows
        self.block_bytes = block_bytes
        """Bytes read per parser block (tests use a few hundred to put many boundaries in a small input)."""
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._closed = False  # the server starts with the first input (a run with nothing to decode starts none)

    @property
    def server_pid(self) -> int:
        """The fork server's process id: the parent of every decoder child (started if it is not yet)."""
        with self._lock:
            if self._closed:
                raise ValueError("the decoder is closed")
            if self._server is None:
                self._start()
            assert self._server is not None
            return self._server.pid

    def decode(self, path: str, fmt: str | None = None, *, storage_options: dict[str, Any] | None = None,
               declared: Mapping[str, pa.DataType] | None = None,
               window: tuple[int, int] | None = None, csv: CsvOptions | None = None,
               notes: list[str] | None = None,
               on_read: Callable[[int, bool], None] | None = None) -> Iterator[pa.RecordBatch]:
        """The input's rows as Arrow batches, decoded in a fresh child as they are read.

        ``declared`` (a pull's ``types``) reads those CSV columns from their text in the declared
        type (text as text, numbers and dates converted, zoned timestamps as text for typed
        landing), never through a guess; JSON values keep their JSON kind. ``window`` (start, stop)
        reads only those bytes of an uncompressed local file: the bytes a pipeline's cursor has not
        landed, up to the size it listed; a malformed line is named by its line in the file. ``csv`` is a
        CSV input's dialect (``engine.land.csv_options``: delimiter, quote, header, encoding, null texts);
        what the decode decided on its own (a sniffed delimiter) is appended to ``notes`` once the batches
        are read. The child is forked at the first ``next()``. Abandoning the iterator kills the child.

        ``on_read(offset, scanning)`` is called, on the thread taking the batches, as the child
        reads: the input's bytes read so far (as stored: compressed bytes of a compressed input,
        bytes from the window's start), about once per block; ``scanning`` while a large CSV is read
        a first time for its column types (then read again from its start). A Parquet input or a
        FIFO reports nothing.
        """
        request = self._request(path, fmt, storage_options, declared, window, csv, on_read is not None)
        return self._run(request, notes=notes, on_read=on_read)

    def _request(self, path: str, fmt: str | None, storage_options: dict[str, Any] | None,
                 declared: Mapping[str, pa.DataType] | None, window: tuple[int, int] | None,
                 csv: CsvOptions | None, progress: bool) -> dict[str, Any]:
        fmt = fmt or detect_format(path)
        if fmt not in FORMATS:
            raise InputUnreadable(path, f"format {fmt!r} is not one of {', '.join(FORMATS)}")
        if fmt == "parquet" and split_compression(path)[1] is not None:
            raise InputUnreadable(path, "a compressed Parquet file cannot be read in place; decompress it first")
        local = local_path(path)
        if local is not None and not os.path.exists(local):
            raise InputNotFound(path)
        if window is not None and (local is None or split_compression(path)[1] is not None):
            raise ValueError(f"a byte window reads an uncompressed local file, not {path}")
        request = {"path": path, "fmt": fmt, "storage_options": storage_options or {}, "window": window,
                   "deadline_s": self.deadline_s, "memory_bytes": self.memory_bytes, "batch_rows": self.batch_rows,
                   "block_bytes": self.block_bytes, "declared": dict(declared or {}),
                   "csv": (csv or CsvOptions()).to_request(), "progress": progress}
        return request

    def land(self, path: str, land: LandRequest, fmt: str | None = None, *,
             storage_options: dict[str, Any] | None = None, window: tuple[int, int] | None = None,
             csv: CsvOptions | None = None, notes: list[str] | None = None,
             on_read: Callable[[int, bool], None] | None = None, abandon: Abandon | None = None) -> dict[str, Any]:
        """Decode the input and land it, both in a fresh child (``engine.land.input_landing``);
        return what the child staged (its report: per group, each table's arrived schema, the
        guard's counts and the parts it wrote under ``land.run_id``).

        Fails as :meth:`decode` does, and with the landing's own error (a refused type, key or
        schema) raised here by name; a failed input's parts are removed by the child, or (a child
        killed at a bound) left to its lease's end and collection. ``abandon``, called from another
        thread, kills the child: this call then raises :class:`ParseCrashed`.
        """
        request = self._request(path, fmt, storage_options, land.types, window, csv, on_read is not None)
        request["land"] = land
        outcome: dict[str, Any] = {}
        for _ in self._run(request, notes=notes, on_read=on_read, outcome=outcome, abandon=abandon):
            raise ParseCrashed(path, "crash", "a landing child sent rows back")
        return dict(outcome.get("landed") or {"groups": [], "rows": 0})

    def fetch(self, url: str, *, step: str, headers: dict[str, str] | None = None, timeout_s: float = 30.0,
              records: str | None = None, next_key: str | None = None,
              token_key: str | None = None, digests: bool = False) -> PageFetch:
        """One page of a JSON API, fetched and decoded in a fresh connector child.

        The child's deadline and memory bound are the connector's call-deadline and linear-memory
        bounds: striking either raises :class:`ConnectorBoundHit` naming it and ``step``
        (``run.retry.bound-hit-is-transient``). Iterate the result for the page's batches; its
        ``meta`` (status, next URL, next token, and with ``digests`` one content digest per record)
        is set once they are read.
        """
        request = {"kind": "http", "path": url, "url": url, "step": step, "headers": headers or {},
                   "timeout_s": timeout_s, "records": records, "next_key": next_key,
                   "token_key": token_key, "digests": digests, "deadline_s": self.deadline_s,
                   "memory_bytes": self.memory_bytes, "batch_rows": self.batch_rows, "block_bytes": self.block_bytes}
        return PageFetch(self, request)

    def start(self) -> None:
        """Start the fork server now, so its imports overlap what the caller does before its first
        input (it starts with the first input otherwise; a run with nothing to decode starts none)."""
        with self._lock:
            if not self._closed and self._server is None:
                self._start()

    def close(self) -> None:
        """Stop the fork server; it kills any child still running."""
        with self._lock:
            self._closed = True
            self._stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # --- the server ----------------------------------------------------------------------------

    def _start(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1",  # numpy's BLAS threads: none before a fork
                   PYTHONPATH=os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p))
        try:
            self._server = subprocess.Popen(
                [sys.executable, "-m", "contextful.engine.land.decode_child", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        finally:
            theirs.close()
        self._control = mine

    def _stop(self) -> None:
        if self._control is not None:
            self._control.close()  # the server kills its children and exits on this hang-up
            self._control = None
        if self._server is not None:
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server = None

    def _send(self, request: dict[str, Any], fds: list[int]) -> None:
        payload = pickle.dumps(request)
        with self._lock:
            if self._closed:
                raise ValueError("the decoder is closed")
            for attempt in (1, 2):
                if self._server is None or self._server.poll() is not None:
                    self._stop()
                    self._start()  # the server died (killed, out of memory): a new one serves this input
                assert self._control is not None
                try:
                    socket.send_fds(self._control, [payload], fds)
                    return
                except OSError:
                    if attempt == 2:
                        raise
                    self._stop()

    # --- one input -----------------------------------------------------------------------------

    def _run(self, request: dict[str, Any], page: PageFetch | None = None, *, notes: list[str] | None = None,
             on_read: Callable[[int, bool], None] | None = None,
             outcome: dict[str, Any] | None = None, abandon: Abandon | None = None) -> Iterator[pa.RecordBatch]:
        read_fd, write_fd = os.pipe()
        try:
            fcntl.fcntl(read_fd, _F_SETPIPE_SZ, _PIPE_BYTES)  # fewer wake-ups per batch
        except OSError:
            pass
        status, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        source = os.fdopen(read_fd, "rb", buffering=_PIPE_BYTES)
        finished = False
        try:
            try:
                self._send(request, [theirs.fileno(), write_fd])
            finally:
                theirs.close()
                os.close(write_fd)
            if abandon is not None:
                abandon.bind(status)
            hello = _receive(status)
            if hello is None or "pid" not in hello:
                finished = True
                raise ParseCrashed(request["path"], "crash", hello["error"] if hello else _SERVER_GONE)
            try:
                trailer = yield from _frames(pa.PythonFile(source, mode="r"), on_read)
            except (pa.ArrowInvalid, OSError):
                trailer = None  # the stream broke off: the child died mid-batch
            final = _receive(status)
            finished = True
            if page is not None:
                page.meta = (trailer or {}).get("page")
                _raise_for_page(request, hello["pid"], trailer, final, self.deadline_s, self.memory_bytes)
            else:
                self._raise_for(request["path"], hello["pid"], trailer, final)
                if notes is not None:
                    notes.extend((trailer or {}).get("notes", ()))
                if outcome is not None and trailer is not None:
                    outcome.update(trailer)
        finally:
            if not finished:  # abandoned: the server kills the child; wait until its group is gone
                try:
                    status.shutdown(socket.SHUT_WR)
                    status.settimeout(_ABANDON_WAIT_S)
                    _receive(status)
                except OSError:
                    pass
            status.close()
            source.close()

    def _raise_for(self, path: str, pid: int, trailer: dict[str, Any] | None, final: dict[str, Any] | None) -> None:
        if trailer is not None:  # the child finished and said how
            error = trailer.get("error")
            if error is None:
                return
            if error == "malformed":
                raise InputMalformed(path, trailer["line"], trailer["reason"])
            if error == "not-found":
                raise InputNotFound(path)
            if error == "unreadable":
                raise InputUnreadable(path, trailer["reason"])
            if error == "landing":  # the landing child's own refusal, as it raised it
                raise pickle.loads(base64.b64decode(trailer["exception"]))
            raise ParseCrashed(path, "memory" if error == "memory" else "crash", trailer["reason"])
        if final is None:
            raise ParseCrashed(path, "crash", _SERVER_GONE)
        if final["bound"] == "deadline":
            raise ParseCrashed(path, "deadline", f"still running {self.deadline_s:g} s after spawn; "
                                                 f"process group {pid} killed")
        if final["bound"] == "memory":
            raise ParseCrashed(path, "memory", f"resident {_mib(final['rss'])} over the {_mib(self.memory_bytes)} "
                                               f"bound; process group {pid} killed")
        raise ParseCrashed(path, "crash", f"child {pid} {_exit_text(final['status'])} before finishing")


class Abandon:
    """Gives up one input being decoded on another thread: its child is killed (now, or as soon as
    it is forked) and the decode raises :class:`ParseCrashed`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: socket.socket | None = None
        self._called = False

    def bind(self, status: socket.socket) -> None:
        with self._lock:
            self._status = status
            if self._called:
                self._hang_up()

    def __call__(self) -> None:
        with self._lock:
            self._called = True
            if self._status is not None:
                self._hang_up()

    def _hang_up(self) -> None:
        assert self._status is not None
        try:
            self._status.shutdown(socket.SHUT_WR)  # the server kills the child on this hang-up
        except OSError:  # the decode finished and closed it
            pass


class PageFetch:
    """One page being fetched: iterate for its batches; ``meta`` is set after the last one."""

    def __init__(self, decoder: Decoder, request: dict[str, Any]) -> None:
        self.decoder = decoder
        self.request = request
        self.meta: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self.decoder._run(self.request, self)


def _raise_for_page(request: dict[str, Any], pid: int, trailer: dict[str, Any] | None,
                    final: dict[str, Any] | None, deadline_s: float, memory_bytes: int) -> None:
    """The catalogue error for a page that did not arrive: a connector's failures are transient
    where a later attempt may succeed (bounds, 429, 5xx, unreachable) and terminal otherwise."""
    url, step = request["url"], request["step"]
    if trailer is not None:
        error = trailer.get("error")
        if error is None:
            return
        if error == "http":
            status = int(trailer["status"])
            if status == 429:
                raise RateLimited(url, trailer.get("retry_after_s") or 1.0, trailer["reason"])
            if status >= 500 or status == 408:
                raise SourceUnavailable(url, trailer["reason"], status)
            raise SourceRequestRefused(url, status, trailer["reason"])
        if error == "unreachable":
            raise SourceUnavailable(url, trailer["reason"])
        if error == "malformed":
            raise SourceResponseMalformed(url, trailer["reason"])
        if error == "memory":
            raise ConnectorBoundHit(step, "linear-memory", f"{url}: {trailer['reason']}")
        raise ParseCrashed(url, "crash", trailer["reason"])
    if final is None:
        raise ParseCrashed(url, "crash", _SERVER_GONE)
    if final["bound"] == "deadline":
        raise ConnectorBoundHit(step, "call-deadline", f"{url}: still running {deadline_s:g} s after spawn; "
                                                       f"process group {pid} killed")
    if final["bound"] == "memory":
        raise ConnectorBoundHit(step, "linear-memory", f"{url}: resident {_mib(final['rss'])} over the "
                                                       f"{_mib(memory_bytes)} bound; process group {pid} killed")
    raise ParseCrashed(url, "crash", f"child {pid} {_exit_text(final['status'])} before finishing")


def _frames(source: pa.PythonFile, on_read: Callable[[int, bool], None] | None = None,
            ) -> Generator[pa.RecordBatch, None, dict[str, Any] | None]:
    """Batches of the child's IPC segments, then its trailer (None if the pipe ends first);
    progress frames go to ``on_read``."""
    while True:
        tag = source.read(1)
        if tag == SEGMENT:
            yield from ipc.open_stream(source)
        elif tag == READ:
            frame = source.read(9)
            if on_read is not None:
                on_read(int.from_bytes(frame[:8], "big"), bool(frame[8]))
        elif tag == TRAILER:
            size = int.from_bytes(source.read(4), "big")
            trailer: dict[str, Any] = json.loads(source.read(size))
            return trailer
        else:
            return None


def _receive(status: socket.socket) -> dict[str, Any] | None:
    message = status.recv(1 << 16)
    return json.loads(message) if message else None


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"was killed by signal {signal.Signals(number).name}"
        except ValueError:
            return f"was killed by signal {number}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB"
