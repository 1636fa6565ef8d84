"""Staleness: a published model is stale by the landings it has not read (decision
"build-stale-landings"), measured with an injected clock."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.config.manifest import Manifest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.model.build import build_models
from contextful.engine.model.status import build_status
from contextful.storage import ManualClock, Store


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
    from contextful.storage.manifest import manifest_key

    store, clock = clocked
    build_models(store, manifest(tmp_path))
    clock.advance(60)
    between = build_models(store, manifest(tmp_path), ["m1"])[0]  # m2 has read neither this build ...
    build_models(store, manifest(tmp_path), ["m1"])  # ... nor this one, m1's published build
    assert stale(store, tmp_path)["m2"] == []  # both a minute old, under max_lag
    # retention collected its manifest: the object of a large run, the catalog row of a small one
    store.objects.delete([k for k in [manifest_key("m1", between.run_id)] if store.objects.exists(k)])
    store.catalog._write(lambda cur: cur.execute(  # type: ignore[attr-defined]
        "DELETE FROM cf_manifests WHERE table_name = ? AND run_id = ?", ("m1", between.run_id)))
    assert stale(store, tmp_path)["m2"] == ["m1"]  # no age to read: it counts as older than max_lag


M1 = '[[model]]\nname = "m1"\nsql = "SELECT sum(v) AS total FROM src"\npolicy = { max_lag = "1h" }\n'
DEFINITION_CHANGES = {
    "sql": ('[[model]]\nname = "m1"\nsql = "SELECT sum(v) * 10 AS total FROM src"\npolicy = { max_lag = "1h" }\n',
            [30]),
    "contract": (M1 + 'contract = { version = "1.0", grain = [], columns = { total = { type = "double" } } }\n',
                 [3.0]),
    "inputs": (M1 + 'inputs = ["src", "other"]\n', [3]),
}


@pytest.mark.parametrize("part", list(DEFINITION_CHANGES))
def test_a_changed_definition_makes_the_model_stale_until_rebuilt(tmp_path: Path, clocked: tuple[Store, ManualClock],
                                                                  part: str) -> None:
    store, _clock = clocked
    store.append("other", pa.table({"w": [0]}))
    old = parse_manifest(tomllib.loads('[project]\nname = "s"\n' + M1), tmp_path)
    new = parse_manifest(tomllib.loads('[project]\nname = "s"\n' + DEFINITION_CHANGES[part][0]), tmp_path)
    build_models(store, old)
    assert [(s.stale, s.changed) for s in build_status(store, old)] == [(False, [])]
    # no landing, no time passing: the published build answers the old definition
    status = build_status(store, new)[0]
    assert status.stale and status.changed == [part] and status.stale_inputs == []
    assert status.to_json()["stale"] is True and status.to_json()["why"] == [f"{part} changed"]
    build_models(store, new)
    assert [(s.stale, s.changed) for s in build_status(store, new)] == [(False, [])]
    assert store.table("m1").to_arrow().column("total").to_pylist() == DEFINITION_CHANGES[part][1]


def test_build_status_says_why_a_model_is_stale(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    with Store.open(tmp_path / ".contextful" / "store") as store:
        store.append("src", pa.table({"v": [1, 2]}))
    (tmp_path / "contextful.toml").write_text('[project]\nname = "s"\n' + M1)
    contextful(tmp_path, "build", "run")
    (tmp_path / "contextful.toml").write_text('[project]\nname = "s"\n' + DEFINITION_CHANGES["sql"][0])
    status = json.loads(contextful(tmp_path, "--json", "build", "status").stdout)
    assert [(r["model"], r["stale"], r["changed"], r["why"]) for r in status] == [
        ("m1", True, ["sql"], ["sql changed"])]
    assert "sql changed" in contextful(tmp_path, "build", "status").stdout
    contextful(tmp_path, "build", "run")
    assert json.loads(contextful(tmp_path, "--json", "build", "status").stdout)[0]["stale"] is False
