"""Inputs landed by the children that decode them (``engine.land.input_landing``): several at once,
each failing alone and by name with its parts removed, and landing what a run staging the batches
in the landing process lands (``CONTEXTFUL_LAND_CHILDREN=0``): the same rows, relational ids that
join, the same schema and downgrade events, the guard's counts, checkpoints at input boundaries."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.input_landing import LandRequest
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store
from contextful.storage.errors import InputMalformed, ParseCrashed, SchemaIrreconcilable

from tests.engine.land.test_decode_ahead import children

MANIFEST = """
[project]
name = "landing"

[[pipeline]]
id = "ev"
table = "ev"
normalize = "{normalize}"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""

WAIT_S = 120.0


def project(tmp_path: Path, normalize: str = "nested") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(normalize=normalize))
    (tmp_path / "raw").mkdir()
    return tmp_path


def write_input(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def events(first: int, count: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": first + i, "name": f"n{first + i}", "tags": [{"k": "a", "v": i}, {"k": "b", "v": i + 1}], **extra}
            for i in range(count)]


def part_paths(store: Store) -> set[str]:
    """Every part object under the store's tables."""
    return {o.key for o in store.objects.list("tables") if "/parts/" in o.key}


def live_paths(store: Store) -> set[str]:
    return {p.path for name in store.table_names() for p in store.catalog.all_parts(name)}


class GatedDecoder(Decoder):
    """A real decoder whose first input's landing, once its child has started reading, waits until
    the second input's landing has returned: a run landing one input at a time never gets there."""

    def __init__(self, first: str, second: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.first, self.second = first, second
        self.second_landed = threading.Event()
        self.first_waited = threading.Event()
        self.starts: list[str] = []

    def land(self, path: str, land: LandRequest, *args: Any, **kwargs: Any) -> dict[str, Any]:
        name = os.path.basename(path)
        self.starts.append(name)
        told: Callable[[int, bool], None] | None = kwargs.get("on_read")
        if name == self.first and told is not None:
            def gated(offset: int, scanning: bool) -> None:
                if not self.first_waited.is_set():
                    self.first_waited.set()
                    assert self.second_landed.wait(WAIT_S), "the second input never landed while the first ran"
                told(offset, scanning)
            kwargs["on_read"] = gated
        try:
            return super().land(path, land, *args, **kwargs)
        finally:
            if name == self.second:
                self.second_landed.set()


def test_two_inputs_land_in_their_children_at_once_and_one_fails_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input a's child starts reading, then a waits until input b has landed (its child wrote its
    parts): both children ran at once. a is malformed at its end: it fails alone, by name, its
    parts removed and its lease ended; b's rows and child rows land."""
    monkeypatch.setenv("CONTEXTFUL_LAND_CHILDREN", "2")
    root = project(tmp_path, "relational")
    bad = write_input(root / "raw" / "a.ndjson", events(0, 400), tail="{not json\n")
    write_input(root / "raw" / "b.ndjson", events(1000, 300))
    manifest = load_manifest(root)
    seen: list[Any] = []
    with GatedDecoder("a.ndjson", "b.ndjson", block_bytes=512) as decoder, \
            Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, decoder=decoder, progress=seen.append)
        assert decoder.first_waited.is_set() and decoder.second_landed.is_set()
        assert decoder.starts == ["a.ndjson", "b.ndjson"]
        assert [(f.input, f.error) for f in result.failures] == [(str(bad), InputMalformed.__name__)]
        assert "line 401" in result.failures[0].detail
        assert sorted(store.table("ev").to_arrow().column("id").to_pylist()) == list(range(1000, 1300))
        assert unjoined(store) == 0 and store.table("ev__tags").count() == 600
        assert part_paths(store) == live_paths(store)  # a's parts are gone, b's are the table's
        assert store.catalog.staging_runs("ev") == [] and store.catalog.staging_runs("ev__tags") == []
    rerun = root / "raw" / "a.ndjson"
    write_input(rerun, events(0, 400))  # fixed: the re-run lands exactly it
    with Decoder() as decoder, Store.open(manifest.project.store) as store:
        [again] = run_pipelines(store, manifest, decoder=decoder)
        assert again.ok and again.inputs_landed == [str(rerun)]
        assert sorted(store.table("ev").to_arrow().column("id").to_pylist()) == \
            list(range(400)) + list(range(1000, 1300))


def landed(tmp_path: Path, children: str, monkeypatch: pytest.MonkeyPatch, normalize: str,
           inputs: dict[str, str]) -> dict[str, Any]:
    """What one run over ``inputs`` lands, with the inputs landed by ``children`` children."""
    monkeypatch.setenv("CONTEXTFUL_LAND_CHILDREN", children)
    root = project(tmp_path / f"c{children}", normalize)
    for name, text in inputs.items():
        (root / "raw" / name).write_text(text)
    manifest = load_manifest(root)
    with Decoder(block_bytes=1024) as decoder, Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, decoder=decoder)
        out: dict[str, Any] = {"failures": [(os.path.basename(f.input), f.error) for f in result.failures]}
        for name in sorted(store.table_names()):
            table = store.table(name)
            data = table.to_arrow()
            commits = [c for c in table.commits() if c.kind == "append"]
            out[name] = {
                "schema": data.schema,
                "rows": sorted(map(repr, data.drop_columns([c for c in data.column_names if c.startswith("_cf")])
                                   .to_pylist())),
                "events": [(e.path, e.source_type, e.landed_type, e.kind)
                           for c in commits for e in table.manifest(c.run_id).downgrade_events],
                "masked": [r.masked_cells for r in result.tables if r.table == name],
            }
        if normalize == "relational":
            out["unjoined"] = unjoined(store)
    return out


def unjoined(store: Store) -> int:
    """Child rows whose parent or root id joins no root row (0: every one joins)."""
    ev, tags = store.table("ev").to_arrow(), store.table("ev__tags").to_arrow()  # noqa: F841 - read by DuckDB
    [(count,)] = duckdb.sql("SELECT count(*) FROM tags WHERE _cf_parent_id NOT IN (SELECT _cf_id FROM ev)"
                            " OR _cf_root_id NOT IN (SELECT _cf_id FROM ev)").fetchall()
    return int(count)


def ndjson(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


SHAPES = {
    # a number column widening within an input (a later block) and across inputs, a column new in a
    # later input, a credential the guard masks, nested lists and structs
    "a.ndjson": ndjson([{"id": i, "n": i, "tags": [{"k": "x", "v": i}]} for i in range(300)]
                       + [{"id": 300 + i, "n": i + 0.5, "note": "AKIA" + "ABCDEFGHIJKLMNOP"} for i in range(5)]),
    "b.ndjson": ndjson([{"id": 1000 + i, "n": i * 2, "extra": {"deep": [i, i + 1]}, "tags": []} for i in range(200)]),
    "c.ndjson": ndjson([{"id": 2000 + i, "n": 7, "tags": [{"k": "y", "v": -i}, {"k": "z", "v": i}]}
                        for i in range(250)]),
}


@pytest.mark.parametrize("normalize", ["nested", "relational"])
def test_children_land_what_the_landing_process_lands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      normalize: str) -> None:
    """The same inputs landed by their children (two at once) and by the landing process: the same
    rows in the same schema, the same downgrade events in the same commits, the same masked counts,
    and relational child rows that join their root rows."""
    by_children = landed(tmp_path, "2", monkeypatch, normalize, SHAPES)
    by_process = landed(tmp_path, "0", monkeypatch, normalize, SHAPES)
    assert by_children == by_process
    assert by_children["failures"] == []
    assert by_children["ev"]["events"], "the shapes widen a column: a run records it"
    assert by_children["ev"]["masked"] == [{"note": 5}]
    if normalize == "relational":
        assert by_children["unjoined"] == 0 and "ev__tags" in by_children


def test_an_input_its_table_cannot_take_fails_alone_either_way(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A column landing text where an earlier input of the same run landed numbers fails that input
    alone (SchemaIrreconcilable), whether its child or the landing process reconciles it."""
    inputs = {"a.ndjson": ndjson([{"id": i, "n": i} for i in range(50)]),
              "b.ndjson": ndjson([{"id": 100 + i, "n": f"text {i}"} for i in range(50)]),
              "c.ndjson": ndjson([{"id": 200 + i, "n": i} for i in range(50)])}
    by_children = landed(tmp_path, "2", monkeypatch, "nested", inputs)
    assert by_children == landed(tmp_path, "0", monkeypatch, "nested", inputs)
    assert by_children["failures"] == [("b.ndjson", SchemaIrreconcilable.__name__)]
    assert len(by_children["ev"]["rows"]) == 100


def test_a_child_failing_after_it_wrote_parts_removes_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of 100 rows: the child has written parts for the root and its child table when it
    meets the malformed line; none of them stays, and the other input lands."""
    monkeypatch.setenv("CONTEXTFUL_LAND_CHILDREN", "2")
    monkeypatch.setattr("contextful.engine.land.input_landing.STAGE_ROWS", 100)
    root = project(tmp_path, "relational")
    bad = write_input(root / "raw" / "a.ndjson", events(0, 450), tail="{not json\n")
    write_input(root / "raw" / "b.ndjson", events(1000, 250))
    manifest = load_manifest(root)
    with Decoder(block_bytes=512) as decoder, Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, decoder=decoder)
        assert [f.input for f in result.failures] == [str(bad)]
        assert store.table("ev").count() == 250 and unjoined(store) == 0
        assert len(store.catalog.all_parts("ev")) == 3  # b's groups: 100, 100, 50 rows
        assert part_paths(store) == live_paths(store)


class KillingDecoder(Decoder):
    """A real decoder that kills the first input's child once it has read into its input (its
    first groups written), from the thread taking its progress."""

    def land(self, path: str, land: LandRequest, *args: Any, **kwargs: Any) -> dict[str, Any]:
        told: Callable[[int, bool], None] | None = kwargs.get("on_read")
        if os.path.basename(path) == "a.ndjson" and told is not None:
            server = self.server_pid

            def killing(offset: int, scanning: bool) -> None:
                if offset > 40_000:
                    for pid in children(server):
                        os.killpg(pid, signal.SIGKILL)
                told(offset, scanning)
            kwargs["on_read"] = killing
        return super().land(path, land, *args, **kwargs)


def test_a_child_killed_mid_input_leaves_none_of_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child killed after it wrote parts (as at a bound) cannot remove them: the run does (every
    part its lease names) and ends its lease; the input fails alone as ParseCrashed."""
    monkeypatch.setenv("CONTEXTFUL_LAND_CHILDREN", "1")
    monkeypatch.setattr("contextful.engine.land.input_landing.STAGE_ROWS", 100)
    root = project(tmp_path, "relational")
    bad = write_input(root / "raw" / "a.ndjson", events(0, 2000))
    write_input(root / "raw" / "b.ndjson", events(5000, 120))
    manifest = load_manifest(root)
    with KillingDecoder(block_bytes=2048) as decoder, Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, decoder=decoder, progress=lambda _: None)
        assert [(f.input, f.error) for f in result.failures] == [(str(bad), ParseCrashed.__name__)]
        assert store.table("ev").count() == 120
        assert part_paths(store) == live_paths(store)
        assert store.catalog.staging_runs("ev") == []
