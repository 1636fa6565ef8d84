"""A fold never changes an answer (issue 26): it takes every part of a commit or none, it commits
nothing when it would change nothing, and a supersede rule's superseded rows leave at the first fold
that can drop them without reviving anything (docs/store.md, "Folds and collection").

Each test runs on every store configuration (local root with SQLite, PostgreSQL catalog, S3 root);
the expected answers are the documented rule worked by hand over the landings.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.supersede import Supersede

from tests.storage.fold_checks import assert_folds_took_whole_commits

KEY = ("unit_ref", "derivation_key", "cue_seq")
RULE = Supersede(("unit_ref",))
SCHEMA = pa.schema({"unit_ref": pa.string(), "derivation_key": pa.string(), "cue_seq": pa.int64(),
                    "unit_status": pa.string(), "kind": pa.string(), "text": pa.string()})


def rows(unit: str, key: str, texts: list[str], status: str = "ok", first_cue: int = 0) -> pa.Table:
    """One unit's passages under ``key``, cue_seq counting from ``first_cue``."""
    return pa.Table.from_pylist([{"unit_ref": unit, "derivation_key": key, "cue_seq": first_cue + i,
                                  "unit_status": status, "kind": "passage", "text": text}
                                 for i, text in enumerate(texts)], schema=SCHEMA)


def land(store: Store, *parts: pa.Table) -> int:
    """One commit staging each of ``parts`` as its own part; the commit's seq."""
    txn = store.table("passages").transaction()
    for part in parts:
        txn.stage(part)
    return txn.commit().commit_seq


def texts(store: Store, commit_seq: int | None = None) -> list[str]:
    return sorted(store.table("passages").to_arrow(commit_seq=commit_seq).column("text").to_pylist())


@pytest.mark.clause("run.emit.stale-supersedes")
def test_a_commit_whose_parts_fall_in_different_tiers_is_folded_whole(store: Store) -> None:
    """Automatic compaction counts tiers per part; a commit staging a one-row part and a two-row
    part (tiers 0 and 1 at fanout 2) must not be cut between them, or the older landing of a unit
    moves to that commit's position, beside its newer landing, and is read again."""
    set_policy(store, CompactionPolicy(fanout=2))
    store.create_table("passages", KEY, supersede=RULE)
    first = land(store, rows("u", "A", ["u-a0"]))
    second = land(store, rows("w", "A", ["w-a0"]), rows("u", "B", ["u-b0", "u-b1"]))
    third = land(store, rows("v", "A", ["v-a0", "v-a1"]))
    expected = {first: ["u-a0"], second: ["u-b0", "u-b1", "w-a0"], third: ["u-b0", "u-b1", "v-a0", "v-a1", "w-a0"]}
    assert {seq: texts(store, seq) for seq in expected} == expected
    assert texts(store) == expected[third]
    assert assert_folds_took_whole_commits(store, "passages") >= 1  # the policy did fold


def stored_texts(store: Store) -> list[str]:
    """Every row the head's parts store, answered or not."""
    snap = store.table("passages").snapshot()
    con = store.duckdb()
    try:
        files = ", ".join(f"'{uri}'" for uri in snap.uris)
        return sorted(r[0] for r in con.execute(f"SELECT text FROM read_parquet([{files}], union_by_name = true)")
                      .fetchall())
    finally:
        con.close()


def after_a_large_landing(store: Store, *then: pa.Table) -> tuple[list[str], int]:
    """Unit u landed under key A (``u-a0``, ``u-a1``, in a part that rows of another unit make larger
    than the rest), then each of ``then`` as a commit, with automatic compaction off: the head's
    answer, and the size of that large part."""
    set_policy(store, CompactionPolicy(enabled=False))
    store.create_table("passages", KEY, supersede=RULE)
    land(store, pa.concat_tables([rows("pad", "A", [f"pad-{i}" for i in range(2_000)]), rows("u", "A", ["u-a0", "u-a1"])]))
    for table in then:
        land(store, table)
    return texts(store), max(p.bytes for p in store.table("passages").snapshot().parts)


@pytest.mark.clause("run.emit.stale-supersedes")
def test_superseded_rows_no_row_outside_the_group_needs_leave_at_the_next_fold(store: Store) -> None:
    """A unit with rows in a part too large to fold, re-derived twice under the same new key: the first
    landing's rows are superseded within the group, and nothing before the group needs them (the
    second landing withholds the old key's rows as the first did), so the fold drops them; a second
    fold finds nothing to do and commits nothing."""
    answer, large = after_a_large_landing(store, rows("u", "B", ["u-b0 first"]), rows("u", "B", ["u-b0 again"]))
    assert [t for t in answer if t.startswith("u-")] == ["u-b0 again"]

    folded = store.fold("passages", small_bytes=large)
    assert folded is not None and (folded.parts_removed, folded.parts_added) == (2, 1)
    assert texts(store) == answer
    assert "u-b0 first" not in stored_texts(store)
    head = store.table("passages").head.commit_seq
    assert store.fold("passages", small_bytes=large) is None  # nothing left to fold
    assert store.table("passages").head.commit_seq == head


@pytest.mark.clause("run.emit.stale-supersedes", "run.select.key-change")
def test_a_fold_that_would_change_nothing_commits_nothing(store: Store) -> None:
    """Key A, then B, then A again with fewer passages: the B landing is superseded, but it is what
    withholds the first A landing's ``u-a1`` stored in the large part before the group. Dropping it
    would revive ``u-a1``, so the fold keeps the unit's rows as they are: nothing changes, so nothing
    commits. A fold that takes the large part too drops them all exactly."""
    answer, large = after_a_large_landing(store, rows("u", "B", ["u-b0"]), rows("u", "A", ["u-a0 again"]))
    assert [t for t in answer if t.startswith("u-")] == ["u-a0 again"]
    head = store.table("passages").head.commit_seq

    assert store.fold("passages", small_bytes=large) is None
    assert store.table("passages").head.commit_seq == head
    assert texts(store) == answer

    everything = store.fold("passages", small_bytes=large + 1)
    assert everything is not None and everything.parts_added == 1
    assert texts(store) == answer
    assert stored_texts(store) == answer  # the superseded rows left with the fold that could drop them



@pytest.mark.clause("run.emit.stale-supersedes", "run.select.key-change")
def test_the_runs_of_one_fold_are_decided_one_after_another(store: Store) -> None:
    """Unit u under key A (two passages, in a large part), then A -> B -> A in one run of small
    commits and A -> C -> A in another, a large part of another unit between them. Either superseded
    landing (B or C) withholds ``u-a1`` while the other stays; one fold folding both runs must not
    drop both, each on the strength of the other."""
    after_a_large_landing(store, rows("u", "B", ["u-b0"]), rows("u", "A", ["u-a0 again"]))
    land(store, rows("other", "A", [f"other-{i}" for i in range(2_000)]))
    land(store, rows("u", "C", ["u-c0"]))
    land(store, rows("u", "A", ["u-a0 third"]))
    answer = texts(store)
    assert [t for t in answer if t.startswith("u-")] == ["u-a0 third"]
    small = min(p.bytes for p in store.table("passages").snapshot().parts if p.rows >= 2_000)

    store.fold("passages", small_bytes=small)
    assert texts(store) == answer
    assert "u-a1" in stored_texts(store)  # withheld, by a landing one of the runs still keeps
