"""Sweeps over real stores (SQLite and PostgreSQL catalogs) and their journals.

``run.sweep.frozen-as-of``: one as_of for every origin, recorded once as a journal step, read again
by a resumed execution after its lease lapsed; the instant a sweep opens is the catalog's, so a
host whose clock runs behind reads what another host committed before it opened, and nothing
committed after. ``run.sweep.fresh-state``: every table, outputs
included, at the sweep's as_of — no origin reads another's rows. ``run.sweep.carried-state``:
origins ascending one at a time, each reading the outputs at the preceding origin's commit and
every other table at the as_of, a later landing into an input or an output never seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import duckdb
import pyarrow as pa
import pytest
from contextful.engine.run.execution import Execution, open_execution, plan_reference
from contextful.engine.run.sweep import AS_OF_STEP, CARRIED, FRESH, SweepSpec, open_sweep
from contextful.storage import Store
from contextful.storage.clock import ManualClock, to_us
from contextful.storage.errors import (
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    SweepOriginOutOfOrder,
)
from contextful.storage.transaction import CommitResult

from tests.conftest import StoreFactory

PLAN = plan_reference({"job": "score", "sweep": "origins"})
T0 = 1_700_000_000_000_000
SECOND = 1_000_000


@pytest.fixture
def clock(store: Store) -> ManualClock:
    assert isinstance(store.clock, ManualClock)
    return store.clock


@pytest.fixture
def corpus(store: Store, clock: ManualClock) -> Iterator[Store]:
    """An input table ``docs`` and the job's output table ``scores`` holding an earlier sweep's row."""
    store.append("docs", pa.table({"doc": ["a", "b"]}))
    store.append("scores", pa.table({"origin": [0], "scores_seen": [0], "docs_seen": [0]}))
    clock.advance(1)
    yield store


def execution(store: Store, holder: str) -> Execution:
    return open_execution(store.journal, "job/score", PLAN, holder=holder, lease_s=30, clock=store.clock)


def scoring(store: Store, seen: dict[int, tuple[int, int]]):
    """The job's body: read the outputs and the input, land one row for the origin."""
    def body(origin: int, con: duckdb.DuckDBPyConnection) -> list[CommitResult]:
        scores = con.execute("SELECT count(*) FROM scores").fetchone()
        docs = con.execute("SELECT count(*) FROM docs").fetchone()
        assert scores is not None and docs is not None
        seen[origin] = (scores[0], docs[0])
        return [store.append("scores", pa.table({"origin": [origin], "scores_seen": [scores[0]],
                                                  "docs_seen": [docs[0]]}))]
    return body


def land_elsewhere(store: Store, clock: ManualClock, marker: int = 99) -> None:
    """Another writer lands into the input and into the output table while the sweep runs."""
    clock.advance(1)
    store.append("docs", pa.table({"doc": [f"late {marker}"]}))
    store.append("scores", pa.table({"origin": [marker], "scores_seen": [-1], "docs_seen": [-1]}))


@pytest.mark.clause("run.sweep.frozen-as-of")
def test_every_origin_reads_one_as_of_recorded_once_and_a_resume_reads_it_again(
        corpus: Store, clock: ManualClock) -> None:
    store = corpus
    opened_at = clock.now_us()
    first = execution(store, "host-a")
    sweep = open_sweep(first, store, SweepSpec(), outputs=["scores"], origins=[3, 1, 2])
    assert sweep.as_of_us == opened_at and sweep.origins == (1, 2, 3)
    seen: dict[int, tuple[int, int]] = {}
    sweep.run_origin(1, scoring(store, seen))
    land_elsewhere(store, clock)
    del first, sweep  # the host dies: nothing closes the execution
    clock.advance(31)  # its lease lapses
    again = execution(store, "host-b")
    assert again.resumed
    resumed = open_sweep(again, store, SweepSpec(), outputs=["scores"], origins=[1, 2, 3])
    assert resumed.as_of_us == opened_at != clock.now_us()
    resumed.run(scoring(store, seen))
    assert seen == {1: (1, 2), 2: (1, 2), 3: (1, 2)}  # one as_of: the late landings are seen by none
    labels = [step.label for step in store.journal.steps(again.execution_id)]
    assert labels.count(AS_OF_STEP) == 1 and labels[0] == AS_OF_STEP
    assert sum(1 for r in store.table("scores").to_arrow().to_pylist() if r["origin"] == 1) == 1  # replayed
    again.close(ok=True)

    declared = datetime(2030, 1, 1, tzinfo=UTC)
    fixed = open_sweep(execution(store, "host-c"), store, SweepSpec(as_of="2030-01-01T00:00:00Z"),
                       outputs=["scores"], origins=[1])
    assert fixed.as_of_us == to_us(declared)


@pytest.mark.clause("run.sweep.fresh-state")
def test_fresh_origins_read_every_table_outputs_included_at_the_as_of(corpus: Store, clock: ManualClock) -> None:
    store = corpus
    sweep = open_sweep(execution(store, "host-a"), store, SweepSpec(state=FRESH), outputs=["scores"],
                       origins=[1, 2, 3])
    seen: dict[int, tuple[int, int]] = {}
    body = scoring(store, seen)
    sweep.run_origin(1, body)  # its commit carries the sweep's own as_of instant (the clock stood still)
    land_elsewhere(store, clock)
    sweep.run_origin(2, body)
    sweep.run_origin(3, body)
    assert seen == {1: (1, 2), 2: (1, 2), 3: (1, 2)}  # no origin read a row another origin wrote
    seq_at_as_of = store.table("scores").resolve_seq(as_of=sweep.as_of_us - 1)
    assert {name: seq for name, (_t, seq) in sweep.pins(3).items()}["scores"] == seq_at_as_of


@pytest.mark.clause("run.sweep.carried-state")
def test_carried_origins_read_outputs_at_the_preceding_origins_commit_and_inputs_at_the_as_of(
        corpus: Store, clock: ManualClock) -> None:
    store = corpus
    sweep = open_sweep(execution(store, "host-a"), store, SweepSpec(state=CARRIED), outputs=["scores"],
                       origins=[3, 2, 1])
    with pytest.raises(SweepOriginOutOfOrder, match="origin 1 has not landed"):
        sweep.connect(2)  # one at a time, ascending: 2 carries what 1 commits
    seen: dict[int, tuple[int, int]] = {}
    body = scoring(store, seen)
    landed = {1: sweep.run_origin(1, body)}
    land_elsewhere(store, clock, 99)  # after origin 1 landed: a foreign output row and a late input row
    landed[2] = sweep.run_origin(2, body)
    land_elsewhere(store, clock, 98)  # after origin 2 landed
    landed[3] = sweep.run_origin(3, body)
    # 2 reads seed + origin 1 (not the foreign row landing after 1); 3 reads the table at 2's commit
    assert seen == {1: (1, 2), 2: (2, 2), 3: (4, 2)}  # docs always at the as_of: the late rows never
    pins = {origin: {name: seq for name, (_t, seq) in sweep.pins(origin).items()} for origin in (2, 3)}
    assert pins[2]["scores"] == landed[1]["scores"] and pins[3]["scores"] == landed[2]["scores"]
    docs = store.table("docs")
    assert pins[2]["docs"] == pins[3]["docs"] == docs.resolve_seq(as_of=sweep.as_of_us) < docs.head.commit_seq
    con = sweep.connect(3)
    origins = sorted(r[0] for r in con.execute("SELECT origin FROM scores").fetchall())
    con.close()
    assert origins == [0, 1, 2, 99]  # exactly origin 2's commit: 98, landing after it, is not read

@pytest.mark.clause("run.sweep.frozen-as-of")
def test_a_sweep_opens_at_the_catalogs_time_whatever_the_executing_hosts_clock_says(
        make_store: StoreFactory, store_kind: str) -> None:
    # Two hosts on one catalog, the fast one's clock 2 s ahead of the slow one's.
    fast_clock, slow_clock = ManualClock(T0 + 2 * SECOND), ManualClock(T0)
    fast, slow = make_store(clock=fast_clock), make_store(clock=slow_clock)
    fast.append("docs", pa.table({"doc": ["a", "b"]}))
    fast.append("scores", pa.table({"origin": [0], "scores_seen": [0], "docs_seen": [0]}))
    landed_us = fast.table("docs").commits()[-1].committed_us
    slow_clock.advance(1)  # the sweep opens after those commits, at 1 s before their time by its clock
    ex = execution(slow, "slow-host")
    sweep = open_sweep(ex, slow, SweepSpec(), outputs=["scores"], origins=[1, 2])
    slow.append("docs", pa.table({"doc": ["late, slow host"]}))  # landing after the sweep opened,
    fast.append("docs", pa.table({"doc": ["late, fast host"]}))  # from either host
    seen: dict[int, tuple[int, int]] = {}
    sweep.run(scoring(slow, seen))
    assert seen == {1: (1, 2), 2: (1, 2)}  # the fast host's earlier commits, and neither late one
    assert sweep.as_of_us >= landed_us > slow_clock.now_us()
    assert all(c.committed_us > sweep.as_of_us for c in slow.table("docs").commits()[1:])
    ex.close(ok=True)


def test_sweep_spec_validation_names_the_block_and_each_problem() -> None:
    with pytest.raises(ManifestInvalid) as unknown:
        SweepSpec(state="rolling")
    [problem] = unknown.value.problems
    assert isinstance(problem, ManifestValueInvalid) and "fresh, carried" in str(problem) and "'rolling'" in str(problem)
    with pytest.raises(ManifestInvalid) as many:
        SweepSpec.from_config({"state": "stale", "order": "desc"}, as_of="yesterday", where="job.score")
    kinds = sorted(type(p).__name__ for p in many.value.problems)
    assert kinds == ["ManifestKeyUnknown", "ManifestValueInvalid", "ManifestValueInvalid"]
    assert any(isinstance(p, ManifestKeyUnknown) and p.fields["key"] == "order" for p in many.value.problems)
    assert SweepSpec.from_config(None) == SweepSpec(FRESH, None)
    assert SweepSpec.from_config({"state": "carried"}, as_of="2030-01-01T00:00:00Z").as_of_us == to_us(
        datetime(2030, 1, 1, tzinfo=UTC))

