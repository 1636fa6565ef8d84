"""What one fire of a job receives and what it answers: the seam every kind's runner shares.

A runner is ``Callable[[JobContext], JobOutcome]``. It reads its declaration from
``context.job`` and every other declaration (pipelines, models, externals, the applied table
contracts) from ``context.manifest``, the applied version the fire is pinned to, never from the
working ``contextful.toml`` (``surface.fire.applied-data-contract``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.store import Store


@dataclass(frozen=True)
class JobContext:
    """One fire: the job, the version it reads, the store it works in."""

    job: JobSpec
    manifest: Manifest
    """The applied version the fire reads (``manifest.applied`` holds its snapshot metadata)."""
    version: int
    """That version's number."""
    store: Store
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when the fire should stop at its next boundary (serve stopping, Ctrl-C)."""
    say: Callable[[str], None] = lambda _line: None
    """Progress lines for the person or log watching the fire."""
    force: bool = False
    """``job fire --force``: do the work even where the kind finds nothing to do (a build of models
    that are not stale publishes them anyway)."""


@dataclass(frozen=True)
class JobOutcome:
    """What one fire did: ``job history`` and serve's answer read it."""

    ok: bool
    summary: str
    """One line: what it did, or why nothing was to do."""
    rows: int = 0
    """Rows the fire committed (0 when it committed nothing)."""
    failures: tuple[str, ...] = ()
    """One line per failure, each naming its error."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Kind-specific facts for ``--json`` (models published, parts folded, items settled, ...)."""

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "rows": self.rows, "failures": list(self.failures),
                "detail": self.detail}


Runner = Callable[[JobContext], JobOutcome]
"""A kind's runner."""
