"""Imported at start-up by every Python process whose ``PYTHONPATH`` holds this directory (site's
``sitecustomize`` hook): with ``CONTEXTFUL_TEST_CLOCK_SHIFT_S`` set, the process's wall clock
(``time.time``, ``time.time_ns``, what the engine's ``SystemClock`` reads) runs that many seconds
ahead. A test runs a CLI process a lease's length in the future instead of sleeping through it:
the injected clock of a process the test does not construct."""

import os
import time

_shift = os.environ.get("CONTEXTFUL_TEST_CLOCK_SHIFT_S")
if _shift:
    _time, _time_ns, _shift_ns = time.time, time.time_ns, int(float(_shift) * 1_000_000_000)
    time.time = lambda: _time() + _shift_ns / 1_000_000_000
    time.time_ns = lambda: _time_ns() + _shift_ns
