"""Decoding the next input while this one is guarded and staged.

A files run lands its inputs one after another, and each input's batches are guarded, normalized
and staged in the landing process while its decoder child waits on a full pipe. :class:`DecodeAhead`
starts the next input's decode before that work begins: a thread asks the decoder for the next
input and waits for its first batch, so the child is forked and parsing while the landing process
is still busy with the input before. Nothing is landed ahead: the batches are taken in input
order, and an input's failure (not found, malformed, a crash) is raised where that input is taken,
so it fails that input alone as before. Memory stays bounded: the child ahead holds at most its
pipe and the blocks its parser has in flight (the decoder's per-child memory bound applies).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.land.decode import Abandon

_END = object()


class DecodeAhead:
    """One input's decode, started now in a thread that waits for its first batch."""

    def __init__(self, start: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        self._lock = threading.Lock()
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._first: object = _END
        self._error: BaseException | None = None
        self._abandoned = False
        self._thread = threading.Thread(target=self._begin, args=(start,), name="decode-ahead", daemon=True)
        self._thread.start()

    def _begin(self, start: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        try:
            self._batches = start()
            self._first = next(self._batches, _END)
        except BaseException as exc:  # noqa: BLE001 - raised where the input is taken
            self._error = exc
        with self._lock:
            if self._abandoned:
                self._close_batches()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The input's batches, in order; its decode's failure is raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._batches is not None
        if self._first is not _END:
            first, self._first = self._first, _END
            yield first  # type: ignore[misc]
            yield from self._batches

    def close(self) -> None:
        """Give the input up: its child is killed now, or as soon as its first batch arrives."""
        with self._lock:
            self._abandoned = True
            if not self._thread.is_alive():
                self._close_batches()

    def _close_batches(self) -> None:
        if self._batches is not None and hasattr(self._batches, "close"):
            try:
                self._batches.close()  # type: ignore[union-attr]
            except ValueError:  # still being read by batches(): its reader closes it
                pass


class LandAhead:
    """One input landed by its child (``Decoder.land``), started now on a thread of its own: a
    files run keeps several in flight and takes them in input order (``engine.land.pipeline``)."""

    def __init__(self, land: Callable[[Abandon], dict[str, Any]]) -> None:
        from contextful.engine.land.decode import Abandon

        self._abandon = Abandon()
        self._report: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._land, args=(land,), name="land-ahead", daemon=True)
        self._thread.start()

    def _land(self, land: Callable[[Abandon], dict[str, Any]]) -> None:
        try:
            self._report = land(self._abandon)
        except BaseException as exc:  # noqa: BLE001 - raised where the input is taken
            self._error = exc

    def report(self) -> dict[str, Any]:
        """What the child staged; its failure is raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report

    def close(self) -> dict[str, Any] | None:
        """Give the input up: its child is killed if it still runs; what it staged, if it finished."""
        self._abandon()
        self._thread.join()
        return self._report
