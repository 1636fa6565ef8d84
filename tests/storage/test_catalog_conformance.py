"""The catalog port's behaviour suite, run against every adapter.

One suite, parametrized over :class:`SqliteCatalog` (a file under ``tmp_path``),
:class:`PostgresCatalog` (the session's real server, a fresh schema per test) and
:class:`D1Catalog` (the D1 profile's Worker under miniflare, a fresh namespace per test): table heads, the
linearizable commit with its typed requirements and updates, snapshot isolation of the part
index, schemas, cursors, transaction time, the run-record cache, collection marks and store
binding. The adapter-specific refusals of ``surface.apply.weak-conditional-backend`` close the
module.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from contextful.storage.catalog import Catalog, PartRow
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.catalog.sqlite import SqliteCatalog
from contextful.storage.clock import ManualClock
from contextful.storage.commits import (
    AddParts,
    AssertHeadSeq,
    AssertPartsLive,
    AssertRecordsPending,
    AssertSchemaId,
    AssertTableUUID,
    CommitRequest,
    MarkRecordsFlushed,
    PartFile,
    RecordRun,
    RemoveAllParts,
    RemoveParts,
    Requirement,
    SetCursor,
    SetSchema,
    Update,
)
from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.errors import (
    CatalogRejected,
    CommitConflict,
    ConditionalWriteUnsupported,
    StoreCatalogMismatch,
    TableNotFound,
)
from contextful.storage.manifest import schema_to_text
from psycopg.conninfo import make_conninfo

UUID = "4b1d6f0e-0000-4000-8000-000000000001"
SCHEMA_1 = schema_to_text(pa.schema([("id", pa.int64())]))
SCHEMA_2 = schema_to_text(pa.schema([("id", pa.int64()), ("name", pa.string())]))

CatalogFactory = Callable[[], Catalog]


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                        pytest.param("d1", marks=pytest.mark.d1)])
def open_catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CatalogFactory]:
    """Open catalogs on one backend location; every call opens another connection to the same one."""
    opened: list[Catalog] = []
    if request.param == "sqlite":
        path = str(tmp_path / "catalog.sqlite")

        def factory() -> Catalog:
            opened.append(SqliteCatalog(path))
            return opened[-1]
    elif request.param == "d1":
        binding = request.getfixturevalue("d1_binding")

        def factory() -> Catalog:
            opened.append(D1Catalog(binding.client()))
            return opened[-1]
    else:
        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")

        def factory() -> Catalog:
            opened.append(PostgresCatalog(dsn, schema))
            return opened[-1]

    yield factory
    for catalog in opened:
        catalog.close()


@pytest.fixture
def catalog(open_catalog: CatalogFactory) -> Catalog:
    return open_catalog()


# --- helpers -----------------------------------------------------------------------------------


def part(path: str, rows: int = 1, size: int = 100, **kwargs: Any) -> PartFile:
    return PartFile(path, rows, size, **kwargs)


RUN_NUMBERS = itertools.count(1)


def request(*updates: Update, table: str = "t", requirements: tuple[Requirement, ...] = (),
            run_id: str | None = None, kind: str = "append", rows: int = 0) -> CommitRequest:
    run_id = run_id or f"run-{next(RUN_NUMBERS)}"  # a run id commits at most once per table
    return CommitRequest(table=table, run_id=run_id, kind=kind, manifest=f"tables/{table}/runs/{run_id}.json",
                         requirements=requirements, updates=updates, rows=rows)


def at(now_us: int) -> ManualClock:
    """A clock that reads ``now_us`` (the commit time a catalog reads under its lock)."""
    return ManualClock(now_us)


def live(catalog: Catalog, seq: int, table: str = "t") -> list[str]:
    return [p.path for p in catalog.live_parts(table, seq)]


def parts_by_path(catalog: Catalog, table: str = "t") -> dict[str, PartRow]:
    return {p.path: p for p in catalog.all_parts(table)}


def state(catalog: Catalog, table: str = "t") -> tuple[Any, ...]:
    """Everything a commit could change, read back from the catalog."""
    head = catalog.load_head(table)
    assert head is not None
    return (
        head,
        catalog.list_heads(),
        catalog.commits(table),
        sorted(catalog.all_parts(table), key=lambda p: p.path),
        catalog.cursor(table, "scope"),
        catalog.run_records(),
    )


# --- heads -------------------------------------------------------------------------------------


def test_create_table_is_idempotent(open_catalog: CatalogFactory) -> None:
    catalog = open_catalog()
    head = catalog.create_table("t", UUID, ("id",), 1_000)
    assert (head.name, head.uuid, head.commit_seq, head.schema_id, head.schema) == ("t", UUID, 0, 0, None)
    assert (head.primary_key, head.created_us, head.last_commit_us) == (("id",), 1_000, 1_000)

    again = catalog.create_table("t", "another-uuid", ("other",), 2_000)
    assert again == head
    from_elsewhere = open_catalog().create_table("t", "third-uuid", (), 3_000)
    assert from_elsewhere == head
    assert catalog.list_heads() == [head]
    assert catalog.load_head("missing") is None


def test_list_heads_is_sorted_and_tables_are_independent(catalog: Catalog) -> None:
    catalog.create_table("b", "uuid-b", (), 1)
    catalog.create_table("a", "uuid-a", ("k",), 1)
    catalog.commit(request(AddParts((part("b/1"),)), table="b"), at(5))
    assert [(h.name, h.commit_seq) for h in catalog.list_heads()] == [("a", 0), ("b", 1)]
    assert catalog.commits("a") == []
    assert catalog.live_parts("a", 1) == []


def test_commit_advances_commit_seq_by_exactly_one(open_catalog: CatalogFactory) -> None:
    catalog = open_catalog()
    catalog.create_table("t", UUID, (), 1_000)
    for expected in (1, 2, 3):
        seq = catalog.commit(request(AddParts((part(f"p{expected}", rows=expected),)), run_id=f"r{expected}",
                                     rows=expected), at(1_000 + expected))
        assert seq == expected
        head = catalog.load_head("t")
        assert head is not None and head.commit_seq == expected

    # Another connection continues the same sequence.
    assert open_catalog().commit(request(run_id="r4", kind="replace"), at(1_010)) == 4

    commits = catalog.commits("t")
    assert [(c.commit_seq, c.run_id, c.kind, c.rows, c.committed_us) for c in commits] == [
        (1, "r1", "append", 1, 1_001), (2, "r2", "append", 2, 1_002), (3, "r3", "append", 3, 1_003),
        (4, "r4", "replace", 0, 1_010),
    ]
    assert commits[0].table == "t" and commits[0].manifest == "tables/t/runs/r1.json"


def test_commit_to_a_missing_table_raises_table_not_found(catalog: Catalog) -> None:
    with pytest.raises(TableNotFound) as info:
        catalog.commit(request(AddParts((part("p"),)), table="nope"), at(1))
    assert info.value.table == "nope"
    assert catalog.load_head("nope") is None
    assert catalog.all_parts("nope") == []


# --- requirements ------------------------------------------------------------------------------


def _conflict_fixture(catalog: Catalog) -> None:
    """A table at commit_seq 2, schema 1: p1 removed, p2 live, ("r-a", "commit") flushed,
    ("r-p", "plan") pending, cursor ``scope`` written by commit 1."""
    catalog.create_table("t", UUID, ("id",), 1_000)
    catalog.record_run("r-a", "plan", "t", {"status": "planned"}, 1_000)
    committed = RecordRun("r-a", "commit", "t", {"status": "committed", "recorded_us": 1_001})
    catalog.commit(request(SetSchema(SCHEMA_1), AddParts((part("p1"), part("p2", ord_idx=1))),
                           SetCursor("scope", 1), committed, run_id="r-a"), at(1_001))
    catalog.commit(request(RemoveParts(("p1",)), MarkRecordsFlushed((("r-a", "plan"), ("r-a", "commit"))),
                           run_id="r-b", kind="fold"), at(1_002))
    catalog.record_run("r-p", "plan", "t", {"status": "planned"}, 1_003)


HOLDING = (AssertTableUUID(UUID), AssertHeadSeq(2), AssertSchemaId(1), AssertPartsLive(("p2",)),
           AssertRecordsPending((("r-p", "plan"),)))

FAILING = [
    pytest.param(AssertTableUUID("5e1f0000-0000-4000-8000-000000000002"), id="AssertTableUUID"),
    pytest.param(AssertHeadSeq(1), id="AssertHeadSeq"),
    pytest.param(AssertSchemaId(0), id="AssertSchemaId"),
    pytest.param(AssertPartsLive(("p1", "p2")), id="AssertPartsLive"),
    pytest.param(AssertRecordsPending((("r-p", "plan"), ("r-a", "commit"))), id="AssertRecordsPending"),
]

UPDATES = (
    SetSchema(SCHEMA_2),
    RemoveParts(("p2",)),
    AddParts((part("p3", rows=7),)),
    SetCursor("scope", {"offset": 2}),
    RecordRun("r-c", "commit", "t", {"status": "committed", "recorded_us": 1_004}),
    MarkRecordsFlushed((("r-p", "plan"),)),
)


@pytest.mark.parametrize("failing", FAILING)
def test_failed_requirement_raises_commit_conflict_and_applies_nothing(catalog: Catalog,
                                                                       failing: Requirement) -> None:
    _conflict_fixture(catalog)
    before = state(catalog)

    with pytest.raises(CommitConflict) as info:
        catalog.commit(request(*UPDATES, requirements=(*HOLDING, failing), run_id="r-c", rows=7), at(1_004))
    assert info.value.failed == type(failing).__name__
    assert info.value.table == "t"
    assert "'t'" in str(info.value)

    assert state(catalog) == before
    assert live(catalog, 2) == ["p2"]
    assert catalog.cursor("t", "scope") == (1, 1)
    assert [(r.run_id, r.phase) for r in catalog.pending_run_records(10)] == [("r-p", "plan")]

    # Without the failing requirement the same commit lands, every update with it.
    assert catalog.commit(request(*UPDATES, requirements=HOLDING, run_id="r-c", rows=7), at(1_004)) == 3
    head = catalog.load_head("t")
    assert head is not None
    assert (head.commit_seq, head.schema_id, head.schema) == (3, 2, SCHEMA_2)
    assert live(catalog, 3) == ["p3"]
    assert catalog.cursor("t", "scope") == ({"offset": 2}, 3)
    records = {(r.run_id, r.phase): r for r in catalog.run_records()}
    assert set(records) == {("r-c", "commit")}  # ("r-p", "plan") flushed: it left the cache
    assert records[("r-c", "commit")].payload["commit_seq"] == 3


def test_a_failing_update_rolls_back_the_updates_before_it(open_catalog: CatalogFactory) -> None:
    catalog = open_catalog()
    catalog.create_table("t", UUID, (), 1_000)
    catalog.commit(request(SetSchema(SCHEMA_1), AddParts((part("p1"),)), SetCursor("scope", 1)), at(1_001))
    before = state(catalog)

    # The duplicate part path violates the part index's key after the schema, cursor, run record
    # and removal were already written inside the transaction.
    doomed = request(SetSchema(SCHEMA_2), SetCursor("scope", 2), RemoveAllParts(),
                     RecordRun("r-x", "commit", "t", {"recorded_us": 1_002}), AddParts((part("p1"),)),
                     run_id="r-x")
    with pytest.raises(CatalogRejected) as info:
        catalog.commit(doomed, at(1_002))
    if isinstance(catalog, D1Catalog):  # D1 refused the batch: every statement of it rolled back
        assert "UNIQUE constraint failed" in str(info.value)
    else:
        assert isinstance(info.value.__cause__, (sqlite3.IntegrityError, psycopg.IntegrityError))

    assert state(catalog) == before
    assert state(open_catalog()) == before
    # The connection is usable afterwards and the sequence has no gap.
    assert catalog.commit(request(AddParts((part("p2"),))), at(1_003)) == 2


def test_commit_and_swap_admits_one_winner_per_head(open_catalog: CatalogFactory) -> None:
    """Racing committers on separate connections, each requiring the head it read: no seq twice."""
    open_catalog().create_table("t", UUID, (), 1)
    writers, per_writer = 4, 15
    catalogs = [open_catalog() for _ in range(writers)]
    won: dict[int, list[int]] = {w: [] for w in range(writers)}
    conflicts = [0] * writers
    failures: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(w: int) -> None:
        catalog = catalogs[w]
        try:
            start.wait(300)
            while len(won[w]) < per_writer:
                head = catalog.load_head("t")
                assert head is not None
                try:
                    seq = catalog.commit(request(AddParts((part(f"w{w}-{len(won[w])}"),)),
                                                 requirements=(AssertHeadSeq(head.commit_seq),),
                                                 run_id=f"w{w}-{len(won[w])}"), at(10))
                except CommitConflict as exc:
                    assert exc.failed == "AssertHeadSeq"
                    conflicts[w] += 1
                    continue
                assert seq == head.commit_seq + 1
                won[w].append(seq)
        except BaseException as exc:  # noqa: BLE001 - a thread reports every failure to the test
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    total = writers * per_writer
    assert sorted(s for seqs in won.values() for s in seqs) == list(range(1, total + 1))
    assert [c.commit_seq for c in catalogs[0].commits("t")] == list(range(1, total + 1))
    assert len(live(catalogs[0], total)) == total


def test_commits_of_several_tables_in_any_order_never_deadlock(open_catalog: CatalogFactory) -> None:
    """Two committers landing on the same two tables, naming them in opposite orders: each locks
    the heads in one order, so both finish and every commit lands both tables."""
    setup = open_catalog()
    for table in ("a", "b"):
        setup.create_table(table, UUID, (), 1)
    rounds = 15
    failures: list[BaseException] = []
    start = threading.Barrier(2)

    def write(w: int, order: tuple[str, str]) -> None:
        catalog = open_catalog()
        try:
            start.wait(60)
            for i in range(rounds):
                catalog.commit_many([request(AddParts((part(f"{t}-w{w}-{i}"),)), table=t, run_id=f"w{w}-{i}")
                                     for t in order], at(10))
        except BaseException as exc:  # noqa: BLE001 - a thread reports every failure to the test
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(0, ("a", "b"))), threading.Thread(target=write, args=(1, ("b", "a")))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    for table in ("a", "b"):
        assert [c.commit_seq for c in setup.commits(table)] == list(range(1, 2 * rounds + 1))
    # each commit landed both tables at once: the runs follow the same order in both
    assert [c.run_id for c in setup.commits("a")] == [c.run_id for c in setup.commits("b")]


# --- parts and snapshots -----------------------------------------------------------------------


def test_part_updates_and_snapshot_isolation(catalog: Catalog) -> None:
    catalog.create_table("t", UUID, (), 1)
    first = AddParts((part("a", rows=1, size=11), part("b", rows=2, size=22, ord_idx=1)))
    assert catalog.commit(request(first), at(10)) == 1
    # A part carrying an older merge position sorts before the newer commit's parts.
    assert catalog.commit(request(AddParts((part("c"), part("g", ord_seq=1, ord_idx=9)))), at(20)) == 2
    assert catalog.commit(request(RemoveParts(("a",))), at(30)) == 3
    assert catalog.commit(request(RemoveAllParts(), AddParts((part("d"),)), kind="replace"), at(40)) == 4
    fold = request(RemoveParts(("a", "d")), AddParts((part("f", ord_seq=4),)), kind="fold")
    assert catalog.commit(fold, at(50)) == 5

    assert live(catalog, 0) == []
    assert live(catalog, 1) == ["a", "b"]
    assert live(catalog, 2) == ["a", "b", "g", "c"]
    assert live(catalog, 3) == ["b", "g", "c"]
    assert live(catalog, 4) == ["d"]
    assert live(catalog, 5) == ["f"]

    parts = parts_by_path(catalog)
    assert set(parts) == {"a", "b", "c", "d", "f", "g"}
    # Removing an already removed part keeps the commit that removed it.
    assert {p: (r.added_seq, r.removed_seq) for p, r in parts.items()} == {
        "a": (1, 3), "b": (1, 4), "c": (2, 4), "g": (2, 4), "d": (4, 5), "f": (5, None),
    }
    assert (parts["b"].rows, parts["b"].bytes, parts["b"].ord_seq, parts["b"].ord_idx) == (2, 22, 1, 1)
    assert (parts["g"].ord_seq, parts["g"].ord_idx) == (1, 9)
    assert (parts["f"].ord_seq, parts["f"].collected_us) == (4, None)


def test_mark_collected_marks_only_the_named_parts_of_the_table(catalog: Catalog) -> None:
    catalog.create_table("t", UUID, (), 1)
    catalog.create_table("u", "uuid-u", (), 1)
    catalog.commit(request(AddParts((part("p1"), part("p2", ord_idx=1)))), at(10))
    catalog.commit(request(AddParts((part("p1"),)), table="u"), at(10))
    catalog.commit(request(RemoveParts(("p1",))), at(20))

    catalog.mark_collected("t", ["p1"], 777)

    assert {p: r.collected_us for p, r in parts_by_path(catalog).items()} == {"p1": 777, "p2": None}
    assert [(p.path, p.collected_us) for p in catalog.live_parts("t", 1)] == [("p1", 777), ("p2", None)]
    assert parts_by_path(catalog, "u")["p1"].collected_us is None


# --- schemas and cursors -----------------------------------------------------------------------


def test_set_schema_increments_schema_id(catalog: Catalog) -> None:
    catalog.create_table("t", UUID, (), 1)
    catalog.commit(request(SetSchema(SCHEMA_1), AddParts((part("p1"),))), at(10))
    head = catalog.load_head("t")
    assert head is not None and (head.schema_id, head.schema) == (1, SCHEMA_1)

    cast = AddParts((part("p2", exact_schema=False),))
    catalog.commit(request(cast, requirements=(AssertSchemaId(1),)), at(20))
    catalog.commit(request(SetSchema(SCHEMA_2), requirements=(AssertSchemaId(1),)), at(30))
    head = catalog.load_head("t")
    assert head is not None and (head.commit_seq, head.schema_id, head.schema) == (3, 2, SCHEMA_2)

    assert catalog.schema_at("t", 1) == SCHEMA_1
    assert catalog.schema_at("t", 2) == SCHEMA_2
    assert [catalog.schema_id_at("t", s) for s in (0, 1, 2, 3)] == [0, 1, 1, 2]
    # A part records the schema it was written in, or -1 when a reader must cast it.
    assert {p: r.schema_id for p, r in parts_by_path(catalog).items()} == {"p1": 1, "p2": -1}
    with pytest.raises(CommitConflict) as info:
        catalog.commit(request(requirements=(AssertSchemaId(1),)), at(40))
    assert info.value.failed == "AssertSchemaId"


def test_set_cursor_resolves_with_the_commit_that_wrote_it(catalog: Catalog) -> None:
    catalog.create_table("t", UUID, (), 1)
    catalog.create_table("u", "uuid-u", (), 1)
    assert catalog.cursor("t", "scope") is None

    catalog.commit(request(SetCursor("scope", {"offset": 10, "ids": [1, 2]})), at(10))
    catalog.commit(request(AddParts((part("p"),))), at(20))
    assert catalog.cursor("t", "scope") == ({"offset": 10, "ids": [1, 2]}, 1)

    catalog.commit(request(SetCursor("scope", 20), SetCursor("other", "x")), at(30))
    catalog.commit(request(SetCursor("scope", "u-side"), table="u"), at(30))
    assert catalog.cursor("t", "scope") == (20, 3)
    assert catalog.cursor("t", "other") == ("x", 3)
    assert catalog.cursor("u", "scope") == ("u-side", 1)
    assert catalog.cursor("u", "other") is None


# --- transaction time --------------------------------------------------------------------------


def test_seq_as_of_uses_commit_time_which_never_runs_backwards(catalog: Catalog) -> None:
    catalog.create_table("t", UUID, (), 1_500)
    assert catalog.commit(request(), at(1_000)) == 1  # earlier than the table's creation
    assert catalog.commit(request(), at(2_000)) == 2
    assert catalog.commit(request(), at(3_000)) == 3
    assert catalog.commit(request(), at(2_500)) == 4  # a committer whose clock lags
    assert catalog.commit(request(), at(4_000)) == 5

    assert [c.committed_us for c in catalog.commits("t")] == [1_500, 2_000, 3_000, 3_000, 4_000]
    head = catalog.load_head("t")
    assert head is not None and head.last_commit_us == 4_000
    assert catalog.seq_as_of("t", 1_499) is None
    assert catalog.seq_as_of("t", 1_500) == 1
    assert catalog.seq_as_of("t", 2_999) == 2
    assert catalog.seq_as_of("t", 3_000) == 4
    assert catalog.seq_as_of("t", 3_999) == 4
    assert catalog.seq_as_of("t", 10**15) == 5
    assert catalog.seq_as_of("missing", 10**15) is None


def test_commit_time_follows_commit_order_across_the_catalog(catalog: Catalog) -> None:
    catalog.create_table("a", UUID, (), 1_000)
    catalog.create_table("b", UUID, (), 1_000)
    catalog.commit(request(table="a"), at(5_000))
    assert catalog.commit(request(table="b"), at(2_000)) == 1  # b's committer lags behind a's
    assert [c.committed_us for c in catalog.commits("b")] == [5_000]
    assert catalog.seq_as_of("b", 4_999) is None  # an instant before a's commit holds neither


def test_pin_heads_reads_every_table_at_one_point(catalog: Catalog) -> None:
    catalog.create_table("a", UUID, ("id",), 1_000)
    catalog.create_table("b", UUID, (), 1_000)
    catalog.create_table("empty", UUID, (), 1_000)
    catalog.commit(request(SetSchema(SCHEMA_1), table="a"), at(2_000))
    catalog.commit(request(table="b"), at(3_000))
    catalog.commit(request(table="a"), at(4_000))

    pinned = catalog.pin_heads(["a", "b", "missing"])
    assert sorted(pinned) == ["a", "b"]  # an unknown name is left out
    assert pinned["a"].head == catalog.load_head("a") and pinned["a"].commit_seq == 2
    assert pinned["b"].commit_seq == 1
    assert sorted(catalog.pin_heads()) == ["a", "b", "empty"]
    assert catalog.pin_heads([]) == {}
    as_of = catalog.pin_heads(None, 3_500)
    assert {n: p.commit_seq for n, p in as_of.items()} == {"a": 1, "b": 1, "empty": None}
    assert as_of["a"].head.schema == SCHEMA_1 and as_of["a"].head.primary_key == ("id",)


# --- commits of several tables -----------------------------------------------------------------


def test_commit_many_advances_every_head_or_none(open_catalog: CatalogFactory) -> None:
    catalog = open_catalog()
    for table in ("root", "child"):
        catalog.create_table(table, UUID, (), 1_000)
    before = (state(catalog, "root"), state(catalog, "child"))
    doomed = [request(AddParts((part("c1"),)), table="child", run_id="r-child"),
              request(AddParts((part("r1"),)), SetCursor("pos", 1), table="root", run_id="r-root",
                      requirements=(AssertHeadSeq(7),))]
    with pytest.raises(CommitConflict) as info:
        catalog.commit_many(doomed, at(2_000))
    assert (info.value.table, info.value.failed) == ("root", "AssertHeadSeq")
    assert (state(catalog, "root"), state(catalog, "child")) == before  # the child's update went too
    assert catalog.cursor("root", "pos") is None

    landing = [request(AddParts((part("c1"),)), table="child", run_id="r-child"),
               request(AddParts((part("r1"),)), SetCursor("pos", 1), table="root", run_id="r-root")]
    assert catalog.commit_many(landing, at(2_000)) == [1, 1]
    other = open_catalog()  # another connection sees the whole commit
    assert live(other, 1, "child") == ["c1"] and live(other, 1, "root") == ["r1"]
    assert [c.committed_us for c in other.commits("child")] == [c.committed_us for c in other.commits("root")]

    # sent again (a lost answer): every run id is found landed, nothing lands twice
    assert other.commit_many(landing, at(3_000)) == [1, 1]
    assert len(catalog.commits("root")) == len(catalog.commits("child")) == 1
    assert catalog.commit_many([], at(3_000)) == []
    with pytest.raises(ValueError):
        catalog.commit_many([request(table="root"), request(table="root")], at(3_000))


# --- the run-record cache ----------------------------------------------------------------------


def test_run_record_cache(open_catalog: CatalogFactory) -> None:
    catalog = open_catalog()
    catalog.create_table("t", UUID, (), 1)
    catalog.record_run("r1", "plan", "t", {"status": "planned", "kind": "append"}, 20)
    catalog.record_run("r2", "plan", "t", {"status": "planned"}, 10)
    pending = catalog.pending_run_records(10)
    assert [(r.run_id, r.phase, r.table, r.recorded_us) for r in pending] == [
        ("r2", "plan", "t", 10), ("r1", "plan", "t", 20),
    ]
    assert [r.run_id for r in catalog.pending_run_records(1)] == ["r2"]

    # The commit row rides inside the commit and carries the commit_seq it landed at.
    seq = catalog.commit(request(AddParts((part("p"),)),
                                 RecordRun("r1", "commit", "t", {"status": "committed", "recorded_us": 30}),
                                 run_id="r1"), at(30))
    assert seq == 1
    commit_row = [r for r in open_catalog().pending_run_records(10) if r.phase == "commit"]
    assert [(r.run_id, r.recorded_us, r.payload) for r in commit_row] == [
        ("r1", 30, {"status": "committed", "recorded_us": 30, "commit_seq": 1}),
    ]

    keys = (("r2", "plan"), ("r1", "plan"))
    assert catalog.commit(request(MarkRecordsFlushed(keys), requirements=(AssertRecordsPending(keys),),
                                  run_id="flush"), at(40)) == 2
    assert [(r.run_id, r.phase) for r in catalog.pending_run_records(10)] == [("r1", "commit")]
    # flushed rows leave the cache in the flushing commit: it never grows with the runs it has seen
    assert [(r.run_id, r.phase) for r in catalog.run_records()] == [("r1", "commit")]

    # Flushing the same rows twice is the conflict a racing flusher meets.
    with pytest.raises(CommitConflict) as info:
        catalog.commit(request(MarkRecordsFlushed(keys), requirements=(AssertRecordsPending(keys),)), at(50))
    assert info.value.failed == "AssertRecordsPending"

    # Re-recording a row replaces it and makes it pending again.
    catalog.record_run("r2", "plan", "t", {"status": "replanned"}, 60)
    by_key = {(r.run_id, r.phase): r for r in catalog.pending_run_records(10)}
    assert set(by_key) == {("r2", "plan"), ("r1", "commit")}
    replanned = by_key[("r2", "plan")]
    assert (replanned.payload, replanned.recorded_us) == ({"status": "replanned"}, 60)
    assert len(catalog.run_records()) == 2

    # A flush names the payload it appended: a row recorded again since stays, pending.
    catalog.record_run("r3", "plan", "t", {"status": "planned"}, 70)
    flushed = (("r2", "plan"), ("r3", "plan"))
    texts = (json.dumps({"status": "stale"}), json.dumps({"status": "planned"}))
    assert catalog.commit(request(MarkRecordsFlushed(flushed, texts), requirements=(AssertRecordsPending(flushed),),
                                  run_id="flush-2"), at(80)) == 3
    assert {(r.run_id, r.phase): r.payload for r in catalog.run_records()} == {
        ("r2", "plan"): {"status": "replanned"}, ("r1", "commit"): {"status": "committed", "recorded_us": 30,
                                                                    "commit_seq": 1},
    }



def test_rows_an_older_version_kept_flushed_leave_at_the_next_flush(tmp_path: Path) -> None:
    """Catalogs written before flushes removed their rows kept them with ``flushed_seq`` set; the
    next flush drops them, so an old store's cache shrinks to its pending rows too."""
    path = str(tmp_path / "catalog.sqlite")
    catalog = SqliteCatalog(path)
    try:
        catalog.create_table("t", UUID, (), 1)
        catalog.record_run("old", "plan", "t", {"status": "planned"}, 5)
        catalog.record_run("new", "plan", "t", {"status": "planned"}, 6)
        with sqlite3.connect(path) as raw:  # as an older version left a flushed row
            raw.execute("UPDATE cf_run_records SET flushed_seq = 1 WHERE run_id = 'old'")
        assert [r.run_id for r in catalog.run_records()] == ["new"]
        keys = (("new", "plan"),)
        catalog.commit(request(MarkRecordsFlushed(keys), requirements=(AssertRecordsPending(keys),)), at(10))
        with sqlite3.connect(path) as raw:
            assert raw.execute("SELECT COUNT(*) FROM cf_run_records").fetchone() == (0,)
    finally:
        catalog.close()

# --- store settings ----------------------------------------------------------------------------


def test_store_settings_are_shared_by_every_connection(open_catalog: CatalogFactory) -> None:
    catalog, other = open_catalog(), open_catalog()
    assert catalog.settings(["compaction", "compaction:t"]) == {}
    catalog.put_setting("compaction", '{"fanout": 4}')
    other.put_setting("compaction:t", '{"enabled": false}')
    assert other.settings(["compaction", "compaction:t", "x"]) == {
        "compaction": '{"fanout": 4}', "compaction:t": '{"enabled": false}'}
    catalog.put_setting("compaction", '{"fanout": 16}')
    other.put_setting("compaction:t", None)
    assert catalog.settings(["compaction", "compaction:t"]) == {"compaction": '{"fanout": 16}'}
    assert catalog.settings([]) == {}


# --- the store binding -------------------------------------------------------------------------


def test_bind_store_refuses_a_catalog_of_another_store(open_catalog: CatalogFactory) -> None:
    catalog = open_catalog()
    catalog.bind_store("store-1", "/data/one")
    catalog.bind_store("store-1", "/data/one")
    open_catalog().bind_store("store-1", "/data/one-moved")

    with pytest.raises(StoreCatalogMismatch) as info:
        open_catalog().bind_store("store-2", "/data/two")
    err = info.value
    assert (err.store_uuid, err.catalog_store_uuid, err.root) == ("store-2", "store-1", "/data/two")
    assert "store-1" in str(err) and "store-2" in str(err) and "/data/two" in str(err)
    catalog.bind_store("store-1", "/data/one")


# --- surface.apply.weak-conditional-backend ----------------------------------------------------


@pytest.mark.clause("surface.apply.weak-conditional-backend")
@pytest.mark.parametrize("query", ["nolock=1", "vfs=unix-none"])
def test_sqlite_without_locking_refuses_to_open(tmp_path: Path, query: str) -> None:
    path = tmp_path / "catalog.sqlite"
    uri = f"file:{path}?{query}"
    with pytest.raises(ConditionalWriteUnsupported) as info:
        SqliteCatalog(uri)
    err = info.value
    assert err.backend == f"sqlite:{uri}"
    assert "sqlite" in str(err) and "locking is off" in err.reason
    assert err.category == "permanent"

    # The same file with SQLite's locking on opens and commits: the refusal is about locking.
    catalog = SqliteCatalog(str(path))
    try:
        catalog.create_table("t", UUID, (), 1)
        assert catalog.commit(request(), at(2)) == 1
    finally:
        catalog.close()


@pytest.mark.postgres
@pytest.mark.clause("surface.apply.weak-conditional-backend")
def test_postgres_with_read_only_transactions_refuses_to_open(pg_dsn: str, pg_schema: str) -> None:
    database = f"ro_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
        admin.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    dsn = make_conninfo(pg_dsn, dbname=database)
    try:
        with pytest.raises(ConditionalWriteUnsupported) as info:
            PostgresCatalog(dsn, pg_schema)
        err = info.value
        assert err.backend == f"postgres:{pg_schema}"
        assert "postgres" in str(err) and "default_transaction_read_only" in err.reason

        # It refused before writing anything there.
        with psycopg.connect(dsn) as conn:
            found = conn.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s",
                                 (pg_schema,)).fetchone()
        assert found == (0,)

        # The same database accepting writes opens and commits.
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
        catalog = PostgresCatalog(dsn, pg_schema)
        try:
            catalog.create_table("t", UUID, (), 1)
            assert catalog.commit(request(), at(2)) == 1
        finally:
            catalog.close()
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
