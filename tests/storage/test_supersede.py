"""A derive output table's supersede rule in the store (issue 16; storage.supersede, docs/store.md
"Supersede rules"), on the SQLite and the PostgreSQL catalog: what a reader sees at each commit,
what the next fold drops, rows kept per task version, a key changed and changed back, and the rule
kept in the catalog's merge declaration."""

from __future__ import annotations

from typing import Any

import contextful.engine.read
import pyarrow as pa
import pytest
from contextful.storage import ManualClock, Store
from contextful.storage.catalog.sql import _Merge
from contextful.storage.errors import TableNameInvalid
from contextful.storage.supersede import Supersede

from tests.storage.catalog_place import CatalogPlace

KEY = ("unit_ref", "derivation_key", "cue_seq")
RULE = Supersede(("unit_ref",))


def land(store: Store, table: str, *units: tuple[Any, ...], version: str | None = None) -> int:
    """One commit landing, per unit, ``(unit, key, status, kind, texts)``; its commit_seq."""
    rows: dict[str, list[Any]] = {c: [] for c in (*KEY, "unit_status", "kind", "text")}
    for unit, key, status, kind, texts in units:
        for cue, text in enumerate(texts):
            for column, value in zip(rows, (unit, key, cue, status, kind, text)):
                rows[column].append(value)
    if version is not None:
        rows["task_version"] = [version] * len(rows["text"])
    return store.table(table).append(pa.table(rows)).commit_seq


def texts(store: Store, table: str = "passages", commit_seq: int | None = None, unit: str | None = None) -> list[str]:
    return sorted(r["text"] for r in store.table(table).to_arrow(commit_seq=commit_seq).to_pylist()
                  if unit is None or r["unit_ref"] == unit)


@pytest.mark.clause("run.emit.stale-supersedes")
def test_old_rows_answer_until_the_new_settling_landing_and_the_next_fold_drops_them(place: CatalogPlace) -> None:
    store = place.store(ManualClock())
    try:
        store.create_table("passages", KEY, supersede=RULE)
        first = land(store, "passages", ("u", "A", "ok", "passage", ["u-a0", "u-a1", "u-a2"]),
                     ("v", "A", "ok", "passage", ["v-a0"]))
        # The unit re-derives under key B: an attempt that lands no answer first, then its passages.
        attempt = land(store, "passages", ("u", "B", "unavailable", "marker", ["u-b-unavailable"]))
        settled = land(store, "passages", ("u", "B", "ok", "passage", ["u-b0", "u-b1"]))
        answers = {seq: texts(store, commit_seq=seq, unit="u") for seq in (first, attempt, settled)}
        assert answers == {first: ["u-a0", "u-a1", "u-a2"],
                           attempt: ["u-a0", "u-a1", "u-a2", "u-b-unavailable"],  # never empty
                           settled: ["u-b0", "u-b1"]}
        assert texts(store) == ["u-b0", "u-b1", "v-a0"]
        with contextful.engine.read.connect(store) as con:  # the read path's views answer the same
            assert sorted(r[0] for r in con.execute("SELECT text FROM passages").fetchall()) == texts(store)

        head = store.table("passages").snapshot()
        assert (len(head.parts), head.rows_stored) == (3, 7)
        folded = store.fold("passages", small_bytes=1 << 30)
        assert folded is not None and (folded.parts_removed, folded.parts_added) == (3, 1)
        head = store.table("passages").snapshot()
        assert (len(head.parts), head.rows_stored) == (1, 3)  # the superseded rows are gone
        assert texts(store) == ["u-b0", "u-b1", "v-a0"]
        for seq, want in answers.items():  # earlier snapshots read the absorbed parts still
            assert texts(store, commit_seq=seq, unit="u") == want
    finally:
        store.close()


@pytest.mark.clause("run.emit.version-retained")
def test_rows_under_an_earlier_task_version_stay_current_beside_the_newer_versions(place: CatalogPlace) -> None:
    store = place.store(ManualClock())
    try:
        key = ("unit_ref", "task_version", "derivation_key", "cue_seq")
        store.create_table("retained", key, supersede=Supersede(("unit_ref", "task_version")))
        store.create_table("latest", key, supersede=Supersede(("unit_ref",)))
        for table in ("retained", "latest"):
            land(store, table, ("u", "K1", "ok", "passage", ["v1-k1"]), version="1")
            land(store, table, ("u", "K2", "ok", "passage", ["v2-k2"]), version="2")
        assert texts(store, "retained") == ["v1-k1", "v2-k2"]
        assert texts(store, "latest") == ["v2-k2"]  # without retained versions the newer landing wins
        # Within one version the rule holds as ever: a new key under version 2 retires K2 only.
        land(store, "retained", ("u", "K3", "empty", "marker", ["v2-k3-empty"]), version="2")
        assert texts(store, "retained") == ["v1-k1", "v2-k3-empty"]
        store.fold("retained", small_bytes=1 << 30)
        assert texts(store, "retained") == ["v1-k1", "v2-k3-empty"]
        assert store.table("retained").snapshot().rows_stored == 2
    finally:
        store.close()


@pytest.mark.clause("run.select.key-change")
def test_a_key_changed_and_changed_back_answers_only_the_last_landing_under_it(place: CatalogPlace) -> None:
    store = place.store(ManualClock())
    try:
        store.create_table("passages", KEY, supersede=RULE)
        first_a = land(store, "passages", ("u", "A", "ok", "passage", ["a-first-0", "a-first-1", "a-first-2"]))
        b = land(store, "passages", ("u", "B", "ok", "passage", ["b-0", "b-1"]))
        assert texts(store, commit_seq=first_a) == ["a-first-0", "a-first-1", "a-first-2"]
        assert texts(store, commit_seq=b) == ["b-0", "b-1"]
        land(store, "passages", ("u", "A", "empty", "marker", ["a-again-empty"]))
        # The first A landing's rows count for nothing: only the last landing under A answers (its
        # marker replaces cue 0 by key; cues 1 and 2 are retired by B's landing between them).
        assert texts(store) == ["a-again-empty"]
        store.fold("passages", small_bytes=1 << 30)
        assert texts(store) == ["a-again-empty"]
        assert store.table("passages").snapshot().rows_stored == 1
        land(store, "passages", ("u", "A", "ok", "passage", ["a-third-0"]))  # after the fold, as before
        assert texts(store) == ["a-third-0"]
    finally:
        store.close()


def test_a_fold_after_a_larger_part_keeps_the_units_that_part_holds_exact(local_store: Store) -> None:
    """A unit with rows before the fold's run keeps its rows where they are when the run holds rows of
    it that the run withholds: dropping them would revive a row of the older part."""
    store = local_store
    store.create_table("passages", KEY, supersede=RULE)
    filler = [f"w-{i}" for i in range(200)]  # makes the first part the largest
    land(store, "passages", ("u", "C", "ok", "passage", ["c-0", "c-1", "c-2"]), ("w", "C", "ok", "passage", filler))
    land(store, "passages", ("u", "A", "ok", "passage", ["a-0"]))
    land(store, "passages", ("u", "C", "empty", "marker", ["c-again-empty"]), ("x", "A", "ok", "passage", ["x-0"]))
    land(store, "passages", ("x", "B", "ok", "passage", ["x-b0"]))
    want = texts(store)
    assert want == sorted(["c-again-empty", *filler, "x-b0"])  # c-1 and c-2 stay retired by A's landing
    big = store.table("passages").snapshot().parts[0].bytes
    folded = store.fold("passages", small_bytes=big)  # the first part is not small: the run is the last three
    assert folded is not None and folded.parts_removed == 3
    assert texts(store) == want
    parts = store.table("passages").snapshot().parts
    # x (no row before the run) folded to its answer; u's rows in the run stay as stored, in place.
    assert sorted(p.rows for p in parts) == [1, 1, 1, len(filler) + 3]
    land(store, "passages", ("u", "C", "ok", "passage", ["c-3-0"]))
    assert texts(store, unit="u") == ["c-3-0"]


def test_the_rule_is_kept_in_the_merge_declaration_and_old_declarations_still_read(place: CatalogPlace) -> None:
    store = place.store(ManualClock())
    try:
        store.create_table("passages", KEY, supersede=RULE)
        store.create_table("plain", KEY)
        other = place.store(ManualClock())  # another connection reads the rule back from the catalog
        try:
            assert other.table("passages").head.supersede == RULE
            assert other.table("plain").head.supersede is None
            assert other.create_table("passages", KEY).head.supersede == RULE  # asking for none keeps it
        finally:
            other.close()
    finally:
        store.close()
    assert _Merge.parse('["k"]') == _Merge(("k",))
    assert _Merge.parse('{"key": ["k"], "order_by": "ts"}') == _Merge(("k",), "ts")
    assert _Merge(("k",)).text() == '["k"]'
    assert _Merge.parse(_Merge(KEY, supersede=RULE).text()) == _Merge(KEY, supersede=RULE)


def test_a_rule_differing_from_the_tables_or_not_fitting_its_key_is_refused(local_store: Store) -> None:
    store = local_store
    store.create_table("plain", KEY)
    store.create_table("passages", KEY, supersede=RULE)
    with pytest.raises(TableNameInvalid, match="holds no supersede rule"):
        store.create_table("plain", KEY, supersede=RULE)
    with pytest.raises(TableNameInvalid, match=r"holds supersede\(unit=unit_ref;.*not supersede\(unit=unit_ref, cue_seq"):
        store.create_table("passages", KEY, supersede=Supersede(("unit_ref", "cue_seq")))
    with pytest.raises(TableNameInvalid, match="task_version, not in its primary key"):
        store.create_table("versioned", KEY, supersede=Supersede(("unit_ref", "task_version")))
    with pytest.raises(TableNameInvalid, match="takes no order_by"):
        store.create_table("ordered", KEY, order_by="cue_seq", supersede=RULE)
    with pytest.raises(TableNameInvalid, match="supersede rule"):
        store.table("passages").declare_order_by("cue_seq")
    assert store.table_names() == ["passages", "plain"]
    assert store.table("plain").head.supersede is None
