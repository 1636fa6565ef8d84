"""Option values a command refuses before it opens anything: ``ArgumentInvalid`` naming the option.

Click checks an option's type (``--limit abc`` is a usage error); these callbacks check what the
type admits but the option cannot mean (``--retain-seconds -5``, ``--limit 0``), so the mistake is
one catalogue line (``error: ArgumentInvalid: --limit 0: ...``, exit 3) and nothing was touched.
"""

from __future__ import annotations

from collections.abc import Callable

import click


def at_least(minimum: float, unit: str) -> Callable[[click.Context, click.Parameter, float], float]:
    """A click callback refusing a value below ``minimum`` (or NaN) with ArgumentInvalid naming the
    option; an option not given (None) passes."""

    def check(ctx: click.Context, param: click.Parameter, value: float) -> float:
        if value is not None and not value >= minimum:
            from contextful.storage.errors import ArgumentInvalid

            raise ArgumentInvalid(param.opts[0], value, f"give {minimum:g} or more {unit}")
        return value

    return check


def duration_seconds(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """A click callback reading ``90``, ``90s``, ``15m``, ``1h`` or ``2d`` as whole seconds (one or
    more); ArgumentInvalid naming the option else."""
    from contextful.engine.project import duration_seconds as seconds_of

    seconds = seconds_of(value)
    if seconds < 1:
        from contextful.storage.errors import ArgumentInvalid

        raise ArgumentInvalid(param.opts[0], value, "give a duration of one second or more: 90, 90s, 15m, 1h or 2d")
    return seconds
