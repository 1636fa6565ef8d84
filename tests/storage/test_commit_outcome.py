"""Fault injection at every catalog boundary: a commit's outcome is known, or named unknown.

On SQLite (the real file, its connection failing at chosen statements) and on the real
PostgreSQL (through a wire-protocol proxy that drops the connection at chosen moments), a run
meets: a failure before its COMMIT is sent; a COMMIT the server carried out whose answer was lost;
the same with no way to learn the outcome; and a failure during the cleanup of a run that did
not land. After each: every table reads, every committed run's rows appear exactly once, the
cursor agrees with the rows, and a run whose outcome was unknown deleted nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.collect import run_of
from contextful.storage.errors import CatalogUnavailable, CommitOutcomeUnknown
from contextful.storage.transaction import RunTransaction

from tests.storage.faulty_sqlite import Faults, FaultySqliteCatalog
from tests.support.pg_proxy import PgProxy
from tests.support.relational_landing import CHILD, ITEMS_PER_ORDER, land_orders, torn

COMMIT_LOG = "INSERT INTO cf_commits"


@dataclass
class Rig:
    """A store whose catalog connection a test can break, and the means to break it."""

    kind: str
    store: Store
    faults: Faults | None = None
    proxy: PgProxy | None = None

    def before_send(self, then_refuse: bool = False, trigger: str = COMMIT_LOG) -> None:
        if self.faults is not None:
            self.faults.fail_before(trigger, then_refuse)
        else:
            assert self.proxy is not None
            self.proxy.cut_before(trigger.encode(), then_refuse)

    def after_commit(self, then_refuse: bool = False, trigger: str = COMMIT_LOG) -> None:
        if self.faults is not None:
            self.faults.fail_after_commit(trigger, then_refuse)
        else:
            assert self.proxy is not None
            self.proxy.cut_after_commit(trigger.encode(), then_refuse)

    def fired(self) -> bool:
        return (self.faults or self.proxy).fired.is_set()  # type: ignore[union-attr]

    def heal(self) -> None:
        (self.faults or self.proxy).heal()  # type: ignore[union-attr]


@pytest.fixture(params=["sqlite", "postgres"])
def rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Rig]:
    clock = ManualClock()
    if request.param == "sqlite":
        faults = Faults()
        catalog = FaultySqliteCatalog(str(tmp_path / "catalog.sqlite"), faults)
        store = Store.open(tmp_path / "store", catalog=catalog, clock=clock)
        yield Rig("sqlite", store, faults=faults)
        faults.heal()
        store.close()
        return
    dsn = request.getfixturevalue("pg_dsn")
    with PgProxy(dsn) as proxy:
        schema = f"t_{uuid.uuid4().hex[:16]}"
        store = Store.open(tmp_path / "store", catalog=PostgresCatalog(proxy.dsn(), schema), clock=clock)
        yield Rig("postgres", store, proxy=proxy)
        proxy.heal()
        store.close()


def land_missing(store: Store, upto: int) -> RunTransaction | None:
    """A source of ids 0..upto-1 whose cursor says how far it landed: land what is missing, the
    cursor with the rows; on any failure give the run up the way every caller does."""
    table = store.create_table("t")
    cursor = store.catalog.cursor("t", "src")
    start = cursor[0]["offset"] if cursor else 0
    if start >= upto:
        return None
    txn = table.transaction()
    try:
        txn.stage(pa.table({"id": list(range(start, upto))}))
        txn.set_cursor("src", {"offset": upto})
        txn.commit()
    except BaseException:
        txn.abort()
        raise
    return txn


def assert_consistent(store: Store, landed: int) -> None:
    """The table reads; ids 0..landed-1 each exactly once; the cursor says ``landed``."""
    ids = store.table("t").to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(landed))
    cursor = store.catalog.cursor("t", "src")
    assert (cursor[0]["offset"] if cursor else 0) == landed
    for part in store.table("t").snapshot().parts:
        assert store.objects.exists(part.path)


def staged_objects(store: Store, run_id: str) -> list[str]:
    return [o.key for o in store.objects.list("tables/t") if run_id in o.key]


def the_run(store: Store, before: set[str]) -> str:
    """The run id of the one run staged since ``before`` (the object keys then)."""
    new = {o.key for o in store.objects.list("tables/t")} - before
    runs = {run_of(key) for key in new if "/parts/" in key}
    assert len(runs) == 1, new
    return runs.pop()


def test_a_failure_before_the_commit_is_sent(rig: Rig) -> None:
    store = rig.store
    land_missing(store, 3)
    rig.before_send()
    if rig.kind == "postgres":
        # The server never saw COMMIT and rolled back with the connection: reconnecting and
        # running the transaction again costs one retried operation, and the run lands once.
        land_missing(store, 6)
        assert rig.fired()
        assert_consistent(store, 6)
    else:
        # SQLite reports the failed statement; the transaction rolled back, so the run is given
        # up and its parts deleted, safely.
        with pytest.raises(CatalogUnavailable):
            land_missing(store, 6)
        assert rig.fired()
        assert_consistent(store, 3)
        land_missing(store, 6)
        assert_consistent(store, 6)
    assert [c.run_id for c in store.catalog.commits("t")].count(store.catalog.commits("t")[-1].run_id) == 1


def test_a_commit_carried_out_whose_answer_was_lost_lands_once(rig: Rig) -> None:
    store = rig.store
    land_missing(store, 3)
    rig.after_commit()
    txn = land_missing(store, 6)  # resolved by finding its run id landed: success, not a failure
    assert rig.fired() and txn is not None
    assert_consistent(store, 6)
    runs = [c.run_id for c in store.catalog.commits("t")]
    assert runs.count(txn.run_id) == 1 and len(runs) == 2
    assert store.catalog.staging_runs("t") == []
    assert land_missing(store, 6) is None  # a re-run finds nothing missing


def test_an_unknown_outcome_deletes_nothing_and_settles_on_the_next_run(rig: Rig) -> None:
    store = rig.store
    land_missing(store, 3)
    before = {o.key for o in store.objects.list("tables/t")}
    rig.after_commit(then_refuse=True)
    with pytest.raises(CommitOutcomeUnknown) as info:
        land_missing(store, 6)
    assert rig.fired()
    run_id = the_run(store, before)
    assert info.value.run_id == run_id and info.value.category == "unknown" and info.value.exit_code == 75
    kept = staged_objects(store, run_id)
    assert any("/parts/" in k for k in kept)  # nothing deleted (a small run's manifest rides in its commit)
    assert all(store.objects.exists(k) for k in kept)
    rig.heal()
    # It had landed: the table reads it exactly once, and the next run has nothing to land.
    assert_consistent(store, 6)
    assert store.table("t").manifest(run_id).rows == 3
    assert land_missing(store, 6) is None
    assert store.collect(grace_seconds=0).orphans == []


def test_an_unknown_outcome_that_did_not_land_is_landed_once_by_the_next_run(rig: Rig) -> None:
    store = rig.store
    land_missing(store, 3)
    rig.before_send(then_refuse=True)
    # The COMMIT was never sent, so this outcome is known: not landed, and the run is given up.
    with pytest.raises(CatalogUnavailable):
        land_missing(store, 6)
    rig.heal()
    assert_consistent(store, 3)
    land_missing(store, 6)
    assert_consistent(store, 6)


def test_a_failure_during_cleanup_loses_nothing(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    store = rig.store
    land_missing(store, 3)
    before = {o.key for o in store.objects.list("tables/t")}

    def broken_delete(keys: list[str]) -> Any:
        raise OSError(5, "Input/output error")

    rig.before_send(then_refuse=True)
    monkeypatch.setattr(store.objects, "delete", broken_delete)
    with pytest.raises(CatalogUnavailable):  # the run's own error, not the cleanup's
        land_missing(store, 6)
    monkeypatch.undo()
    rig.heal()
    assert_consistent(store, 3)
    left = staged_objects(store, the_run(store, before))
    assert left  # the cleanup failed: the parts are still there, and the run's lease keeps them
    assert not set(left) & set(store.collect(grace_seconds=0).orphans)
    land_missing(store, 6)
    assert_consistent(store, 6)
    clock = store.clock
    assert isinstance(clock, ManualClock)
    clock.advance(2 * 3600)  # the abandoned run's lease lapses: collection takes what it left
    assert set(left) <= set(store.collect(grace_seconds=0).orphans)
    assert_consistent(store, 6)


def test_a_fold_whose_outcome_is_unknown_deletes_nothing(rig: Rig) -> None:
    store = rig.store
    for upto in range(1, 6):
        land_missing(store, upto)
    rig.after_commit(then_refuse=True)
    with pytest.raises(CommitOutcomeUnknown):
        store.fold("t")
    rig.heal()
    assert_consistent(store, 5)
    for part in store.table("t").snapshot().parts:
        assert store.objects.exists(part.path)


def test_a_run_id_commits_at_most_once(rig: Rig) -> None:
    store = rig.store
    land_missing(store, 3)
    commit = store.catalog.commits("t")[-1]
    again = store.catalog.commits("t")
    from contextful.storage.commits import CommitRequest

    request = CommitRequest(table="t", run_id=commit.run_id, kind="append", manifest=commit.manifest,
                            requirements=(), updates=(), rows=commit.rows)
    assert store.catalog.commit(request, store.clock) == commit.commit_seq  # the same commit sent again
    assert store.catalog.commits("t") == again


def test_a_model_build_whose_outcome_is_unknown_deletes_nothing(rig: Rig, tmp_path: Path) -> None:
    import tomllib

    from contextful.engine.config.parse import parse_manifest
    from contextful.engine.model.build import build_models, published_build

    store = rig.store
    land_missing(store, 4)
    text = ('[project]\nname = "m"\n[[model]]\nname = "evens"\n'
            'sql = "SELECT id FROM t WHERE id % 2 = 0"\n')
    manifest = parse_manifest(tomllib.loads(text), tmp_path)
    before = {o.key for o in store.objects.list("tables/evens")}
    rig.after_commit(then_refuse=True)
    with pytest.raises(CommitOutcomeUnknown):
        build_models(store, manifest)
    rig.heal()
    kept = [o.key for o in store.objects.list("tables/evens") if o.key not in before]
    assert any("/parts/" in k for k in kept)  # the build's parts were not deleted
    build = published_build(store, "evens")
    assert build is not None  # it had landed, and it reads
    assert sorted(store.table("evens").to_arrow().column("id").to_pylist()) == [0, 2]


# --- a landing of several tables: root and child tables publish together or not at all ---------

ROOT_CURSOR = "INSERT INTO cf_cursors"
"""Only the root table's commit writes a cursor (the pipeline's position)."""


def assert_orders(store: Store, ids: list[int]) -> None:
    """The landing's tables read ``ids`` each once, every item with its order, and the position."""
    assert sorted(store.table("orders").to_arrow().column("id").to_pylist()) == ids
    assert store.table(CHILD).count() == len(ids) * ITEMS_PER_ORDER
    assert torn(store) == (0, 0)
    cursor = store.catalog.cursor("orders", "pipeline:orders")
    assert cursor is not None and cursor[0]["landed"] == ids[-1:]  # the last landing's position


def test_a_failure_between_root_and_child_commits_lands_neither(rig: Rig) -> None:
    store = rig.store
    land_orders(store, [1])
    rig.before_send(then_refuse=True, trigger=ROOT_CURSOR)
    with pytest.raises(CatalogUnavailable):
        land_orders(store, [2])
    assert rig.fired()
    rig.heal()
    assert_orders(store, [1])  # neither the children nor the root of the failed landing
    land_orders(store, [2])  # the re-run lands each table's rows once
    assert_orders(store, [1, 2])


def test_a_landing_of_several_tables_whose_answer_was_lost_lands_once(rig: Rig) -> None:
    store = rig.store
    land_orders(store, [1])
    rig.after_commit()
    land_orders(store, [2])  # resolved by finding every table's run id landed
    assert rig.fired()
    assert_orders(store, [1, 2])
    assert len(store.catalog.commits("orders")) == len(store.catalog.commits(CHILD)) == 2


def test_a_landing_of_several_tables_whose_outcome_is_unknown_deletes_nothing(rig: Rig) -> None:
    store = rig.store
    land_orders(store, [1])
    before = {o.key for o in store.objects.list("tables")}
    rig.after_commit(then_refuse=True)
    with pytest.raises(CommitOutcomeUnknown):
        land_orders(store, [2])
    assert rig.fired()
    kept = {o.key for o in store.objects.list("tables")} - before
    assert {k.split("/")[1] for k in kept if "/parts/" in k} == {"orders", CHILD}  # nothing deleted
    rig.heal()
    assert_orders(store, [1, 2])  # it had landed, every table of it
