"""Where a run manifest is kept: a small run's rides in its commit's catalog row; a large one, and
every run of a store written before that (format 1), is an object under ``tables/<t>/runs/``.

Each test goes through ``Store.append`` / ``Table`` / ``Store.collect`` on every adapter (local
SQLite, PostgreSQL catalog, S3 objects) and checks what the reader answers against what was landed
(docs/store.md, "Run manifests").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.errors import CommitConflict, StoreFormatNewer
from contextful.storage.manifest import INLINE_MANIFEST_BYTES, manifest_key
from contextful.storage.store import STORE_FORMAT

FORMAT1_STORE = Path(__file__).parent / "data" / "store_format1"


def run_objects(store: Store, table: str) -> list[str]:
    return sorted(o.key for o in store.objects.list(f"tables/{table}") if "/runs/" in o.key)


def wide(columns: int) -> pa.Table:
    """One row of ``columns`` columns with long names: a manifest larger than the inline bound."""
    return pa.table({f"a_column_with_a_rather_long_descriptive_name_{i:05d}": [float(i)] for i in range(columns)})


@pytest.mark.clause("run.record.schema-diff-home")
def test_small_run_keeps_its_manifest_in_its_commit(store: Store) -> None:
    """A one-row run writes no manifest object: its commit's catalog row holds it, and the table
    answers it (parts, rows, cursor, downgrade events) under the run id."""
    first = store.append("t", pa.table({"id": pa.array([1], pa.int32()), "name": ["a"]}), cursor=("src", 5))
    second = store.append("t", pa.table({"id": pa.array([2], pa.int64()), "name": ["b"]}), cursor=("src", 7))
    assert run_objects(store, "t") == []
    table = store.table("t")
    commits = {c.run_id: c for c in table.commits()}
    live = {p.path: p.rows for p in store.catalog.live_parts("t", table.head.commit_seq)}
    for result, cursor in ((first, 5), (second, 7)):
        manifest = table.manifest(result.run_id)
        assert commits[result.run_id].manifest == manifest_key("t", result.run_id)
        assert (manifest.run_id, manifest.kind, manifest.rows) == (result.run_id, "append", 1)
        assert manifest.cursor == {"scope": "src", "value": cursor}
        assert {p.path: p.rows for p in manifest.parts}.items() <= live.items()
    assert [(e.path, e.kind) for e in table.manifest(second.run_id).downgrade_events] == [("id", "widening")]
    assert table.cursor("src") == (7, second.commit_seq)
    assert sorted(table.to_arrow().column("id").to_pylist()) == [1, 2]


def test_large_manifest_is_an_object(store: Store) -> None:
    """A manifest over the inline bound is written durably under its key before the commit and read
    back from there; the catalog keeps no copy."""
    data = wide(1_000)
    result = store.append("w", data)
    key = manifest_key("w", result.run_id)
    assert run_objects(store, "w") == [key]
    assert len(store.objects.get_bytes(key)) > INLINE_MANIFEST_BYTES
    assert store.catalog.manifest_doc("w", result.run_id) is None
    manifest = store.table("w").manifest(result.run_id)
    assert manifest.rows == 1 and [c["name"] for c in manifest.to_json()["columns"]] == data.column_names


def test_collection_keeps_every_manifest_readable(store: Store) -> None:
    """Collection with no grace removes no manifest a commit names, in either place, and a fold's
    manifest is kept like a run's."""
    small = [store.append("t", pa.table({"id": [i]})) for i in range(3)]
    large = store.append("w", wide(1_000))
    folded = store.fold("t")
    assert folded is not None
    store.collect(grace_seconds=0)
    assert run_objects(store, "t") == []
    assert run_objects(store, "w") == [manifest_key("w", large.run_id)]
    for result in small:
        assert store.table("t").manifest(result.run_id).rows == 1
    assert store.table("w").manifest(large.run_id).rows == 1
    fold_commit = store.table("t").commits()[-1]
    assert fold_commit.kind == "fold"
    assert store.table("t").manifest(fold_commit.run_id).kind == "fold"


def test_a_commit_that_does_not_land_keeps_no_manifest(store: Store) -> None:
    """The manifest is in the commit's transaction: a run whose commit is refused leaves no
    manifest in the catalog and none as an object."""
    store.create_table("t")
    txn = store.table("t").transaction()
    txn.stage(pa.table({"id": [1]}))
    store.drop_table("t")
    store.create_table("t")  # another incarnation: the run's AssertTableUUID fails
    with pytest.raises(CommitConflict):
        txn.commit()
    txn.abort()
    assert store.catalog.manifest_doc("t", txn.run_id) is None
    assert run_objects(store, "t") == []
    assert store.table("t").commits() == []


def test_store_written_with_manifest_objects_still_reads(tmp_path: Path) -> None:
    """A store written by format 1 (every manifest an object; its catalog without ``cf_manifests``,
    made by main at ae41ade, tests/storage/data/store_format1/README.md) opens, answers its rows
    and manifests, keeps them through collection, and stays format 1: its new runs' manifests are
    objects too, so a build that reads only objects still reads every run of it."""
    root = tmp_path / "store"
    shutil.copytree(FORMAT1_STORE / "store", root)
    expected = duckdb.sql(f"SELECT id, name FROM read_parquet('{root}/tables/events/parts/*.parquet')"
                          " ORDER BY id").fetchall()
    with Store.open(root) as store:
        events = store.table("events")
        assert sorted(zip(*events.to_arrow().select(["id", "name"]).to_pydict().values())) == expected
        old = [c for c in events.commits() if c.kind == "append"]
        assert [events.manifest(c.run_id).cursor for c in old] == [
            {"scope": "src", "value": 5}, {"scope": "src", "value": 7}]
        assert events.cursor("src") == (7, old[-1].commit_seq)
        keyed = store.table("keyed").to_arrow().sort_by("k")
        assert keyed.to_pydict() == {"k": ["x", "y"], "v": [3.0, 2.0]}
        before = run_objects(store, "events")
        assert before == sorted(manifest_key("events", c.run_id) for c in old)
        new = store.append("events", pa.table({"id": pa.array([4], pa.int64()), "name": ["d"]}), cursor=("src", 9))
        store.collect(grace_seconds=0)
        assert run_objects(store, "events") == sorted([*before, manifest_key("events", new.run_id)])
        assert store.catalog.manifest_doc("events", new.run_id) is None
        assert [events.manifest(c.run_id).rows for c in old] == [2, 1]
        assert events.manifest(new.run_id).cursor == {"scope": "src", "value": 9}
        assert events.cursor("src") == (9, new.commit_seq)
    assert json.loads((root / "store.json").read_text())["format"] == 1


def test_a_new_store_is_format_two(tmp_path: Path) -> None:
    """A store this build creates says so in its ``store.json``: format 2, small manifests in the catalog."""
    with Store.open(tmp_path / "s") as store:
        store.append("t", pa.table({"id": [1]}))
        assert run_objects(store, "t") == []
    assert json.loads((tmp_path / "s" / "store.json").read_text())["format"] == STORE_FORMAT == 2


def test_a_newer_store_format_is_refused(tmp_path: Path) -> None:
    """A store a newer build wrote (a format this build does not know) opens nothing: it may keep
    what this build would not find. Refused by name, for a writer and a reader alike, and untouched."""
    root = tmp_path / "s"
    with Store.open(root) as store:
        store.append("t", pa.table({"id": [1]}))
    doc = json.loads((root / "store.json").read_text())
    (root / "store.json").write_text(json.dumps({**doc, "format": STORE_FORMAT + 1}))
    before = sorted(p.name for p in root.rglob("*"))
    for create in (True, False):
        with pytest.raises(StoreFormatNewer) as caught:
            Store.open(root, create=create)
        assert (caught.value.found, caught.value.supported) == (STORE_FORMAT + 1, STORE_FORMAT)
        assert "upgrade contextful" in str(caught.value)
    assert sorted(p.name for p in root.rglob("*")) == before
