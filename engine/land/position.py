"""Incremental positions: a cursor value bound to its field, that skips and repeats nothing.

Decision "incremental-position-bound": a cursor value means nothing without its field.

- ``run.advance.field-rename``: :func:`open_position` compares the stored position's field with the
  pipeline's declared ``incremental`` field and raises :class:`CursorFieldMismatch` on a difference.
  Callers open the position before building any request, so nothing leaves the host.
- ``run.advance.unorderable-position``: clocks are read by ``engine.land.clocks`` (instants as
  instants, never as their text).

The last instant is re-read (the rule "positions that admit strictly after need an explicit
rule"): a source may expose a row stamped exactly at the stored watermark after the run that
stored it (second-resolution clocks, replica lag). So a position keeps, besides the watermark ``W``
(the greatest clock landed), the digest of every row landed at ``W`` (``seen``: one digest per row,
the record's canonical JSON, repeats kept) and ``since``: the greatest clock served below ``W``.
The next walk asks the source from ``since`` — a source answering strictly after it, or from it,
serves all of ``W`` again — and :class:`Admission` admits rows after ``W``, and rows at ``W`` whose
digest the position does not hold (each digest held drops one row, so an identical twin arriving
late still lands once). The cost is one digest per row of the last instant in the cursor.

A position is a JSON object stored as the pipeline's catalog cursor:

``{"kind": "watermark", "field": f, "clock": c, "watermark": W, "seen": [d…], "since": s}``
    a finished walk: the next walk asks from ``s`` and admits rows at or after ``W`` but ``seen``;
``{"kind": "walk", "field": f, "clock": c, "floor": W, "seen": [d…], "since": s, "token": t,
"frontier": F, "frontier_seen": [d…], "below": b}``
    a checkpoint inside a watermark walk: the walk asks from ``s`` and admits from ``W`` as above,
    the next page is ``t``, and the rows committed so far reach ``F`` (``frontier_seen`` the rows
    landed at it, ``b`` the greatest clock served below it).

``clock`` is ``numeric``, ``text`` or ``timestamp``; a timestamp is kept as integer microseconds
since the epoch (UTC), a number or a text as itself. A position written before these rules (no
``seen``) promised every row through ``W``: it admits strictly after ``W`` and asks from ``W``
until the walk passes ``W``; a text position whose values are ISO-8601 stamps opens as a timestamp.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from contextful.engine.land.clocks import instant_us
from contextful.storage.errors import CursorFieldMismatch
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

POSITION_KINDS = ("watermark", "walk")


@dataclass(frozen=True)
class Position:
    field: str | None
    clock: str | None = None
    watermark: Any = None
    """The last instant landed: rows at or after it are new, but those ``seen`` (None: from the start)."""
    seen: tuple[str, ...] | None = None
    """Digests of the rows landed at ``watermark``; None for a position that admits strictly after it."""
    since: Any = None
    """What the next request asks from: a clock below ``watermark`` (None: from the start)."""
    token: Any = None
    """Inside a walk: the next page's token."""
    frontier: Any = None
    """Inside a walk: the greatest clock committed so far."""
    frontier_seen: tuple[str, ...] | None = None
    """Inside a walk: digests of the rows committed at ``frontier`` (None: unknown, an old position)."""
    below: Any = None
    """Inside a walk: the greatest clock served below ``frontier``."""

    @property
    def in_walk(self) -> bool:
        return self.token is not None

    def to_json(self) -> dict[str, Any]:
        seen = sorted(self.seen) if self.seen is not None else None
        if self.token is not None:
            return {"kind": "walk", "field": self.field, "clock": self.clock, "floor": self.watermark,
                    "seen": seen, "since": self.since, "token": self.token, "frontier": self.frontier,
                    "frontier_seen": sorted(self.frontier_seen) if self.frontier_seen is not None else None,
                    "below": self.below}
        value = {"kind": "watermark", "field": self.field, "clock": self.clock, "watermark": self.watermark}
        if seen is not None:
            value.update(seen=seen, since=self.since)
        return value


def open_position(scope: str, stored: dict[str, Any] | None, declared: str | None) -> Position:
    """The stored position of ``scope`` for a pipeline declaring ``incremental = declared``."""
    if stored is None:
        return Position(declared, seen=())
    field = stored.get("field")
    if field != declared:
        raise CursorFieldMismatch(scope, field, declared)
    seen = tuple(stored["seen"]) if stored.get("seen") is not None else None
    if stored.get("kind") == "walk":
        floor = stored.get("floor")
        frontier_seen = stored.get("frontier_seen")
        position = Position(field, stored.get("clock"), floor, seen, stored.get("since", floor), stored.get("token"),
                            stored.get("frontier"), tuple(frontier_seen) if frontier_seen is not None else None,
                            stored.get("below"))
    else:
        watermark = stored.get("watermark")
        position = Position(field, stored.get("clock"), watermark, seen,
                            stored.get("since") if seen is not None else watermark)
    return _as_instants(position)


def _as_instants(position: Position) -> Position:
    """A text position whose clocks are ISO-8601 stamps, as the timestamp position it stands for."""
    if position.clock != "text":
        return position
    clocks = {"watermark": position.watermark, "since": position.since, "frontier": position.frontier,
              "below": position.below}
    read = {name: instant_us(value) if isinstance(value, str) else None for name, value in clocks.items()}
    if any(value is not None and read[name] is None for name, value in clocks.items()):
        return position  # opaque text: compared as text
    return replace(position, clock="timestamp", watermark=read["watermark"], since=read["since"],
                   frontier=read["frontier"], below=read["below"])


def since_text(value: Any, clock: str | None) -> str:
    """A clock as a request parameter: timestamps as ISO-8601 UTC with a ``Z``."""
    if clock == "timestamp":
        stamp = datetime.fromtimestamp(value // 1_000_000, tz=UTC).replace(microsecond=value % 1_000_000)
        text = stamp.strftime("%Y-%m-%dT%H:%M:%S") + (f".{stamp.microsecond:06d}" if stamp.microsecond else "")
        return text + "Z"
    return str(value)


class Admission:
    """One walk's rows against its position: what to admit, and the frontier the walk reaches."""

    def __init__(self, position: Position) -> None:
        self.position = position
        self.floor = position.watermark
        self._unmatched: Counter[str] | None = Counter(position.seen) if position.seen is not None else None
        if position.in_walk:
            self.frontier = position.frontier
            self.at_frontier = list(position.frontier_seen) if position.frontier_seen is not None else None
            self.below = position.below
        else:
            self.frontier = position.watermark
            self.at_frontier = list(position.seen) if position.seen is not None else None
            self.below = position.since

    def admit(self, values: pa.Array | pa.ChunkedArray, digests: list[str]) -> pa.Array:
        """Per row: whether it is new — after the floor, or at it and not landed before."""
        if self.floor is None:
            return pa.array(np.ones(len(values), dtype=bool))
        mask = pc.greater(values, self.floor)
        if self._unmatched is None:
            return mask.combine_chunks() if isinstance(mask, pa.ChunkedArray) else mask
        admitted = np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool).copy()
        # one pass over the rows at the floor instant only: ties at one clock, bounded by the source
        for i in pc.indices_nonzero(pc.equal(values, self.floor)).to_pylist():
            if self._unmatched[digests[i]] > 0:
                self._unmatched[digests[i]] -= 1
            else:
                admitted[i] = True
        return pa.array(admitted)

    def observe(self, values: pa.Array | pa.ChunkedArray, digests: list[str], admitted: pa.Array) -> None:
        """Move the frontier over one page's served clocks (``admitted``: the rows that land)."""
        if len(values) == 0:
            return
        top = pc.max(values).as_py()
        candidates = [self.below]
        if self.frontier is None or top > self.frontier:
            candidates.append(self.frontier)
            self.frontier, self.at_frontier = top, []
        if top == self.frontier and self.at_frontier is not None:
            landing = pc.and_(pc.equal(values, top), admitted)
            self.at_frontier.extend(digests[i] for i in pc.indices_nonzero(landing).to_pylist())
        earlier = pc.filter(values, pc.less(values, self.frontier))
        if len(earlier):
            candidates.append(pc.max(earlier).as_py())
        kept = [c for c in candidates if c is not None and c < self.frontier]
        self.below = max(kept) if kept else None

    def checkpoint(self, token: Any, clock: str | None) -> Position:
        """The position inside the walk asking ``token`` next, with what has been observed so far."""
        return replace(self.position, clock=clock, token=token, frontier=self.frontier,
                       frontier_seen=tuple(self.at_frontier) if self.at_frontier is not None else None,
                       below=self.below)

    def final(self, clock: str | None) -> Position:
        """The position after the walk: its frontier is the next walk's floor."""
        field = self.position.field
        if self.frontier is None:
            return Position(field, clock, seen=())
        if self.at_frontier is None:  # an old position whose floor the walk did not pass
            return Position(field, clock, self.frontier, None, self.frontier)
        return Position(field, clock, self.frontier, tuple(self.at_frontier), self.below)
