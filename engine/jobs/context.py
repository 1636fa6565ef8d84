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
    from contextful.engine.run.execution import Execution
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
    execution: Execution | None = None
    """The fire's execution under ``job:<name>``, opened (or resumed) by ``engine.jobs.fire``
    pinned to the kind's :class:`Opening`; the runner records its steps there and never closes it:
    its outcome says how the execution ends."""

    @property
    def opened(self) -> Execution:
        """:attr:`execution`, which a runner is always called with."""
        assert self.execution is not None, "a runner runs inside a fire's execution (engine.jobs.fire)"
        return self.execution


@dataclass(frozen=True)
class Opening:
    """What a fire's execution is pinned to: a kind that resumes pins its own structure."""

    reference: str
    """The content-hashed plan reference (``engine.run.execution.plan_reference``)."""
    pins: dict[str, str] | None = None
    """Host-supplied identities the execution pins beside it (a body's code, its input)."""
    resumes: bool = False
    """Whether a pending execution a stopped or dead fire left is resumed (store-driven and plan
    jobs: settled items and finished stages are not redone); otherwise it is recorded failed,
    interrupted, and a new one opens."""


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
    pending: bool = False
    """The fire stopped with work left: its execution stays pending for the next fire to resume."""
    canceled: bool = False
    """The fire's execution was canceled (``contextful run cancel``)."""

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "rows": self.rows, "failures": list(self.failures),
                "detail": self.detail}


Runner = Callable[[JobContext], JobOutcome]
"""A kind's runner."""

Opener = Callable[[JobContext], Opening]
"""A kind's opening: read before the execution opens (a refusal raised here opens nothing)."""
