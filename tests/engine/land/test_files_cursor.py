"""The ``files`` cursor identifies inputs by where they sit under the project and by their content:
appended NDJSON lands only its new rows, a renamed file and a moved project land nothing again, a
rewrite that keeps size and mtime is caught, HTTP inputs are told apart by Last-Modified, and
cursors written before these rules carry forward. Real stores on SQLite and PostgreSQL catalogs."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.files import list_inputs
from contextful.engine.land.pipeline import cursor_scope, plan_pipeline, run_pipeline
from contextful.engine.land.seed import seed_fingerprint, seed_scope
from contextful.storage import Store

from tests.conftest import StoreFactory
from tests.support.http_api import JsonApi, Reply

CATALOGS = pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres)],
                                   indirect=True)

MANIFEST = """
[project]
name = "files"

[[pipeline]]
id = "events"
{extra}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = {paths}
"""


def project(root: Path, paths: str = '["raw/*.ndjson"]', extra: str = "") -> Any:
    root.mkdir(parents=True, exist_ok=True)
    text = MANIFEST.format(paths=paths, extra=extra)
    (root / "contextful.toml").write_text(text)
    return parse_manifest(tomllib.loads(text), root)


def write(path: Path, first: int, count: int, mode: str = "w") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as fh:
        fh.writelines(json.dumps({"id": i, "v": f"row {i:03d}", "at": "2025-06-01T00:00:00Z"}) + "\n" for i in range(first, first + count))
    return path


def run(store: Store, manifest: Any, decoder: Decoder) -> Any:
    return run_pipeline(store, manifest, manifest.pipeline("events"), decoder)


def ids_of(store: Store) -> list[int]:
    return sorted(r["id"] for r in store.table("events").to_arrow().to_pylist())


@CATALOGS
def test_an_appended_ndjson_file_lands_only_its_new_rows(tmp_path: Path, make_store: StoreFactory, store_kind: str,
                                                         decoder: Decoder) -> None:
    store = make_store()
    manifest = project(tmp_path / "p")
    log = write(tmp_path / "p" / "raw" / "log.ndjson", 0, 3)
    run(store, manifest, decoder)
    landed = log.stat().st_size
    write(log, 3, 2, mode="a")
    plan = plan_pipeline(store, manifest, manifest.pipeline("events")).to_json()
    assert plan["pull"] == [{"input": str(log), "bytes": log.stat().st_size - landed, "from_byte": landed}]
    result = run(store, manifest, decoder)
    assert result.ok and ids_of(store) == [0, 1, 2, 3, 4]
    assert run(store, manifest, decoder).tables[0].rows == 0 and ids_of(store) == [0, 1, 2, 3, 4]


@CATALOGS
def test_a_renamed_file_does_not_land_again(tmp_path: Path, make_store: StoreFactory, store_kind: str,
                                            decoder: Decoder) -> None:
    store = make_store()
    manifest = project(tmp_path / "p")
    first = write(tmp_path / "p" / "raw" / "a.ndjson", 0, 3)
    run(store, manifest, decoder)
    first.rename(first.with_name("b.ndjson"))
    result = run(store, manifest, decoder)
    assert result.ok and result.tables[0].rows == 0 and ids_of(store) == [0, 1, 2]
    value, _ = store.table("events").cursor(cursor_scope(manifest.pipeline("events")))
    assert list(value["inputs"]) == ["raw/b.ndjson"]  # the entry moved with the file


def test_a_rewrite_keeping_size_and_mtime_is_refused_by_name(tmp_path: Path, decoder: Decoder) -> None:
    manifest = project(tmp_path / "p")
    path = write(tmp_path / "p" / "raw" / "a.ndjson", 0, 3)
    with Store.open(tmp_path / "store") as store:
        run(store, manifest, decoder)
        stat = path.stat()
        path.write_text(path.read_text().replace("row 001", "row 999"))  # same size
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime restored
        result = run(store, manifest, decoder)
        [failure] = result.failures
        assert failure.error == "InputChanged" and failure.input == str(path) and failure.exit_code == 5
        assert "a new name" in failure.detail
        assert [r["v"] for r in store.table("events").to_arrow().to_pylist()] == ["row 000", "row 001", "row 002"]


def test_a_landed_file_is_read_again_only_when_its_stat_changed(tmp_path: Path, decoder: Decoder,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Cost grows with new data, not history: an untouched landed file is known by its stat (no
    program sets a ctime back) and never hashed again; a touched one is hashed once, found the
    same, and its entry takes the new stat."""
    from contextful.engine.land import files

    manifest = project(tmp_path / "p")
    paths = [write(tmp_path / "p" / "raw" / f"{n}.ndjson", 10 * i, 3) for i, n in enumerate("abc")]
    hashed: list[str] = []
    real_hash = files.file_hash

    def counting(path: str, prefix: int | None = None) -> tuple[str | None, str]:
        hashed.append(Path(path).name)
        return real_hash(path, prefix)

    monkeypatch.setattr(files, "file_hash", counting)
    with Store.open(tmp_path / "store") as store:
        run(store, manifest, decoder)
        assert sorted(hashed) == ["a.ndjson", "b.ndjson", "c.ndjson"]  # new inputs: hashed as they land
        hashed.clear()
        result = run(store, manifest, decoder)
        assert (hashed, result.inputs_landed, result.inputs_skipped) == ([], [], 3)
        os.utime(paths[1])  # touched: content the same
        result = run(store, manifest, decoder)
        assert (hashed, result.inputs_landed, result.inputs_skipped) == (["b.ndjson"], [], 3)
        hashed.clear()
        run(store, manifest, decoder)  # the touched file's entry holds its new stat now
        assert hashed == [] and store.table("events").to_arrow().num_rows == 9


@CATALOGS
def test_a_moved_project_lands_nothing_again_and_its_seed_still_skips(tmp_path: Path, make_store: StoreFactory,
                                                                      store_kind: str, decoder: Decoder) -> None:
    store = make_store()
    seed = ('primary_key = ["id"]\norder_by = "at"\n[pipeline.seed]\npaths = ["seed/*.ndjson"]\n'
            'ceiling = "2026-01-01T00:00:00Z"\n')
    write(tmp_path / "old" / "seed" / "s.ndjson", 100, 2)
    write(tmp_path / "old" / "raw" / "a.ndjson", 0, 3)
    manifest = project(tmp_path / "old", extra=seed)
    run(store, manifest, decoder)
    assert ids_of(store) == [0, 1, 2, 100, 101]
    shutil.move(tmp_path / "old", tmp_path / "new")
    moved = project(tmp_path / "new", extra=seed)
    plan = plan_pipeline(store, moved, moved.pipeline("events"))
    assert plan.pull == [] and len(plan.skip) == 1
    result = run(store, moved, decoder)
    assert result.ok and result.seed is not None and result.seed["status"] == "skipped-equal"
    assert ids_of(store) == [0, 1, 2, 100, 101]


def test_an_http_input_with_only_last_modified_is_fingerprinted_by_it(tmp_path: Path, decoder: Decoder) -> None:
    served = {"body": b'{"id": 1}\n{"id": 2}\n', "modified": "Mon, 02 Mar 2026 10:00:00 GMT"}
    with JsonApi() as api:
        api.route("/data.ndjson", lambda request: Reply(200, served["body"], {
            "Content-Type": "application/x-ndjson", "Last-Modified": served["modified"]}))
        manifest = project(tmp_path / "p", paths=f'["{api.url}/data.ndjson"]')
        with Store.open(tmp_path / "store") as store:
            run(store, manifest, decoder)
            assert run(store, manifest, decoder).tables[0].rows == 0  # the same Last-Modified: landed
            served.update(body=b'{"id": 3}\n{"id": 4}\n', modified="Tue, 03 Mar 2026 10:00:00 GMT")  # same size
            [failure] = run(store, manifest, decoder).failures
            assert failure.error == "InputChanged" and failure.input == f"{api.url}/data.ndjson"
            assert ids_of(store) == [1, 2]


@CATALOGS
def test_a_cursor_of_the_old_form_carries_forward(tmp_path: Path, make_store: StoreFactory, store_kind: str,
                                                  decoder: Decoder) -> None:
    store = make_store()
    manifest = project(tmp_path / "p")
    kept = write(tmp_path / "p" / "raw" / "a.ndjson", 0, 2)
    touched = write(tmp_path / "p" / "raw" / "b.ndjson", 2, 2)
    write(tmp_path / "p" / "raw" / "c.ndjson", 4, 2)
    # what the old code committed: absolute paths to "size:mtime", after landing a and b
    txn = store.create_table("events").transaction("append")
    old = {str(p): f"{p.stat().st_size}:{p.stat().st_mtime}" for p in (kept, touched)}
    txn.set_cursor(cursor_scope(manifest.pipeline("events")), {"kind": "files", "inputs": old})
    txn.commit()
    os.utime(touched, (1, 1))  # its mtime no longer matches: whether it changed cannot be told
    result = run(store, manifest, decoder)
    assert ids_of(store) == [4, 5]  # a carried forward, c new, b refused by name
    [failure] = result.failures
    assert failure.error == "InputChanged" and failure.input == str(touched)
    value, _ = store.table("events").cursor(cursor_scope(manifest.pipeline("events")))
    assert set(value["inputs"]) == {"raw/a.ndjson", "raw/c.ndjson", str(touched)}
    assert run(store, manifest, decoder).tables[0].rows == 0


def test_a_seed_fingerprint_of_the_old_form_carries_forward_and_survives_a_move(tmp_path: Path,
                                                                                decoder: Decoder) -> None:
    seed = ('primary_key = ["id"]\norder_by = "at"\n[pipeline.seed]\npaths = ["seed/*.ndjson"]\n'
            'ceiling = "2026-01-01T00:00:00Z"\n')
    write(tmp_path / "old" / "seed" / "s.ndjson", 100, 2)
    write(tmp_path / "old" / "raw" / "a.ndjson", 0, 1)
    manifest = project(tmp_path / "old", extra=seed)
    inputs = list_inputs({"paths": ["seed/*.ndjson"]}, tmp_path / "old")
    with Store.open(tmp_path / "store") as store:
        txn = store.create_table("events", ("id",), "at").transaction("append")  # what the old code committed
        txn.set_cursor(seed_scope("events"), {"kind": "seed", "fingerprint": seed_fingerprint(inputs, old_form=True),
                                              "ceiling": "2026-01-01T00:00:00Z"})
        txn.commit()
        assert run(store, manifest, decoder).seed["status"] == "skipped-equal"
        assert store.table("events").cursor(seed_scope("events"))[0]["fingerprint"] == seed_fingerprint(inputs)
        shutil.move(tmp_path / "old", tmp_path / "new")
        moved = project(tmp_path / "new", extra=seed)
        assert run(store, moved, decoder).seed["status"] == "skipped-equal"
        assert ids_of(store) == [0]
