"""Cursors: a position lands with its rows and resolves through the commit that landed it.

Decision "incremental-position-bound":

- ``store.merge.cursor-recency``: a cursor's value is the one its table's commit log holds — the
  head's, or at a snapshot the newest commit at or before it that set the scope. Nothing resolves a
  cursor by when it was written: a write whose commit lost carries a later time and must not win,
  so asking for last-write resolution raises :class:`SyncCursorConflict`.
- ``store.lease.cursor-kind``: scopes under ``cursors/`` hold cursors that take a lease (a queue
  consumer's offset, whose holder must renew it); a position kind (``files``, ``watermark``,
  ``walk``, ``seed``), which commits with its rows and takes no lease, reaching ``cursors/`` raises
  :class:`LeaseCursorKindMismatch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextful.storage.errors import LeaseCursorKindMismatch, SyncCursorConflict

if TYPE_CHECKING:
    from contextful.storage.table import Table

LEASED_PREFIX = "cursors/"
LEASED_KINDS = ("queue",)
"""Cursor kinds that take a lease: ``queue`` (a consumer's offset into a shared queue)."""
POSITION_KINDS = ("files", "watermark", "walk", "seed")
"""Cursor kinds that commit with their rows and take no lease."""
RESOLUTIONS = ("commit",)


def check_cursor(scope: str, value: Any) -> None:
    """Refuse a cursor whose kind takes no lease under ``cursors/``."""
    if not scope.startswith(LEASED_PREFIX):
        return
    kind = value.get("kind") if isinstance(value, dict) else None
    if kind not in LEASED_KINDS:
        raise LeaseCursorKindMismatch(scope, str(kind), LEASED_KINDS)


def resolve_cursor(table: Table, scope: str, *, commit_seq: int | None = None,
                   by: str = "commit") -> tuple[Any, int] | None:
    """The value of ``scope`` and the commit that landed it, at the head or at ``commit_seq``."""
    if by not in RESOLUTIONS:
        raise SyncCursorConflict(table.name, scope, f"resolving by {by!r} could pick a write whose commit lost; "
                                                    "a cursor resolves through its commit")
    if commit_seq is None:
        return table.cursor(scope)
    for row in sorted(table.commits(), key=lambda r: r.commit_seq, reverse=True):
        if row.commit_seq > commit_seq or row.manifest is None:
            continue
        cursor = table.manifest(row.run_id).cursor
        if cursor is not None and cursor.get("scope") == scope:
            return cursor["value"], row.commit_seq
    return None
