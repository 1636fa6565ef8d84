"""A child table's lifetime rule in the store (issue 26; storage.follows, docs/store.md "Lifetime
rules"), on every store kind: a row is answered only while the root, read at the same point,
answers its root row version; the declaration is a commit of its own, kept beside ``order_by``."""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.engine.read import connect
from contextful.storage import ManualClock, Store
from contextful.storage.errors import TableNameInvalid
from contextful.storage.follows import Follows

from tests.storage.catalog_place import CatalogPlace

RULE = Follows("root")


def root_rows(*rows: tuple[str, int, int]) -> pa.Table:
    """Root rows ``(_cf_id, _cf_version, ts)``."""
    ids, versions, ts = zip(*rows, strict=True)
    return pa.table({"_cf_id": list(ids), "_cf_version": pa.array(versions, pa.int64()), "ts": list(ts)})


def child_rows(*rows: tuple[str, int, str]) -> pa.Table:
    """Child rows ``(_cf_root_id, _cf_version, value)``, one per element, indexes in order."""
    out: dict[str, list] = {"_cf_id": [], "_cf_root_id": [], "_cf_version": [], "value": []}
    seen: dict[tuple[str, int], int] = {}
    for root, version, value in rows:
        index = seen[root, version] = seen.get((root, version), -1) + 1
        for column, v in zip(out, (f"{root}.{index}", root, version, value), strict=True):
            out[column].append(v)
    return pa.table({**out, "_cf_version": pa.array(out["_cf_version"], pa.int64())})


def values(store: Store, **at: object) -> list[str]:
    return sorted(store.table("child").to_arrow(**at).column("value").to_pylist())  # type: ignore[arg-type]


def test_a_child_row_answers_while_the_root_answers_its_version_whatever_reads_it(store: Store) -> None:
    root = store.create_table("root", ("_cf_id",), order_by="ts")
    child = store.create_table("child", ("_cf_id",), follows=RULE)
    root.append(root_rows(("a", 1, 5), ("b", 2, 5)))
    child.append(child_rows(("a", 1, "a0"), ("a", 1, "a1"), ("a", 1, "a2"), ("b", 2, "b0")))
    assert values(store) == ["a0", "a1", "a2", "b0"]
    # a newer version of a with one element; an older version of b, which loses the root's merge
    root.append(root_rows(("a", 3, 6), ("b", 4, 1)))
    child.append(child_rows(("a", 3, "A0"), ("b", 4, "B0"), ("b", 4, "B1")))
    assert values(store) == ["A0", "b0"]
    # a newer version of a with no element: the child table has no commit, its rows leave all the same
    root.append(root_rows(("a", 5, 7)))
    assert values(store) == ["b0"]
    con = connect(store)
    try:
        assert con.sql("SELECT value FROM child").fetchall() == [("b0",)]
    finally:
        con.close()
    assert store.fold("child", small_bytes=1 << 40) is not None
    assert values(store) == ["b0"]
    assert [p.rows for p in store.table("child").snapshot().parts] == [1]  # the fold dropped what never answers again
    assert store.drop_table("root")
    assert values(store) == []  # no root: no row of it


def test_the_declaration_is_a_commit_of_its_own_kept_beside_order_by(store: Store) -> None:
    store.create_table("root", ("_cf_id",)).append(root_rows(("a", 1, 1)))
    child = store.create_table("child", ("_cf_id",))
    before = child.append(child_rows(("a", 7, "old"))).commit_seq
    assert values(store) == ["old"]
    declared = store.create_table("child", ("_cf_id",), "ts", follows=RULE)
    assert declared.head.follows == RULE and declared.head.order_by == "ts"
    assert declared.head.follows_seq > before
    assert values(store) == []  # version 7 is not the root's
    assert values(store, commit_seq=before) == ["old"]  # a snapshot below the declaration answers as before
    with pytest.raises(TableNameInvalid, match="follows\\(root=other"):
        store.create_table("child", ("_cf_id",), follows=Follows("other"))
    with pytest.raises(TableNameInvalid, match="needs a primary key"):
        store.create_table("plain", follows=RULE)


def test_the_rule_reads_back_from_the_catalog(place: CatalogPlace) -> None:
    with place.store(ManualClock()) as store:
        store.create_table("child", ("_cf_id",), follows=RULE)
        store.table("child").declare_order_by("ts")
    with place.store(ManualClock()) as other:
        head = other.table("child").head
        assert (head.follows, head.follows_seq, head.order_by) == (RULE, 0, "ts")
