"""Staleness: a published model is stale by the landings it has not read (decision
"build-stale-landings"), measured with an injected clock."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from engine.config.manifest import Manifest
from engine.config.parse import parse_manifest
from engine.model.build import build_models
from engine.model.status import build_status
from storage import ManualClock, Store


@pytest.fixture
def clocked(tmp_path: Path) -> Iterator[tuple[Store, ManualClock]]:
    clock = ManualClock()
    store = Store.open(tmp_path / "store", clock=clock)
    store.append("src", pa.table({"v": [1, 2]}))
    yield store, clock
    store.close()


def manifest(root: Path) -> Manifest:
    return parse_manifest(tomllib.loads(
        '[project]\nname = "s"\n'
        '[[model]]\nname = "m1"\nsql = "SELECT sum(v) AS total FROM src"\npolicy = { max_lag = "1h" }\n'
        '[[model]]\nname = "m2"\nsql = "SELECT total * 2 AS twice FROM m1"\npolicy = { max_lag = "1h" }\n'), root)


def stale(store: Store, root: Path) -> dict[str, list[str]]:
    return {s.model: s.stale_inputs for s in build_status(store, manifest(root))}


@pytest.mark.clause("run.publish.staleness")
def test_a_model_is_stale_once_an_unread_landing_is_older_than_max_lag(tmp_path: Path, clocked: tuple[Store, ManualClock]) -> None:
    store, clock = clocked
    build_models(store, manifest(tmp_path))
    clock.advance(7200)
    assert stale(store, tmp_path)["m1"] == []  # a quiet input is never stale
    store.append("src", pa.table({"v": [3]}))
    clock.advance(3000)
    assert stale(store, tmp_path)["m1"] == []  # the unread run is 50 minutes old
    clock.advance(700)
    status = {s.model: s for s in build_status(store, manifest(tmp_path))}
    assert status["m1"].stale_inputs == ["src"] and status["m1"].to_json()["stale"] is True
    assert status["m1"].watermark == {"src": 1}
    build_models(store, manifest(tmp_path), ["m1"])  # a rebuild over the current frontier clears it
    assert stale(store, tmp_path)["m1"] == []


@pytest.mark.clause("run.publish.staleness-model-input")
def test_a_model_input_waits_on_its_newer_builds(tmp_path: Path, clocked: tuple[Store, ManualClock]) -> None:
    store, clock = clocked
    build_models(store, manifest(tmp_path))
    clock.advance(60)
    build_models(store, manifest(tmp_path), ["m1"])  # a build of m1 that m2 has not read
    clock.advance(1800)
    assert stale(store, tmp_path)["m2"] == []
    clock.advance(1900)
    assert stale(store, tmp_path) == {"m1": [], "m2": ["m1"]}
    build_models(store, manifest(tmp_path), ["m2"])
    assert stale(store, tmp_path) == {"m1": [], "m2": []}


@pytest.mark.clause("run.publish.staleness-omitted-check")
def test_runs_at_or_below_the_watermark_that_differ_from_the_build_make_it_stale(
        tmp_path: Path, clocked: tuple[Store, ManualClock]) -> None:
    store, _clock = clocked
    build_models(store, manifest(tmp_path))
    assert stale(store, tmp_path)["m1"] == []
    # The input's history at or below the watermark no longer holds the run the build read (a
    # catalog restored from elsewhere, a table made again under its name): the digest differs, and
    # the input holds a waiting run counted as older than max_lag, with no time passing.
    store.catalog._write(lambda cur: cur.execute(  # type: ignore[attr-defined]
        "UPDATE cf_commits SET run_id = ? WHERE table_name = ? AND commit_seq = ?", ("r-from-elsewhere", "src", 1)))
    assert stale(store, tmp_path)["m1"] == ["src"]
    build_models(store, manifest(tmp_path), ["m1"])  # a rebuild reads the input as it is now
    assert stale(store, tmp_path)["m1"] == []


@pytest.mark.clause("run.publish.staleness-collected-run")
def test_a_waiting_build_whose_manifest_was_collected_counts_as_old(
        tmp_path: Path, clocked: tuple[Store, ManualClock]) -> None:
    from storage.manifest import manifest_key

    store, clock = clocked
    build_models(store, manifest(tmp_path))
    clock.advance(60)
    between = build_models(store, manifest(tmp_path), ["m1"])[0]  # m2 has read neither this build ...
    build_models(store, manifest(tmp_path), ["m1"])  # ... nor this one, m1's published build
    assert stale(store, tmp_path)["m2"] == []  # both a minute old, under max_lag
    store.objects.delete([manifest_key("m1", between.run_id)])  # retention collected its manifest
    assert stale(store, tmp_path)["m2"] == ["m1"]  # no age to read: it counts as older than max_lag
