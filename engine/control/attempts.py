"""The relay's journal of step attempts: each submission of a landing step to a worker, kept where
the run substrate keeps durable state, the awakeable store (``storage.awakeables``).

Makes ``surface.dispatch.callback-rejected`` and ``heartbeat-lapse`` hold across a serve restart
(docs/control.md, "Workers"): a serve that dies with steps in flight leaves their attempts here, and
the next serve re-adopts them (``engine.control.relay``): the callback of an attempt that was
current before the restart is admitted exactly once, a heartbeat keeps its step, and a lapse moves
it under the next attempt.

One awakeable row per submission (each worker tried, each attempt):

- its execution id is ``relay/<run>/<step>``, its step ``seq`` counts the step's submissions
  (1, 2, …), so the step's **current** submission is its highest ``seq``;
- its label is the JSON ``{"attempt", "worker", "version"}``: the attempt number the submission
  carried, the worker it went to and the applied version it names;
- its token is the attempt's route token (``<relay>/awake/<token>``), minted by the store;
- the callback resolves the row with the step result, under a subject unique to that admission:
  one conditional write, so of two admissions of one callback (a replay, two serves) exactly one
  lands, and the other reads another subject and is refused. A submission every worker refused,
  and an attempt superseded by its successor, is resolved with what closed it (``{"refused": …}``,
  ``{"superseded": <next attempt>}``), so the rows still pending are exactly the open steps.

A row's deadline is :data:`ATTEMPT_DEADLINE_S` after its submission: an attempt still unanswered by
then is refused as timed out, since no landing step runs that long.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from contextful.storage.awakeables import PENDING, AwakeableRow, AwakeableStore
from contextful.storage.errors import AwakeableAlreadyResolved, AwakeableTimedOut

FAMILY = "relay"
"""The execution ids of the relay's rows are ``relay/<run>/<step>``."""
ATTEMPT_DEADLINE_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Attempt:
    """One submission of a step as the journal holds it."""

    run: str
    step: str
    seq: int
    """The step's n-th submission (its current one is the highest)."""
    attempt: int
    worker: str
    version: int
    token: str
    open: bool
    """Still pending: no callback, refusal or successor closed it."""

    @classmethod
    def of(cls, row: AwakeableRow) -> Attempt:
        run, step = row.execution_id[len(FAMILY) + 1:].rsplit("/", 1)
        label = json.loads(row.label)
        return cls(run, step, row.seq, int(label["attempt"]), str(label["worker"]), int(label["version"]),
                   row.token, row.state == PENDING)


class AttemptJournal:
    """The relay's attempts in one awakeable store."""

    def __init__(self, store: AwakeableStore) -> None:
        self.store = store

    @staticmethod
    def execution(run: str, step: str) -> str:
        return f"{FAMILY}/{run}/{step}"

    def record(self, run: str, step: str, seq: int, attempt: int, worker: str, version: int,
               now_us: int) -> Attempt:
        """Journal submission ``seq`` of ``step`` (before it is posted); the attempt with its token."""
        label = json.dumps({"attempt": attempt, "worker": worker, "version": version}, sort_keys=True)
        row = self.store.mint(self.execution(run, step), seq, label, now_us + ATTEMPT_DEADLINE_S * 1_000_000, now_us)
        return Attempt.of(row)

    def find(self, token: str) -> Attempt | None:
        row = self.store.get(token)
        return None if row is None or not row.execution_id.startswith(FAMILY + "/") else Attempt.of(row)

    def current(self, run: str, step: str) -> Attempt | None:
        """The step's latest submission."""
        rows = self.store.rows_of(self.execution(run, step))
        return Attempt.of(rows[-1]) if rows else None

    def open_attempts(self) -> list[Attempt]:
        """Each step's current submission still open (a lower one left pending by a serve that died
        between journaling a successor and closing it is superseded, so it is left out)."""
        latest: dict[tuple[str, str], Attempt] = {}
        for attempt in map(Attempt.of, self.store.pending_under(FAMILY)):
            latest[(attempt.run, attempt.step)] = attempt  # ordered by seq: the last one is current
        for attempt in list(latest.values()):
            current = self.current(attempt.run, attempt.step)
            if current is not None and current.seq != attempt.seq:
                del latest[(attempt.run, attempt.step)]
        return sorted(latest.values(), key=lambda a: (a.run, a.seq))

    def close(self, token: str, result: bytes, now_us: int) -> bool:
        """Resolve the attempt of ``token`` with ``result``: whether THIS call closed it (False: a
        callback, refusal or successor closed it first, or it timed out)."""
        mine = f"relay:{secrets.token_hex(12)}"
        try:
            row = self.store.resolve(token, result, mine, now_us)
        except (AwakeableAlreadyResolved, AwakeableTimedOut):
            return False
        return row.subject == mine
