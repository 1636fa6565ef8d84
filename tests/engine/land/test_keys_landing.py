"""Keys on the landing path (issue 12): a null key fails its input by name and row, never merged
away, and a relational pipeline with a keyed root re-lands the same rows without doubling or
orphaning their child rows. Run against the SQLite and the PostgreSQL catalog."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.config.manifest import Manifest, PipelineSpec, SourceSpec
from contextful.engine.land.decode import Decoder
from contextful.engine.land.receive.server import ReceiveServer, serve_receivers
from contextful.engine.project import parse_project
from contextful.engine.read import connect
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store

from tests.engine.land.test_receive import PIPELINE, issue_writer, land_lock_held, post, sidecars, wait_for

MANIFEST = """
[project]
name = "keys"

[[pipeline]]
id = "ev"
table = "ev"
normalize = "{mode}"
primary_key = ["id"]
{order_by}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


@pytest.fixture(params=["local", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


def project(tmp_path: Path, mode: str, order_by: str | None = None) -> Path:
    root = tmp_path / "project"
    (root / "raw").mkdir(parents=True)
    (root / "contextful.toml").write_text(MANIFEST.format(mode=mode, order_by=f'order_by = "{order_by}"' if order_by else ""))
    return root


def write(root: Path, name: str, rows: list[dict[str, Any]]) -> str:
    path = root / "raw" / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def count(store: Store, sql: str) -> int:
    con = connect(store)
    try:
        row = con.execute(sql).fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


@pytest.mark.parametrize("mode", ["nested", "relational"])
def test_a_null_key_fails_its_input_by_name_and_row_and_merges_nothing(
        tmp_path: Path, store: Store, decoder: Decoder, mode: str) -> None:
    root = project(tmp_path, mode)
    write(root, "a.ndjson", [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    bad = write(root, "b.ndjson", [{"id": 3, "v": "c"}, {"id": 4, "v": "d"}, {"id": None, "v": "e"},
                                   {"id": None, "v": "f"}])
    [result] = run_pipelines(store, load_manifest(root), decoder=decoder)
    [failure] = result.failures
    assert failure.input == bad and failure.error == "PrimaryKeyNull"
    assert f"input {bad}, row 3" in failure.detail and "'id'" in failure.detail
    assert sorted(store.table("ev").to_arrow().column("v").to_pylist()) == ["a", "b"]


def test_re_landing_a_keyed_relational_root_replaces_its_child_rows(tmp_path: Path, store: Store,
                                                                    decoder: Decoder) -> None:
    root = project(tmp_path, "relational")
    rows = [{"id": 1, "tags": ["x", "y"], "items": [{"sku": "a", "parts": [1, 2]}]},
            {"id": 2, "tags": ["z"], "items": []}]
    write(root, "a.ndjson", rows)
    manifest = load_manifest(root)
    run_pipelines(store, manifest, decoder=decoder)
    write(root, "b.ndjson", rows)  # the same rows again, in another input
    changed = [{"id": 2, "tags": ["w"], "items": [{"sku": "b", "parts": [3]}]}]
    write(root, "c.ndjson", changed)
    [result] = run_pipelines(store, manifest, decoder=decoder)
    assert result.ok
    assert count(store, "SELECT count(*) FROM ev") == 2
    assert count(store, "SELECT count(*) FROM ev__tags") == 3
    assert count(store, "SELECT count(*) FROM ev__items") == 2
    assert count(store, "SELECT count(*) FROM ev__items__parts") == 3
    for child, parent in [("ev__tags", "ev"), ("ev__items", "ev"), ("ev__items__parts", "ev__items")]:
        assert count(store, f"SELECT count(*) FROM {child} c ANTI JOIN {parent} p ON c._cf_parent_id = p._cf_id") == 0
    con = connect(store)
    try:
        tags = con.execute("SELECT p.id, t.value FROM ev p JOIN ev__tags t ON t._cf_parent_id = p._cf_id "
                           "ORDER BY p.id, t._cf_list_idx").fetchall()
    finally:
        con.close()
    assert tags == [(1, "x"), (1, "y"), (2, "w")]
    assert store.table("ev__tags").primary_key == ("_cf_id",)


def test_child_rows_of_a_root_merging_by_order_by_follow_the_root_rows_winner(tmp_path: Path, store: Store,
                                                                             decoder: Decoder) -> None:
    root = project(tmp_path, "relational", order_by="ts")
    manifest = load_manifest(root)
    write(root, "a.ndjson", [{"id": 1, "ts": 2, "tags": ["new", "newer"]}, {"id": 2, "ts": 1, "tags": ["b"]}])
    run_pipelines(store, manifest, decoder=decoder)
    write(root, "b.ndjson", [{"id": 1, "ts": 1, "tags": ["old", "older"]}, {"id": 2, "ts": 3, "tags": ["c"]}])
    [result] = run_pipelines(store, manifest, decoder=decoder)
    assert result.ok
    con = connect(store)
    try:
        tags = con.execute("SELECT p.id, p.ts, t.value FROM ev p JOIN ev__tags t ON t._cf_parent_id = p._cf_id "
                           "ORDER BY p.id, t._cf_list_idx").fetchall()
    finally:
        con.close()
    assert tags == [(1, 2, "new"), (1, 2, "newer"), (2, 3, "c")]
    assert store.table("ev__tags").head.order_by == "_cf_order"


def serve_keyed(tmp_path: Path, decoder: Decoder) -> ReceiveServer:
    """A receive server for a pipeline keyed on ``id`` merging by ``ts``, with a writer key issued."""
    project_, problems = parse_project({}, tmp_path)
    assert not problems
    spec = PipelineSpec(id=PIPELINE, source=SourceSpec("receive", {"key_retention_secs": 60}), table=PIPELINE,
                        primary_key=("id",), order_by="ts")
    server = serve_receivers(lambda: Store.open(tmp_path / ".contextful" / "store"), Manifest(tmp_path, project_, (spec,)),
                             "127.0.0.1:0", queue_root=tmp_path / ".contextful" / "queue", decoder=decoder)
    issue_writer(tmp_path, server.url)
    assert server.recovered(timeout=30)
    return server


def test_received_batches_merge_by_order_by_and_a_null_key_answers_422_by_name(tmp_path: Path,
                                                                                decoder: Decoder) -> None:
    server = serve_keyed(tmp_path, decoder)
    try:
        assert post(server.url, "k1", b'{"id": 1, "ts": 2, "v": "new"}\n')[0] == 200
        assert post(server.url, "k2", b'{"id": 1, "ts": 1, "v": "old"}\n')[0] == 200
        status, doc = post(server.url, "k3", b'{"id": 2, "ts": 1}\n{"id": null, "ts": 1}\n')
        assert (status, doc["error"]) == (422, "PrimaryKeyNull")
        assert "batch 'k3', row 2" in doc["detail"]
    finally:
        server.shutdown(grace_s=10)
    with Store.open(tmp_path / ".contextful" / "store") as store:
        assert store.table(PIPELINE).to_arrow().select(["id", "v"]).to_pylist() == [{"id": 1, "v": "new"}]


def test_table_load_names_the_file_and_row_of_a_null_key_and_lands_nothing(tmp_path: Path, store: Store,
                                                                           decoder: Decoder) -> None:
    from contextful.engine.load import load_file
    from contextful.storage.errors import PrimaryKeyNull

    path = tmp_path / "rows.ndjson"
    path.write_text("".join(json.dumps({"id": i if i != 3 else None}) + "\n" for i in range(5)))
    with pytest.raises(PrimaryKeyNull) as caught:
        load_file(store, "t", path, primary_key=("id",), decoder=decoder)
    assert (caught.value.input, caught.value.row) == (f"input {path.resolve()}", 4)  # 1-based: the fourth record
    assert "t" not in store.table_names()  # the load created it and landed nothing: the table went too


def test_a_received_batch_whose_key_would_widen_lossily_fails_alone_and_the_queue_drains(
        tmp_path: Path, decoder: Decoder) -> None:
    """Both batches pass admission against the empty table; the int64 one lands first, and the float
    one must then fail by name (once), not fail its group's commit on every landing."""
    big = 2**53
    server = serve_keyed(tmp_path, decoder)
    try:
        with ThreadPoolExecutor(2) as pool:
            with land_lock_held(tmp_path):
                ints = pool.submit(post, server.url, "ints", f'{{"id": {big}, "ts": 1}}\n{{"id": {big + 1}, "ts": 1}}\n'.encode())
                wait_for(lambda: len(sidecars(tmp_path)) == 1, "the int64 batch spooled")
                floats = pool.submit(post, server.url, "floats", b'{"id": 0.5, "ts": 1}\n')
                wait_for(lambda: len(sidecars(tmp_path)) == 2, "both batches spooled")
            assert ints.result(timeout=120)[0] == 200
            status, doc = floats.result(timeout=120)
        assert (status, doc["error"]) == (422, "PrimaryKeyWideningLossy")
        assert sidecars(tmp_path) == []
    finally:
        server.shutdown(grace_s=10)
    with Store.open(tmp_path / ".contextful" / "store") as store:
        assert sorted(store.table(PIPELINE).to_arrow().column("id").to_pylist()) == [big, big + 1]
