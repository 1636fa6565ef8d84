"""How a gateway answer is written: JSON or an Arrow IPC stream, in chunks, bounded in bytes.

An :class:`AnswerWriter` turns a :class:`~engine.export.query.QueryStream` into body chunks as the
engine produces batches — never the whole answer built first — and stops before the body would
pass ``max_bytes``. Every answer ends with a trailer saying whether rows were left out and why:

- JSON: ``{"table", "template", "caller_sql", "snapshots", "columns", "rows": [...], "row_count",
  "truncated", "truncated_by"}`` — ``truncated_by`` is ``null``, ``"max_rows"``, ``"max_bytes"`` or
  ``"error"`` (then ``"error"`` and ``"error_id"`` name the failure), the keys after ``rows`` come
  last so a stream cut short still closes as valid JSON;
- Arrow: the schema (``contextful.snapshots`` in its metadata), the batches, then one empty batch
  whose custom metadata holds ``contextful.truncated``, ``contextful.truncated_by``,
  ``contextful.row_count`` (and ``contextful.error``/``contextful.error_id`` after a failure).

:attr:`AnswerWriter.cut` says why the answer stopped; the HTTP route decides from it whether an
answer it has not started sending is a 413 instead (``engine.export.gateway``).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from contextful.engine.export.query import QueryStream

TRAILER_RESERVE = 8192
"""Bytes kept back from ``max_bytes`` for the trailer (and the Arrow writer's framing)."""
ARROW_SLICE_BYTES = 1 << 16
"""About how many bytes one Arrow record batch message carries, so the bound cuts finely."""


class AnswerWriter:
    """Writes one answer in chunks of at most ``max_bytes`` in all; subclasses give the format."""

    content_type = ""

    def __init__(self, head: dict[str, Any], stream: QueryStream, max_bytes: int) -> None:
        self.head = head
        self.stream = stream
        self.max_bytes = max_bytes
        self.sent = 0
        self.rows = 0
        self.cut: str | None = None
        """Why the answer stopped early: ``max_rows``, ``max_bytes``, ``error``; None when whole."""

    def chunks(self) -> Iterator[bytes]:
        """The body up to its trailer, pulling batches from the engine as it goes."""
        yield self._spend(self._open())
        for batch in self.stream.batches:  # bounded by max_rows (the stream) and max_bytes (here)
            for piece, rows in self._pieces(batch):
                if piece is None or self.sent + len(piece) + TRAILER_RESERVE > self.max_bytes:
                    self.cut = "max_bytes"
                    yield self.trailer()
                    return
                self.rows += rows
                yield self._spend(piece)
        if self.stream.truncated:
            self.cut = "max_rows"
        yield self.trailer()

    def trailer(self, error: str | None = None, error_id: str | None = None) -> bytes:
        """The closing chunk; after a failure, naming the error and its id."""
        if error is not None:
            self.cut = "error"
        return self._close(error, error_id)

    def _spend(self, chunk: bytes) -> bytes:
        self.sent += len(chunk)
        return chunk

    def _open(self) -> bytes:
        raise NotImplementedError

    def _pieces(self, batch: pa.RecordBatch) -> Iterator[tuple[bytes | None, int]]:
        """Encoded pieces of ``batch`` and the rows each carries; None for one that would not fit."""
        raise NotImplementedError

    def _close(self, error: str | None, error_id: str | None) -> bytes:
        raise NotImplementedError


class JsonAnswer(AnswerWriter):
    content_type = "application/json"

    def _open(self) -> bytes:
        columns = [{"name": f.name, "type": str(f.type)} for f in self.stream.schema]
        head = json.dumps({**self.head, "snapshots": self.stream.snapshots, "columns": columns})
        return (head[:-1] + ', "rows": [').encode()

    def _pieces(self, batch: pa.RecordBatch) -> Iterator[tuple[bytes | None, int]]:
        first = self.rows == 0
        # One piece per row so the byte bound cuts between rows; bounded by the stream's max_rows.
        for row in zip(*(column.to_pylist() for column in batch.columns)):
            text = json.dumps(list(row), default=json_value)
            yield (text if first else "," + text).encode(), 1
            first = False

    def _close(self, error: str | None, error_id: str | None) -> bytes:
        tail: dict[str, Any] = {"row_count": self.rows, "truncated": self.cut is not None, "truncated_by": self.cut}
        if error is not None:
            tail.update(error=error, error_id=error_id)
        return ("], " + json.dumps(tail)[1:]).encode()


class ArrowAnswer(AnswerWriter):
    content_type = "application/vnd.apache.arrow.stream"

    def __init__(self, head: dict[str, Any], stream: QueryStream, max_bytes: int) -> None:
        super().__init__(head, stream, max_bytes)
        self._sink = _Sink()
        schema = stream.schema.with_metadata({**(stream.schema.metadata or {}),
                                              "contextful.snapshots": json.dumps(stream.snapshots)})
        self._writer = pa.ipc.new_stream(pa.PythonFile(self._sink, mode="w"), schema)
        self._unwritten_schema = schema.serialize().size
        """The schema message's size until the writer emits it, with the first batch."""

    def _open(self) -> bytes:
        return self._sink.take()

    def _pieces(self, batch: pa.RecordBatch) -> Iterator[tuple[bytes | None, int]]:
        step = max(1, batch.num_rows * ARROW_SLICE_BYTES // max(batch.nbytes, 1))
        for start in range(0, batch.num_rows, step):  # bounded: a batch holds at most max_rows rows
            piece = batch.slice(start, step)
            if self.sent + self._unwritten_schema + piece.serialize().size + TRAILER_RESERVE > self.max_bytes:
                yield None, 0  # decided before the writer writes it: the stream stays whole
                return
            self._writer.write_batch(piece)
            self._unwritten_schema = 0
            yield self._sink.take(), piece.num_rows

    def _close(self, error: str | None, error_id: str | None) -> bytes:
        meta = {"contextful.truncated": json.dumps(self.cut is not None), "contextful.truncated_by": self.cut or "",
                "contextful.row_count": str(self.rows)}
        if error is not None:
            meta.update({"contextful.error": error, "contextful.error_id": error_id or ""})
        empty = pa.record_batch([pa.array([], f.type) for f in self.stream.schema], schema=self.stream.schema)
        self._writer.write_batch(empty, custom_metadata=meta)
        self._writer.close()
        return self._sink.take()


class _Sink:
    """A write-only file the Arrow writer writes into; :meth:`take` hands over what it wrote."""

    closed = False

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def json_value(value: Any) -> Any:
    """A cell JSON has no type for: decimals as numbers, times in ISO 8601, bytes in base64."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)
