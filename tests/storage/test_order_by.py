"""A late ``order_by`` declaration is a commit of its own (issue 11, "an answer once given never
changes"): snapshots below it answer as before, folds resolve each part by the rule of its side of
the declaration, and catalogs written before declarations were commits still read."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
from contextful.storage import Store
from contextful.storage.catalog.sqlite import SqliteCatalog


def values(store: Store, table: str, commit_seq: int | None = None) -> dict[int, str]:
    return {r["k"]: r["v"] for r in store.table(table).to_arrow(commit_seq=commit_seq).to_pylist()}


def test_a_late_declaration_is_a_commit_and_earlier_snapshots_answer_as_before(store: Store) -> None:
    t = store.create_table("t", ("k",))
    t.append(pa.table({"k": [1, 2], "ts": [5, 1], "v": ["a5", "b1"]}))
    t.append(pa.table({"k": [1, 2], "ts": [3, 2], "v": ["a3", "b2"]}))
    before = values(store, "t")
    assert before == {1: "a3", 2: "b2"}  # commit order

    declared = store.create_table("t", ("k",), order_by="ts")
    head = declared.head
    assert (head.order_by, head.order_by_seq, head.commit_seq) == ("ts", 3, 3)
    commit = store.table("t").commits()[-1]
    assert (commit.commit_seq, commit.kind, commit.manifest, commit.rows) == (3, "declare", None, 0)
    assert values(store, "t", 2) == before  # below the declaration: as before
    assert values(store, "t", 3) == before  # at it: the rows before it count through their winner
    assert store.table("t").snapshot(2).order_by is None and store.table("t").snapshot(3).order_by == "ts"

    # From the declaration on, later rows compete with that winner by ts: a larger ts wins, a
    # smaller or null one loses, a tie goes to the later commit.
    t.append(pa.table({"k": [1, 2], "ts": [4, None], "v": ["a4", "bnull"]}))
    assert values(store, "t") == {1: "a4", 2: "b2"}
    t.append(pa.table({"k": [1, 2], "ts": [3, 2], "v": ["a3-late", "b2-tie"]}))
    assert values(store, "t") == {1: "a4", 2: "b2-tie"}
    assert values(store, "t", 2) == before and values(store, "t", 3) == before

    # A second declaration, of the same or another column, is no commit and changes nothing.
    seq = store.table("t").head.commit_seq
    assert store.create_table("t", ("k",), order_by="v").head.order_by == "ts"
    assert store.table("t").declare_order_by("ts") is None
    assert store.table("t").head.commit_seq == seq


def test_a_fold_across_a_declaration_changes_no_snapshot(store: Store) -> None:
    t = store.create_table("t", ("k",))
    t.append(pa.table({"k": [1, 2, 3], "ts": [9, 1, None], "v": ["a9", "b1", "cnull"]}))
    t.append(pa.table({"k": [1, 2], "ts": [2, 8], "v": ["a2", "b8"]}))
    store.create_table("t", ("k",), order_by="ts")
    t.append(pa.table({"k": [1, 2, 3], "ts": [5, 5, 0], "v": ["a5", "b5", "c0"]}))
    t.append(pa.table({"k": [1], "ts": [1], "v": ["a1"]}))
    head = store.table("t").head.commit_seq
    answers = {seq: values(store, "t", seq) for seq in range(1, head + 1)}
    assert answers[head] == {1: "a5", 2: "b8", 3: "c0"}  # a1 loses to a5; b8 (before) beats b5
    folded = store.fold("t", small_bytes=1 << 30)
    assert folded is not None and folded.parts_added == 2  # one part each side of the declaration
    for seq, want in answers.items():
        assert values(store, "t", seq) == want, seq
    assert values(store, "t") == answers[head]
    # A row landing after the fold still merges by the same rule.
    t.append(pa.table({"k": [2], "ts": [7], "v": ["b7"]}))
    assert values(store, "t")[2] == "b8"


def test_a_fold_before_a_declaration_keeps_what_the_declaration_will_answer(store: Store) -> None:
    t = store.create_table("t", ("k",))
    t.append(pa.table({"k": [1], "ts": [9], "v": ["a9"]}))
    t.append(pa.table({"k": [1], "ts": [1], "v": ["a1"]}))
    assert store.fold("t", small_bytes=1 << 30) is not None  # drops a9: superseded by commit order
    store.create_table("t", ("k",), order_by="ts")
    t.append(pa.table({"k": [1], "ts": [5], "v": ["a5"]}))
    assert values(store, "t") == {1: "a5"}  # as the unfolded table: a9 stopped counting before the declaration
    assert values(store, "t", 2) == {1: "a1"}


def test_a_declaration_made_with_the_table_is_in_force_from_its_start(store: Store) -> None:
    t = store.create_table("t", ("k",), order_by="ts")
    assert (t.head.order_by, t.head.order_by_seq, t.head.commit_seq) == ("ts", 0, 0)
    t.append(pa.table({"k": [1], "ts": [9], "v": ["a9"]}))
    t.append(pa.table({"k": [1], "ts": [1], "v": ["a1"]}))
    assert values(store, "t") == {1: "a9"} and values(store, "t", 1) == {1: "a9"}


def test_a_catalog_written_before_declarations_were_commits_reads_its_order_by_from_commit_zero(
        local_store: Store) -> None:
    t = local_store.create_table("t", ("k",))
    t.append(pa.table({"k": [1], "ts": [9], "v": ["a9"]}))
    t.append(pa.table({"k": [1], "ts": [1], "v": ["a1"]}))
    catalog = local_store.catalog
    assert isinstance(catalog, SqliteCatalog)
    # What the old declare_order_by wrote: the declaration in place, with no commit of its own.
    catalog._write(lambda cur: cur.execute("UPDATE cf_tables SET primary_key = ? WHERE name = 't'",
                                           (json.dumps({"key": ["k"], "order_by": "ts"}),)))
    head = local_store.table("t").head
    assert (head.order_by, head.order_by_seq, head.commit_seq) == ("ts", 0, 2)
    assert values(local_store, "t") == {1: "a9"} and values(local_store, "t", 1) == {1: "a9"}


def test_concurrent_declarations_land_one_commit_and_the_first_column(make_store) -> None:
    first = make_store()
    first.create_table("t", ("k",)).append(pa.table({"k": [1], "ts": [1], "u": [2], "v": ["a"]}))
    stores = [first, make_store()]
    ready = threading.Barrier(2)
    results: list[int | None] = [None, None]

    def declare(i: int, column: str) -> None:
        table = stores[i].table("t")
        ready.wait()
        results[i] = table.declare_order_by(column)

    threads = [threading.Thread(target=declare, args=(i, c)) for i, c in enumerate(("ts", "u"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    landed = [r for r in results if r is not None]
    assert landed == [2]
    head = first.table("t").head
    assert head.order_by == ("ts", "u")[results.index(2)] and head.order_by_seq == 2 and head.commit_seq == 2
    assert [c.kind for c in first.table("t").commits()] == ["append", "declare"]


def test_a_text_order_by_of_iso_stamps_merges_by_instant_not_by_text(store: Store) -> None:
    """A JSON timestamp lands as the text that arrived; ``order_by`` on it compares instants. As
    text ``…05Z`` sorts above ``…05.5Z`` and ``01:00+02:00`` above ``00:30Z``: the older row won."""
    t = store.create_table("t", ("k",), order_by="ts")
    t.append(pa.table({"k": [1, 2, 3, 4], "v": ["a-new", "b-new", "c-new", "d-stamp"],
                       "ts": ["2024-01-01T00:00:05.5Z", "2024-01-01T00:30:00Z", "2024-01-01 00:00:07",
                              "2024-01-01T00:00:00Z"]}))
    t.append(pa.table({"k": [1, 2, 3, 4], "v": ["a-old", "b-old", "c-old", "d-text"],
                       "ts": ["2024-01-01T00:00:05Z", "2024-01-01T01:00:00+02:00", "2024-01-01T00:00:06.999999",
                              "not a stamp"]}))
    assert values(store, "t") == {1: "a-new", 2: "b-new", 3: "c-new", 4: "d-stamp"}
    assert store.fold("t") is not None  # the fold keeps the same winners
    assert len(store.table("t").snapshot().parts) == 1
    assert values(store, "t") == {1: "a-new", 2: "b-new", 3: "c-new", 4: "d-stamp"}
