"""Watermark positions skip and repeat nothing: clocks compare as instants (declared ``types``
honoured), the last instant is re-read and what already landed at it is dropped, and old
positions carry forward. Against a real JSON API on loopback and real catalogs (SQLite, PostgreSQL).
"""

from __future__ import annotations

import tempfile
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.land.clocks import ClockReader
from contextful.engine.land.decode import Decoder
from contextful.engine.land.pipeline import cursor_scope, plan_pipeline, run_pipeline
from contextful.storage import Store
from contextful.storage.errors import CursorPositionUnorderable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import StoreFactory
from tests.support.http_api import JsonApi, instant, next_url_pages, watermark_pages

CATALOGS = pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres)],
                                   indirect=True)


@pytest.fixture
def api() -> Iterator[JsonApi]:
    with JsonApi() as server:
        yield server


def manifest_for(root: Path, url: str, *, extra: str = "", config: str = "") -> Any:
    text = f"""
[project]
name = "positions"

[[pipeline]]
id = "events"
incremental = "updated_at"
{extra}
[pipeline.source]
kind = "http"
[pipeline.source.config]
url = "{url}"
{config}
"""
    return parse_manifest(tomllib.loads(text), root)


def run(store: Store, manifest: Any, decoder: Decoder) -> Any:
    return run_pipeline(store, manifest, manifest.pipeline("events"), decoder)


def ids_of(store: Store) -> list[int]:
    return sorted(r["id"] for r in store.table("events").to_arrow().to_pylist())


def stamp(second: str) -> str:
    return f"2026-03-01T10:00:{second}Z"


# --- item: clocks compare as instants ------------------------------------------------------------


@CATALOGS
@pytest.mark.parametrize("declared", ["", 'types = { updated_at = "timestamp[us, UTC]" }'])
def test_a_fractional_second_stamp_is_a_later_instant_not_a_smaller_text(
        tmp_path: Path, api: JsonApi, make_store: StoreFactory, store_kind: str, decoder: Decoder, declared: str) -> None:
    store = make_store()
    api.records.extend([{"id": 0, "updated_at": stamp("04.5")}, {"id": 1, "updated_at": stamp("05")}])
    api.route("/items", watermark_pages(api.records, "updated_at", 10, order=instant))
    manifest = manifest_for(tmp_path, f"{api.url}/items", extra=declared)
    run(store, manifest, decoder)
    position, _ = store.table("events").cursor(cursor_scope(manifest.pipeline("events")))
    assert position["clock"] == "timestamp" and position["watermark"] == 1772359205_000000
    # "…05.5Z" sorts below "…05Z" as text; as an instant it is half a second later and lands
    api.records.extend([{"id": 2, "updated_at": stamp("05.5")}, {"id": 3, "updated_at": stamp("06")},
                        {"id": 4, "updated_at": "2026-03-01T11:00:06.25+01:00"}])
    run(store, manifest, decoder)
    assert ids_of(store) == [0, 1, 2, 3, 4]
    position, _ = store.table("events").cursor(cursor_scope(manifest.pipeline("events")))
    assert position["watermark"] == 1772359206_250000
    run(store, manifest, decoder)
    assert ids_of(store) == [0, 1, 2, 3, 4]


def test_a_text_position_of_iso_stamps_carries_forward_as_an_instant(tmp_path: Path, api: JsonApi,
                                                                     decoder: Decoder) -> None:
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    scope = cursor_scope(manifest.pipeline("events"))
    with Store.open(tmp_path / "store") as store:
        # a position the old code stored: the page's column was text, its greatest text "…05Z"
        txn = store.create_table("events").transaction("append")
        txn.set_cursor(scope, {"kind": "watermark", "field": "updated_at", "clock": "text", "watermark": stamp("05")})
        txn.commit()
        plan = plan_pipeline(store, manifest, manifest.pipeline("events"))
        assert plan.first_request is not None and "since=2026-03-01T10%3A00%3A05Z" in plan.first_request
        api.records.extend([{"id": 1, "updated_at": stamp("05.5")}, {"id": 2, "updated_at": stamp("06")}])
        api.route("/items", watermark_pages(api.records, "updated_at", 10, order=instant))
        run(store, manifest, decoder)
        assert ids_of(store) == [1, 2]
        assert store.table("events").cursor(scope)[0]["clock"] == "timestamp"


# --- item: the last instant is re-read inclusively -----------------------------------------------


@CATALOGS
@pytest.mark.parametrize("walk", ["watermark", "next_url"])
def test_a_row_arriving_late_at_the_last_instant_lands_once(tmp_path: Path, api: JsonApi,
                                                            make_store: StoreFactory, store_kind: str, decoder: Decoder,
                                                            walk: str) -> None:
    store = make_store()
    api.records.extend([{"id": 0, "updated_at": 1}, {"id": 1, "updated_at": 2}, {"id": 2, "updated_at": 2}])
    if walk == "watermark":
        api.route("/items", watermark_pages(api.records, "updated_at", 2))
    else:  # a server that ignores since: every run reads everything and the walk admits
        api.route("/items", next_url_pages(api.records, 2))
    manifest = manifest_for(tmp_path, f"{api.url}/items", config=f'paginate = "{walk}"')
    run(store, manifest, decoder)
    assert ids_of(store) == [0, 1, 2]
    # replica lag: a row stamped at the stored watermark appears after the run, with an identical twin
    # of one already landed (the same record twice), and a later one
    api.records.extend([{"id": 3, "updated_at": 2}, {"id": 1, "updated_at": 2}, {"id": 4, "updated_at": 3}])
    api.requests.clear()
    run(store, manifest, decoder)
    if walk == "watermark":
        assert api.requests[0].query["since"] == "1"  # the instant before the last, so the last is re-read
    assert ids_of(store) == [0, 1, 1, 2, 3, 4]
    run(store, manifest, decoder)  # nothing new: nothing lands again
    assert ids_of(store) == [0, 1, 1, 2, 3, 4]
    api.records.append({"id": 5, "updated_at": 3})
    run(store, manifest, decoder)
    assert ids_of(store) == [0, 1, 1, 2, 3, 4, 5]


@CATALOGS
def test_an_old_strict_position_carries_forward_and_then_reads_its_last_instant_again(
        tmp_path: Path, api: JsonApi, make_store: StoreFactory, store_kind: str, decoder: Decoder) -> None:
    store = make_store()
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    scope = cursor_scope(manifest.pipeline("events"))
    txn = store.create_table("events").transaction("append")
    txn.set_cursor(scope, {"kind": "watermark", "field": "updated_at", "clock": "numeric", "watermark": 2})
    txn.commit()
    api.records.extend([{"id": 1, "updated_at": 2}, {"id": 3, "updated_at": 3}])
    api.route("/items", watermark_pages(api.records, "updated_at", 10))
    run(store, manifest, decoder)  # the old position promised everything through 2: admits after it
    assert ids_of(store) == [3]
    api.records.append({"id": 4, "updated_at": 3})
    run(store, manifest, decoder)
    assert ids_of(store) == [3, 4]


# --- property: over several runs every row lands exactly once ------------------------------------

BASE = datetime(2026, 3, 1, 10, 0, 0, tzinfo=UTC)
FRACTIONS = {0: ["", ".0", ".000"], 250: [".25", ".250", ".250000"], 500: [".5", ".50", ".500000"],
             750: [".75", ".750"]}


def render(ms: int, width: int) -> str:
    """An ISO-8601 stamp ``ms`` milliseconds after BASE, its fraction written one of several ways."""
    whole = (BASE + timedelta(milliseconds=ms - ms % 1000)).strftime("%Y-%m-%dT%H:%M:%S")
    forms = FRACTIONS[ms % 1000]
    return f"{whole}{forms[width % len(forms)]}Z"


# one arrival: (step after the greatest clock visible: 0 ties with it, a late row at the last
# instant; how its fraction is written; whether it repeats the record before it exactly)
ARRIVAL = st.tuples(st.sampled_from([0, 0, 250, 500, 1000, 1750]), st.integers(0, 5), st.booleans())


@pytest.mark.parametrize("walk", ["watermark", "next_url"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs=st.lists(st.lists(ARRIVAL, max_size=5), min_size=2, max_size=4), page_size=st.integers(2, 4),
       checkpoint_bytes=st.sampled_from([1, 512 * 1024 * 1024]))
def test_over_several_runs_every_row_lands_exactly_once(decoder: Decoder, walk: str,
                                                        runs: list[list[tuple[int, int, bool]]],
                                                        page_size: int, checkpoint_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as directory, JsonApi() as api, Store.open(Path(directory) / "store") as store:
        if walk == "watermark":
            api.route("/items", watermark_pages(api.records, "updated_at", page_size, order=instant))
        else:
            api.route("/items", next_url_pages(api.records, page_size))
        # declared, so pages inferred as timestamps and pages of text land in one column
        manifest = manifest_for(Path(directory), f"{api.url}/items", config=f'paginate = "{walk}"',
                                extra='types = { updated_at = "timestamp[us, UTC]" }')
        latest = 0
        for arrivals in runs:
            for step, width, twin in arrivals:
                if twin and api.records:
                    api.records.append(dict(api.records[-1]))
                    continue
                latest += step
                api.records.append({"id": len(api.records), "updated_at": render(latest, width)})
            run_pipeline(store, manifest, manifest.pipeline("events"), decoder, checkpoint_bytes=checkpoint_bytes)
            assert ids_of(store) == sorted(r["id"] for r in api.records)  # twins share an id: both land


def test_text_clocks_mixing_stamps_and_other_text_have_no_order() -> None:
    reader = ClockReader("pipeline:events", "events", "updated_at")
    with pytest.raises(CursorPositionUnorderable) as caught:
        reader.values(pa.table({"updated_at": ["2026-03-01T10:00:05Z", "yesterday"]}), "page 1")
    assert "'yesterday'" in caught.value.detail
    assert reader.values(pa.table({"updated_at": ["b", "a"]}), "page 1").to_pylist() == ["b", "a"]  # opaque text
    nanos = pa.table({"updated_at": pa.array([1_772_359_205_000_000_999], pa.timestamp("ns", "UTC"))})
    assert ClockReader("s", "t", "updated_at").values(nanos, "page 1").to_pylist() == [1_772_359_205_000_000]
