"""Snapshot retention's rule, free of pyiceberg: which snapshots of an export table expire.

``iceberg.expire`` applies it to a table's metadata; ``contextful export run`` applies it to the
snapshots its state file recorded, so a run whose source did not change learns that nothing
expires without loading pyiceberg (issue 28: short work is quick).

    >>> from datetime import datetime, timedelta, UTC
    >>> now = datetime(2026, 1, 2, tzinfo=UTC)
    >>> day_ms = 86_400_000
    >>> snaps = [(1, now.timestamp() * 1000 - 3 * day_ms), (2, now.timestamp() * 1000 - day_ms), (3, now.timestamp() * 1000)]
    >>> past_retention_ids(snaps, {3}, Retention(keep_snapshots=2), now)
    [1]
    >>> past_retention_ids(snaps, {3}, Retention(keep_snapshots=10, max_snapshot_age=timedelta(hours=1)), now)
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Retention:
    """How many and how old snapshots of an export table stay readable."""

    keep_snapshots: int = 10
    """At most this many snapshots stay: the newest, in commit order (at least 1)."""
    max_snapshot_age: timedelta | None = None
    """Snapshots older than this expire even within ``keep_snapshots``; None: no age limit."""

    def __post_init__(self) -> None:
        if self.keep_snapshots < 1:
            raise ValueError(f"keep_snapshots must be at least 1, not {self.keep_snapshots}")


def past_retention_ids(snapshots: Sequence[tuple[int, float]], protected: Iterable[int], retention: Retention,
                       now: datetime) -> list[int]:
    """The ids ``retention`` expires among ``snapshots`` (``(snapshot_id, timestamp_ms)`` in commit
    order), oldest first; never one in ``protected`` (what a branch or tag points at)."""
    held = set(protected)
    kept = {sid for sid, _ in snapshots[-retention.keep_snapshots:]}
    oldest_ms = (now - retention.max_snapshot_age).timestamp() * 1000 if retention.max_snapshot_age else None
    return [sid for sid, ts in snapshots if sid not in held
            and (sid not in kept or (oldest_ms is not None and ts < oldest_ms))]
