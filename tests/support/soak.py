"""Short and long forms of soak tests: CI runs the short form, ``CONTEXTFUL_SOAK=1`` the long one.

A soak's trial count is a sample of the same property, so the short form proves the same thing
with less confidence; run the long form before trusting a change to the code it exercises:

    CONTEXTFUL_SOAK=1 python -m pytest -m slow
"""

from __future__ import annotations

import os


def soak_long() -> bool:
    """Whether this run asked for the long form of every soak."""
    return os.environ.get("CONTEXTFUL_SOAK", "") not in ("", "0")


def trials(short: int, long: int) -> int:
    """``long`` under ``CONTEXTFUL_SOAK=1``, else ``short``."""
    return long if soak_long() else short
