"""Sweeps: one job over several origins, every origin reading one frozen transaction time.

Implements decision ``sweep-freezes-transaction`` ("A sweep freezes one transaction-time bound and
carries state through its own outputs"): availability time separates origins, transaction time
fixes the corpus.

- ``run.sweep.frozen-as-of``: every origin of one sweep reads at one ``as_of`` — the job's
  declared ``as_of``, else the instant the sweep opens — recorded once, as a journal step of the
  sweep's execution when it opens (:data:`AS_OF_STEP`), so a resumed execution reads the same instant.
  The instant the sweep opens is read from the catalog's transaction time, not the host's clock
  (``Catalog.reserve_instant``): no earlier than any commit that landed before it, and every commit
  landing after it is stamped after it, however far apart the hosts' clocks are.
- ``run.sweep.fresh-state`` (the default): every table an origin reads, its output tables
  included, resolves at the sweep's ``as_of``: no origin reads a row another origin wrote.
- ``run.sweep.carried-state``: origins run in ascending order one at a time; each reads the job's
  output tables at the commit of the preceding origin (the newest commit an earlier origin made
  to that table; the sweep's ``as_of`` while none did) and every other table at the sweep's
  ``as_of``. Each origin's output commits are a journal step of their own, so a resumed sweep
  replays the landed origins (their bodies are not called again) and carries the same state on;
  reading an origin before the one preceding it landed is :class:`SweepOriginOutOfOrder`.
  An origin's body records no step of the sweep's execution itself (its own work journals under
  its own scope), so the sweep's steps replay in the order they were recorded.

An output table with no commit at the resolved point reads empty in its current schema (a job's
first sweep reads its outputs as nothing yet); any other table with no commit by ``as_of`` raises
``SnapshotNotFound`` when read, as the read path's views do (``engine.read``).

The manifest's job block (with the control plane) declares ``sweep = { state = "fresh" |
"carried" }`` beside the job's ``as_of``; :meth:`SweepSpec.from_config` validates it.

    >>> import tempfile
    >>> import pyarrow as pa
    >>> from contextful.engine.run.execution import open_execution, plan_reference
    >>> from contextful.storage import Store
    >>> from contextful.storage.clock import ManualClock
    >>> store = Store.open(tempfile.mkdtemp(), clock=ManualClock())
    >>> _ = store.append("scores", pa.table({"origin": [0], "seen": [0]}))   # an earlier sweep's output
    >>> store.clock.advance(1)
    >>> execution = open_execution(store.journal, "sweep/score", plan_reference({"job": "score"}),
    ...                            clock=store.clock)
    >>> sweep = open_sweep(execution, store, SweepSpec(state="carried"), outputs=["scores"], origins=[2, 1])
    >>> def body(origin, con):
    ...     seen = con.execute("SELECT count(*) FROM scores").fetchone()[0]
    ...     return [store.append("scores", pa.table({"origin": [origin], "seen": [seen]}))]
    >>> sorted(sweep.run(body))
    [1, 2]
    >>> [(r["origin"], r["seen"]) for r in store.table("scores").to_arrow().to_pylist()]
    [(0, 0), (1, 1), (2, 2)]
    >>> execution.close(ok=True); store.close()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from contextful.storage.clock import from_us, to_us
from contextful.storage.errors import (
    ArgumentInvalid,
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    SnapshotNotFound,
    SweepOriginOutOfOrder,
)

if TYPE_CHECKING:
    import duckdb
    from contextful.engine.run.execution import Execution
    from contextful.storage.store import Store
    from contextful.storage.table import Table
    from contextful.storage.transaction import CommitResult

FRESH, CARRIED = "fresh", "carried"
STATES = (FRESH, CARRIED)
CONFIG_KEYS = ("state",)
AS_OF_STEP = "sweep open-as-of"
"""The journal step recording the sweep's ``as_of`` (the first step of the sweep's execution)."""

Origin = Any
"""An origin: any value the sweep orders ascending (an availability instant, a day, a number)."""


@dataclass(frozen=True)
class SweepSpec:
    """How a job sweeps: ``state`` (``fresh``, the default, or ``carried``) and the job's declared
    ``as_of`` (None: the instant the sweep opens). An unknown state or an ``as_of`` that is no
    instant raises ``ManifestInvalid`` naming the block."""

    state: str = FRESH
    as_of: datetime | str | None = None

    def __post_init__(self) -> None:
        problems = _problems("sweep", self.state, self.as_of)
        if problems:
            raise ManifestInvalid("sweep", problems)
        if isinstance(self.as_of, str):
            object.__setattr__(self, "as_of", _instant(self.as_of))

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None, *, as_of: datetime | str | None = None,
                    where: str = "job") -> SweepSpec:
        """The spec of a job block's ``sweep = {state = ...}`` (None: the defaults) and its ``as_of``;
        ``ManifestInvalid`` listing every problem, each under ``where`` (the job's block)."""
        config = config or {}
        problems: list[ContextfulError] = [ManifestKeyUnknown(f"{where}.sweep", key, CONFIG_KEYS)
                                           for key in config if key not in CONFIG_KEYS]
        state = config.get("state", FRESH)
        problems += _problems(where, state, as_of)
        if problems:
            raise ManifestInvalid(where, problems)
        return cls(state, as_of)

    @property
    def as_of_us(self) -> int | None:
        return to_us(self.as_of) if isinstance(self.as_of, datetime) else None


def _problems(where: str, state: object, as_of: object) -> list[ContextfulError]:
    problems: list[ContextfulError] = []
    if state not in STATES:
        problems.append(ManifestValueInvalid(f"{where}.sweep", "state", f"must be one of {', '.join(STATES)}, "
                                                                         f"not {state!r}"))
    if as_of is not None and not isinstance(as_of, datetime):
        try:
            _instant(as_of)
        except ArgumentInvalid as exc:
            problems.append(ManifestValueInvalid(where, "as_of", exc.reason))
    return problems


def _instant(value: object) -> datetime:
    from contextful.engine.read import parse_instant

    parsed = parse_instant(value if isinstance(value, str | datetime) else repr(value))
    assert parsed is not None
    return parsed


@dataclass(frozen=True)
class Resolution:
    """Where one table resolves for one origin: the commit_seq read (None: no commit there yet)."""

    table: str
    commit_seq: int | None
    output: bool


class Sweep:
    """One open sweep: its recorded ``as_of``, its origins in ascending order, and the output
    commits each landed origin recorded. Made by :func:`open_sweep`."""

    def __init__(self, execution: Execution, store: Store, spec: SweepSpec, outputs: Sequence[str],
                 origins: Iterable[Origin]) -> None:
        self.execution = execution
        self.store = store
        self.spec = spec
        self.outputs = tuple(outputs)
        self.origins = tuple(sorted(set(origins)))
        declared = spec.as_of_us
        # The instant the sweep opens is the catalog's (commit times are), reserved so that what
        # lands after it is stamped after it: a host whose clock runs behind a committer's still
        # reads what landed before it opened, and nothing landing later joins the frozen corpus.
        recorded = execution.step(AS_OF_STEP, lambda: {"as_of_us": declared if declared is not None
                                                       else store.catalog.reserve_instant(store.clock)})
        assert isinstance(recorded, dict)
        self.as_of_us: int = recorded["as_of_us"]
        self.landed: dict[Origin, dict[str, int]] = {}
        """Each landed origin's commit_seq per output table it committed to."""

    @property
    def as_of(self) -> datetime:
        return from_us(self.as_of_us)

    def resolutions(self, origin: Origin) -> dict[str, Resolution]:
        """Where every store table resolves for ``origin`` under the sweep's state."""
        if origin not in self.origins:
            raise ArgumentInvalid("origin", origin, f"is not an origin of this sweep ({len(self.origins)} origins)")
        pinned, unborn = self.store.pin_with_unborn(as_of=self.as_of_us)
        found = {name: Resolution(name, seq, name in self.outputs) for name, (_table, seq) in pinned.items()}
        found.update({name: Resolution(name, None, name in self.outputs) for name in unborn})
        if self.spec.state == CARRIED:
            for name, seq in self._carried(origin).items():
                found[name] = Resolution(name, seq, True)
            return found
        for name, seq in self._first_landed().items():  # a commit stamped at the very as_of instant
            pinned_seq = found[name].commit_seq
            if pinned_seq is not None and pinned_seq >= seq:
                found[name] = Resolution(name, seq - 1 if seq > 1 else None, True)
        return found

    def _first_landed(self) -> dict[str, int]:
        """The earliest commit any landed origin made, per output table: fresh reads stop below it."""
        first: dict[str, int] = {}
        for commits in self.landed.values():
            for name, seq in commits.items():
                first[name] = min(seq, first.get(name, seq))
        return first

    def _carried(self, origin: Origin) -> dict[str, int]:
        """The output commits the origins before ``origin`` made (the newest per table)."""
        carried: dict[str, int] = {}
        for earlier in self.origins[:self.origins.index(origin)]:
            if earlier not in self.landed:
                raise SweepOriginOutOfOrder(self.execution.execution_id, str(origin), str(earlier))
            carried.update(self.landed[earlier])
        return carried

    def connect(self, origin: Origin) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection where every store table is a view at its resolution for ``origin``."""
        from contextful.engine.read import attach_error, attach_snapshot

        con = self.store.duckdb()
        for name, where in self.resolutions(origin).items():
            table = self.store.table(name)
            if where.commit_seq is not None:
                attach_snapshot(con, table.snapshot_at(where.commit_seq), name)
            elif where.output and table.schema is not None:  # no commit yet: the job's output reads empty
                attach_snapshot(con, dataclasses.replace(table.snapshot_at(0), schema=table.schema), name)
            elif not where.output:
                attach_error(con, name, SnapshotNotFound(name, f"as of {self.as_of.isoformat()} (the sweep's as_of; "
                                                               "no commit had landed in it by then)"))
        return con

    def pins(self, origin: Origin) -> dict[str, tuple[Table, int]]:
        """The tables ``origin`` reads with a commit, each with the commit_seq it resolves at."""
        return {name: (self.store.table(name), where.commit_seq)
                for name, where in self.resolutions(origin).items() if where.commit_seq is not None}

    def run_origin(self, origin: Origin, body: Callable[[Origin, duckdb.DuckDBPyConnection], Iterable[CommitResult]]
                   ) -> dict[str, int]:
        """Run ``body(origin, connection)`` over ``origin``'s resolutions and record the commits it
        made to the output tables as a journal step; an origin an earlier attempt of the execution
        recorded is replayed, its body not called. Return those commits."""
        def compute() -> dict[str, Any]:
            con = self.connect(origin)
            try:
                with self.execution.writing():  # the origin's commits carry this attempt (storage.fence)
                    results = list(body(origin, con))
            finally:
                con.close()
            return {"commits": {r.table: r.commit_seq for r in results if r.table in self.outputs}}

        recorded = self.execution.step(f"sweep origin {origin!r} landed", compute)
        assert isinstance(recorded, dict)
        self.landed[origin] = dict(recorded["commits"])
        return self.landed[origin]

    def run(self, body: Callable[[Origin, duckdb.DuckDBPyConnection], Iterable[CommitResult]]
            ) -> dict[Origin, dict[str, int]]:
        """:meth:`run_origin` for each origin in ascending order, one at a time; return every
        origin's output commits."""
        for origin in self.origins:
            self.run_origin(origin, body)
        return dict(self.landed)


def open_sweep(execution: Execution, store: Store, spec: SweepSpec, *, outputs: Sequence[str],
               origins: Iterable[Origin]) -> Sweep:
    """Open (or, in a resumed execution, reopen) the sweep of ``execution`` over ``origins``: its
    ``as_of`` is recorded as the execution's next journal step, or replayed when recorded."""
    return Sweep(execution, store, spec, outputs, origins)
