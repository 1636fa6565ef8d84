"""One progress display for the CLI's long work: landing inputs, folding a table, writing an answer.

On a terminal's stderr a live line, rewritten in place (carriage return) at most ``LIVE_EVERY_S``
apart; the newest state is shown when the work ends. Not on a terminal (a log, a pipe), plain lines
at a coarse cadence: work of known size (``done``, a fraction) a line at each further tenth of it,
work of unknown size a line at most every ``PLAIN_EVERY_S``; a report that closes a unit of the
work (``closes``: an input landed) is always a line; the newest state is printed when the work ends
if its line was skipped. Under ``--json`` a reporter is off and writes nothing (docs/cli.md).

Example::

    with Reporter(enabled=not ctx.obj["json"]) as report:
        for done, item in enumerate(items):
            ...
            report.show(f"{done + 1}/{len(items)} items", done=(done + 1) / len(items))
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self, TextIO

LIVE_EVERY_S = 0.2
"""A terminal's live line is rewritten at most five times a second."""
PLAIN_EVERY_S = 10.0
"""Not on a terminal, work of unknown size prints a line at most every ten seconds."""
PLAIN_STEPS = 10
"""Not on a terminal, work of known size prints a line at each tenth of it."""


class Reporter:
    """Progress of one command's work on ``stream`` (stderr); thread-safe (a decode ahead reports
    from its own thread). ``clock``: seconds on a monotonic scale (tests pass their own)."""

    def __init__(self, enabled: bool = True, *, stream: TextIO | None = None, live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = enabled
        self._stream = stream if stream is not None else sys.stderr
        self.live = self._stream.isatty() if live is None else live
        self._clock = clock
        self._lock = threading.Lock()
        self._shown_at: float | None = None
        self._step = 0  # tenths of known-size work printed so far (plain lines)
        self._pending: str | None = None  # the newest state, when its line was skipped
        self._width = 0  # of the live line now on the terminal

    def show(self, text: str, *, done: float | None = None, closes: bool = False) -> None:
        """Report ``text``: the work is ``done`` (a fraction, None: of unknown size) and, with
        ``closes``, a unit of it (an input) just ended."""
        if not self.enabled:
            return
        with self._lock:
            now = self._clock()
            if self.live:
                due = self._shown_at is None or now - self._shown_at >= LIVE_EVERY_S
            elif done is not None:
                step = int(min(max(done, 0.0), 1.0) * PLAIN_STEPS)
                due = closes or step > self._step
                self._step = max(self._step, step) if due else self._step
            else:
                due = closes or self._shown_at is None or now - self._shown_at >= PLAIN_EVERY_S
            if due:
                self._write(text)
                self._shown_at = now
            else:
                self._pending = text

    def end(self) -> None:
        """The work ended: its newest state shown, and a terminal's live line closed."""
        if not self.enabled:
            return
        with self._lock:
            if self._pending is not None:
                self._write(self._pending)
            if self.live and self._width:
                self._stream.write("\n")
                self._stream.flush()
            self._width = 0

    def _write(self, text: str) -> None:
        self._pending = None
        if self.live:
            self._stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.end()
