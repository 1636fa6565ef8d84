"""The secret guard: mask credentials in landed data before anything is staged.

Implements decision ``secret-guard-has`` ("The secret guard has one host-owned catalogue"):

- ``run.guard-secrets.matchers``: matchers are linear-time, regex-free forward scans, each
  anchored on a literal prefix; the catalogue lives in code (``engine.guard.catalogue``) under a
  precision and recall fixture test (``tests/engine/guard/test_precision_recall.py``).
- ``run.guard-secrets.llm-candidate``: an LLM candidate starts with ``sk-`` at input start or after
  a byte outside ASCII alphanumerics, ``-`` and ``_``; its tail spans that alphabet; admission
  masks the whole candidate.
- ``run.guard-secrets.llm-admission``: a candidate needs 32 bytes of tail; a ``proj-``,
  ``svcacct-``, ``service-``, ``admin-`` or ``ant-`` prefix permits the whole tail, otherwise its
  first 32 bytes are ASCII alphanumerics.
- ``run.guard-secrets.mask-only``: the guard is on by default and blocks no run; each pull logs
  the count of masked cells per column (``log_masked``).

A masked span becomes ``[masked:<family>]`` (``aws-access-key-id``, ``llm-api-key``, ... — the
names in ``FAMILIES``); the rest of the cell stays. ``guard_table``/``guard_batch`` scan every string
and binary cell at any nesting depth, and every column, struct field, list/map field name and map
key (``engine.guard.arrow``, ``engine.guard.names``: a masked name keeps a digest suffix so names
stay distinct), and credentials written behind JSON or URL escapes (``engine.guard.escapes``);
``mask_message`` masks an error message or a log line.

    >>> import pyarrow as pa
    >>> result = guard_table(pa.table({"note": ["key " + "AKIA" + "Q" * 16, "none"]}))
    >>> result.masked
    {'note': 1}
    >>> log_masked("gh", "pull-7", result.masked)  # INFO on engine.guard:
    ... # pipeline gh pull pull-7: masked 1 cell(s) in column note
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from importlib import import_module
from typing import TYPE_CHECKING, Any

from contextful.engine.guard.catalogue import FAMILIES, Family, Finding, mask_text, scan_text
from contextful.engine.guard.escapes import mask_all, mask_message
from contextful.engine.guard.names import mask_name

if TYPE_CHECKING:
    from contextful.engine.guard.arrow import BatchGuardResult, GuardResult, guard_batch, guard_table
    from contextful.storage.run_record import RunFailure

_ARROW = ("BatchGuardResult", "GuardResult", "guard_batch", "guard_table")
"""The Arrow half, loaded on first use: masking a message (validate, an error line) needs no Arrow."""


def __getattr__(name: str) -> Any:
    if name not in _ARROW:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module("contextful.engine.guard.arrow"), name)
    globals()[name] = value
    return value

__all__ = [
    "FAMILIES",
    "BatchGuardResult",
    "Family",
    "Finding",
    "GuardResult",
    "guard_batch",
    "guard_table",
    "log_masked",
    "mask_all",
    "mask_message",
    "mask_name",
    "mask_text",
    "masked_failure",
    "scan_text",
]

logger = logging.getLogger(__name__)


def masked_failure(exc: BaseException) -> RunFailure | None:
    """What a run given up on ``exc`` records as its fail row: the error's name, its message masked.

    None for :class:`CommitOutcomeUnknown`: the run may have landed, so it is not recorded as failed
    (an outcome that cannot be classified is not a failure).
    """
    from contextful.storage.errors import CommitOutcomeUnknown
    from contextful.storage.run_record import RunFailure

    return None if isinstance(exc, CommitOutcomeUnknown) else RunFailure.of(exc, mask_message)


def log_masked(pipeline: str, pull_label: str, masked: Mapping[str, int], renamed: Sequence[str] = ()) -> None:
    """Log one pull's masked-cell counts at INFO: a line per column, or one line saying none; and a
    line per column or field whose name was masked (named by its masked path)."""
    if not masked:
        logger.info("pipeline %s pull %s: masked 0 cell(s)", pipeline, pull_label)
    for path, cells in masked.items():
        logger.info("pipeline %s pull %s: masked %d cell(s) in column %s", pipeline, pull_label, cells, path)
    for path in renamed:
        logger.info("pipeline %s pull %s: masked a credential in the name of column %s", pipeline, pull_label, path)
