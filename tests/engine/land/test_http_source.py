"""The generic HTTP source against a real JSON API on loopback: walks, positions, checkpoints,
retries, the meter and the bounds of its connector child."""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.land import walk
from contextful.engine.land.decode import Decoder
from contextful.engine.land.http_fetch import record_digest
from contextful.engine.land.meter import Meter
from contextful.engine.land.pipeline import cursor_scope, plan_pipeline, run_pipeline
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store
from contextful.storage.errors import (
    ConnectorBoundHit,
    CursorFieldMismatch,
    CursorPositionUnorderable,
    PageCapExceeded,
    SourceResponseMalformed,
    SourceUnavailable,
    TransientError,
)

from tests.support.cli import contextful
from tests.support.http_api import (
    JsonApi,
    Reply,
    Request,
    endless_pages,
    malformed_json,
    next_url_pages,
    rate_limited,
    server_errors,
    watermark_pages,
)


@pytest.fixture
def api() -> Iterator[JsonApi]:
    with JsonApi() as server:
        yield server


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store") as s:
        yield s


def manifest_for(root: Path, url: str, *, incremental: str | None = "updated_at", extra: str = "",
                 config: str = "") -> Any:
    text = f"""
[project]
name = "http"

[[pipeline]]
id = "events"
table = "events"
{f'incremental = "{incremental}"' if incremental else ''}
{extra}
[pipeline.source]
kind = "http"
[pipeline.source.config]
url = "{url}"
retry = {{ attempts = 4, base_s = 0.01, max_s = 0.05 }}
{config}
"""
    (root / "contextful.toml").write_text(text)
    return parse_manifest(tomllib.loads(text), root)


def records(n: int, start: int = 0, *, clock: Any = None) -> list[dict[str, Any]]:
    return [{"id": i, "updated_at": clock(i) if clock else i, "payload": {"tags": [f"t{i}"], "n": i}}
            for i in range(start, start + n)]


def rows_of(store: Store) -> list[dict[str, Any]]:
    return sorted(store.table("events").to_arrow().to_pylist(), key=lambda r: r["id"])


def ids_of(store: Store) -> list[int]:
    return [r["id"] for r in rows_of(store)]


def run(store: Store, manifest: Any, decoder: Decoder, **kwargs: Any) -> Any:
    return run_pipeline(store, manifest, manifest.pipeline("events"), decoder, **kwargs)


# --- url walks ----------------------------------------------------------------------------------


@pytest.mark.clause("run.own.checkpoint-scope")
@pytest.mark.parametrize("style", ["body", "link"])
def test_url_walk_follows_next_urls_and_commits_once(tmp_path: Path, api: JsonApi, store: Store,
                                                     decoder: Decoder, style: str) -> None:
    api.records.extend(records(25))
    api.route("/items", next_url_pages(api.records, 4, style=style))
    manifest = manifest_for(tmp_path, f"{api.url}/items", incremental=None, extra='primary_key = ["id"]',
                            config='paginate = "'
                            + ("next_url" if style == "body" else "link") + '"')
    result = run(store, manifest, decoder, checkpoint_bytes=1)  # a url walk ignores the checkpoint bound
    assert ids_of(store) == list(range(25))
    assert [int(r.query.get("page", 1)) for r in api.requests] == list(range(1, 8))
    assert len(store.table("events").commits()) == 1 and result.pulls == 7
    assert rows_of(store)[3]["payload"] == {"tags": ["t3"], "n": 3}


def test_url_walk_under_an_incremental_field_asks_from_the_stored_watermark(tmp_path: Path, api: JsonApi,
                                                                           store: Store, decoder: Decoder) -> None:
    api.records.extend(records(6))
    api.route("/items", next_url_pages(api.records, 4))
    manifest = manifest_for(tmp_path, f"{api.url}/items", config='paginate = "next_url"')
    run(store, manifest, decoder)
    value, _ = store.table("events").cursor(cursor_scope(manifest.pipeline("events")))
    assert value == {"kind": "watermark", "field": "updated_at", "clock": "numeric", "watermark": 5,
                     "seen": [record_digest(api.records[5])], "since": 4}
    api.records.extend(records(3, start=6))
    api.requests.clear()
    run(store, manifest, decoder)
    assert api.requests[0].query["since"] == "4"  # the clock before the last: the last instant is read again
    assert ids_of(store) == list(range(9))  # the server ignores since: the walk admits only rows not landed


@pytest.mark.clause("connector.source.page-cap")
def test_an_endless_url_walk_stops_at_1000_requests_and_lands_nothing(tmp_path: Path, api: JsonApi, store: Store,
                                                                     decoder: Decoder) -> None:
    api.route("/items", endless_pages(1))
    manifest = manifest_for(tmp_path, f"{api.url}/items", incremental=None, extra='primary_key = ["id"]')
    with pytest.raises(PageCapExceeded) as caught:
        run(store, manifest, decoder)
    assert len(api.requests) == 1000 and caught.value.cap == 1000
    assert store.table("events").commits() == []


@pytest.mark.clause("connector.source.page-cap")
def test_a_watermark_walk_counts_requests_from_its_last_progressing_page(tmp_path: Path, api: JsonApi,
                                                                        store: Store, decoder: Decoder,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(walk, "PAGE_CAP", 3)
    # clocks per page (page size 2): [0,1] [2,3] [4,5] [6,7] [8,9]: every page passes all before it,
    # so the count restarts on each page and a 5-page walk under a cap of 3 completes.
    api.records.extend(records(10))
    api.route("/items", watermark_pages(api.records, "updated_at", 2))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    run(store, manifest, decoder)
    assert ids_of(store) == list(range(10)) and len(api.requests) == 5
    # pages that share one clock do not progress: the fourth request in a row is refused
    store2 = Store.open(tmp_path / "store2")
    api.records[:] = records(10, clock=lambda i: 1)
    api.requests.clear()
    with pytest.raises(PageCapExceeded):
        run(store2, manifest, decoder)
    assert len(api.requests) == 3
    store2.close()


# --- watermark walks ------------------------------------------------------------------------------


@pytest.mark.clause("connector.source.http-watermark-walk")
def test_watermark_walk_reads_one_page_per_pull_from_the_stored_watermark(tmp_path: Path, api: JsonApi,
                                                                         store: Store, decoder: Decoder) -> None:
    api.records.extend(records(7))
    api.route("/items", watermark_pages(api.records, "updated_at", 3))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    spec = manifest.pipeline("events")
    run(store, manifest, decoder, checkpoint_bytes=1)  # commit at every page the frontier allows
    table = store.table("events")
    positions = [table.manifest(c.run_id).cursor["value"] for c in table.commits()]
    tokens = [r.query.get("page_token") for r in api.requests]
    assert [r.query.get("since") for r in api.requests] == [None, None, None]
    assert tokens[0] is None and tokens[1] and tokens[2]
    # each checkpoint carries the stored watermark (none yet) and the next page's token ...
    digest = [record_digest(r) for r in api.records]
    assert positions[:-1] == [{"kind": "walk", "field": "updated_at", "clock": "numeric", "floor": None, "seen": [],
                               "since": None, "token": tokens[i + 1], "frontier": f, "frontier_seen": [digest[f]],
                               "below": f - 1} for i, f in enumerate([2, 5])]
    # ... and the walk's last page carries none: the frontier becomes the watermark
    assert positions[-1] == {"kind": "watermark", "field": "updated_at", "clock": "numeric", "watermark": 6,
                             "seen": [digest[6]], "since": 5}
    assert ids_of(store) == list(range(7))
    # the next walk asks from the clock before the stored watermark and lands only what is new
    api.records.extend(records(2, start=7))
    api.requests.clear()
    run(store, manifest, decoder)
    assert [(r.query.get("since"), r.query.get("page_token")) for r in api.requests] == [("5", None)]
    assert ids_of(store) == list(range(9))
    assert table.cursor(cursor_scope(spec))[0]["watermark"] == 8
    api.requests.clear()
    run(store, manifest, decoder)  # nothing new: one request, no rows, no new commit
    assert len(api.requests) == 1 and ids_of(store) == list(range(9))


@pytest.mark.clause("run.advance.walk-position")
def test_a_walk_interrupted_after_a_checkpoint_resumes_at_its_page_from_its_floor(tmp_path: Path, api: JsonApi,
                                                                                 store: Store,
                                                                                 decoder: Decoder) -> None:
    api.records.extend(records(4))
    api.route("/items", watermark_pages(api.records, "updated_at", 2))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    spec = manifest.pipeline("events")
    run(store, manifest, decoder)  # watermark 3, asked again from 2
    api.records.extend(records(8, start=4))  # 3..11: pages [3,4] [5,6] [7,8] [9,10] [11] from since=2
    broken = {"on": True}
    serve = watermark_pages(api.records, "updated_at", 2)

    def third_page_breaks(request: Request) -> Reply:
        if broken["on"] and len(api.requests_to("/items")) >= 3:  # the third page of this walk
            return Reply(200, b'{"data": [', {})
        return serve(request)

    api.route("/items", third_page_breaks)
    api.requests.clear()
    with pytest.raises(SourceResponseMalformed):
        run(store, manifest, decoder, checkpoint_bytes=1)
    # the checkpoint before page 2 committed page 1 (row 3 landed before: dropped) with the position
    # that asks page 2; page 2's rows were staged when page 3 broke, and are dropped
    value, _ = store.table("events").cursor(cursor_scope(spec))
    asked = api.requests[1]
    digest = [record_digest(r) for r in api.records]
    assert value == {"kind": "walk", "field": "updated_at", "clock": "numeric", "floor": 3, "seen": [digest[3]],
                     "since": 2, "token": asked.query["page_token"], "frontier": 4, "frontier_seen": [digest[4]],
                     "below": 3}
    assert ids_of(store) == list(range(5))
    broken["on"] = False
    api.requests.clear()
    run(store, manifest, decoder)
    first = api.requests[0]
    assert (first.query["since"], first.query["page_token"]) == ("2", asked.query["page_token"])
    assert ids_of(store) == list(range(12))  # each row once: rows admitted from the walk's floor
    assert store.table("events").cursor(cursor_scope(spec))[0] == {
        "kind": "watermark", "field": "updated_at", "clock": "numeric", "watermark": 11, "seen": [digest[11]],
        "since": 10}


@pytest.mark.clause("run.own.checkpoint-commit")
def test_checkpoints_commit_staged_parts_with_the_position_and_keep_pulling(tmp_path: Path, api: JsonApi,
                                                                           store: Store, decoder: Decoder) -> None:
    api.records.extend(records(40))
    api.route("/items", watermark_pages(api.records, "updated_at", 5))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    two_pages = 300  # bytes: a 5-row page holds ~170 bytes of Arrow data while it waits to be staged
    result = run(store, manifest, decoder, checkpoint_bytes=two_pages)
    table = store.table("events")
    commits = [c for c in table.commits() if c.kind != "fold"]  # automatic compaction's folds aside
    assert 2 < len(commits) < 8 and result.pulls == 8 and ids_of(store) == list(range(40))
    for commit in commits[:-1]:  # each checkpoint: the position after its last staged pull
        m = table.manifest(commit.run_id)
        assert m.cursor["value"]["kind"] == "walk"
        assert m.cursor["value"]["frontier"] == max(r["updated_at"] for r in _rows_through(table, commit.commit_seq))
    assert len(result.tables[0].run_ids) == len(commits)


def _rows_through(table: Any, seq: int) -> list[dict[str, Any]]:
    return table.to_arrow(commit_seq=seq).to_pylist()


@pytest.mark.clause("run.own.checkpoint-frontier")
def test_a_checkpoint_never_splits_the_rows_of_one_instant(tmp_path: Path, api: JsonApi, store: Store,
                                                           decoder: Decoder) -> None:
    # pages of 2 by clock: [1,1] [1,2] [2,2] [3,4] [5,5]: only pages 4 and 5 pass the frontier
    clocks = [1, 1, 1, 2, 2, 2, 3, 4, 5, 5]
    api.records.extend({"id": i, "updated_at": c} for i, c in enumerate(clocks))
    api.route("/items", watermark_pages(api.records, "updated_at", 2))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    run(store, manifest, decoder, checkpoint_bytes=1)
    table = store.table("events")
    frontiers = [table.manifest(c.run_id).cursor["value"] for c in table.commits()]
    assert [f.get("frontier", f.get("watermark")) for f in frontiers] == [2, 4, 5]
    for seq, commit in enumerate(table.commits()):
        landed = [r["updated_at"] for r in _rows_through(table, commit.commit_seq)]
        later = [c for c in clocks if c not in landed]
        assert not set(landed) & set(later), f"commit {seq} split an instant"


# --- positions bound to their field -------------------------------------------------------------


@pytest.mark.clause("run.advance.field-rename")
def test_a_renamed_incremental_field_is_refused_before_any_request(tmp_path: Path, api: JsonApi, store: Store,
                                                                   decoder: Decoder) -> None:
    api.records.extend(records(3))
    api.route("/items", watermark_pages(api.records, "updated_at", 2))
    run(store, manifest_for(tmp_path, f"{api.url}/items"), decoder)
    renamed = manifest_for(tmp_path, f"{api.url}/items", incremental="modified_at")
    api.requests.clear()
    with pytest.raises(CursorFieldMismatch) as caught:
        run(store, renamed, decoder)
    assert (caught.value.stored, caught.value.declared) == ("updated_at", "modified_at")
    with pytest.raises(CursorFieldMismatch):
        plan_pipeline(store, renamed, renamed.pipeline("events"))
    store.close()
    cli = contextful(tmp_path, "--store", str(tmp_path / "store"), "pipeline", "run", check=False)
    assert cli.returncode == 4 and "CursorFieldMismatch" in cli.stderr and "modified_at" in cli.stderr
    assert api.requests == []  # nothing left the host


@pytest.mark.clause("run.advance.unorderable-position")
def test_a_row_without_an_orderable_clock_fails_the_pull(tmp_path: Path, api: JsonApi, store: Store,
                                                         decoder: Decoder) -> None:
    api.records.extend(records(4))
    api.records[2]["updated_at"] = None
    api.route("/items", lambda request: Reply(200, {"data": api.records, "next_page_token": None}))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    with pytest.raises(CursorPositionUnorderable) as caught:
        run(store, manifest, decoder)
    assert "1 row(s) hold no value" in caught.value.detail and not isinstance(caught.value, TransientError)
    assert len(api.requests) == 1  # terminal: not retried
    assert store.table("events").commits() == []


@pytest.mark.clause("run.advance.unorderable-position")
def test_positions_switching_between_text_and_numbers_mid_pass_fail(tmp_path: Path, api: JsonApi, store: Store,
                                                                    decoder: Decoder) -> None:
    pages = {None: {"data": [{"id": 0, "updated_at": 5}], "next_page_token": "b"},
             "b": {"data": [{"id": 1, "updated_at": "five past"}], "next_page_token": None}}
    api.route("/items", lambda request: Reply(200, pages[request.query.get("page_token")]))
    with pytest.raises(CursorPositionUnorderable) as caught:
        run(store, manifest_for(tmp_path, f"{api.url}/items"), decoder)
    assert "switched from numeric to text" in caught.value.detail
    assert store.table("events").commits() == []


# --- retries, the meter and connector bounds ----------------------------------------------------


def test_429_and_5xx_are_retried_after_the_wait_the_server_names(tmp_path: Path, api: JsonApi, store: Store,
                                                                 decoder: Decoder) -> None:
    api.records.extend(records(5))
    api.route("/items", rate_limited(1, 0.3, server_errors(2, watermark_pages(api.records, "updated_at", 10))))
    waits: list[float] = []
    result = run(store, manifest_for(tmp_path, f"{api.url}/items"), decoder, sleep=waits.append)
    assert ids_of(store) == list(range(5)) and result.pulls == 4
    assert waits[0] == pytest.approx(0.3) and len(waits) == 3


def test_malformed_json_fails_at_once_and_lands_nothing(tmp_path: Path, api: JsonApi, store: Store,
                                                        decoder: Decoder) -> None:
    api.route("/items", malformed_json())
    with pytest.raises(SourceResponseMalformed):
        run(store, manifest_for(tmp_path, f"{api.url}/items"), decoder)
    assert len(api.requests) == 1 and store.table("events").commits() == []


def test_an_unreachable_server_fails_transient_after_the_retry_schedule(tmp_path: Path, store: Store,
                                                                       decoder: Decoder) -> None:
    waits: list[float] = []
    with pytest.raises(SourceUnavailable):
        run(store, manifest_for(tmp_path, "http://127.0.0.1:9/items"), decoder, sleep=waits.append)
    assert len(waits) == 3  # four attempts


@pytest.mark.clause("connector.meter.acquire-call")
def test_the_meter_denies_and_the_retry_schedule_waits(tmp_path: Path, api: JsonApi, store: Store,
                                                       decoder: Decoder, monkeypatch: pytest.MonkeyPatch) -> None:
    api.records.extend(records(6))
    api.route("/items", watermark_pages(api.records, "updated_at", 2))
    manifest = manifest_for(tmp_path, f"{api.url}/items", config="rate_limit = { requests = 1, per_s = 0.2 }")
    # the meter's clock moves only when the schedule waits: each denial names the whole period
    now = [0.0]
    from_config = Meter.from_config
    monkeypatch.setattr(Meter, "from_config", lambda name, config: from_config(name, config, clock=lambda: now[0]))
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    run(store, manifest, decoder, sleep=sleep)
    assert ids_of(store) == list(range(6)) and len(api.requests) == 3
    assert waits == [pytest.approx(0.2)] * 2  # the token wait, done by the schedule


class _SecondHangs:
    """Answers as ``then``, except that the second request hangs until ``released`` is set."""

    def __init__(self, then: Any, released: threading.Event) -> None:
        self.then, self.released, self.calls = then, released, 0

    def __call__(self, request: Request) -> Reply:
        self.calls += 1
        if self.calls == 2:
            self.released.wait(300)
        return self.then(request)


@pytest.mark.clause("run.retry.bound-hit-is-transient")
@pytest.mark.clause("run.retry.bound-hit-recorded")
def test_a_struck_call_deadline_is_transient_and_listed_on_the_run_record(tmp_path: Path, api: JsonApi,
                                                                          store: Store) -> None:
    api.records.extend(records(6))
    released = threading.Event()
    api.route("/items", _SecondHangs(watermark_pages(api.records, "updated_at", 3), released))
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    try:
        with Decoder(deadline_s=5.0) as short:  # far more than a page on loopback takes, even on a busy machine
            result = run(store, manifest, short)
    finally:
        released.set()
    assert ids_of(store) == list(range(6))
    assert result.bound_hits == [{"step": "events page 2", "attempt": 1, "bound": "call-deadline"}]
    history = [r for r in store.runs.history().to_pylist() if r["phase"] == "commit" and r["table_name"] == "events"]
    assert history[-1]["bound_hits"] == [{"step": "events page 2", "attempt": 1, "bound": "call-deadline"}]
    assert issubclass(ConnectorBoundHit, TransientError)
    # every attempt striking the bound: the failure names the bound
    hung = threading.Event()
    api.route("/items", lambda request: (hung.wait(300), Reply(200, {"data": []}))[1])
    store2 = Store.open(tmp_path / "store2")
    try:
        with Decoder(deadline_s=0.5) as short, pytest.raises(ConnectorBoundHit) as caught:
            run(store2, manifest, short, sleep=lambda s: None)
    finally:
        hung.set()
    assert caught.value.bound == "call-deadline" and "call-deadline" in str(caught.value)
    store2.close()


def test_a_failing_pipeline_fails_by_name_and_the_others_run(tmp_path: Path, api: JsonApi, store: Store,
                                                             decoder: Decoder) -> None:
    api.route("/items", malformed_json())
    manifest = manifest_for(tmp_path, f"{api.url}/items")
    results = run_pipelines(store, manifest, decoder=decoder)
    assert not results[0].ok and results[0].failures[0].error == "SourceResponseMalformed"
    assert json.dumps(results[0].to_json())


@pytest.mark.clause("run.own.checkpoint-resume")
def test_a_killed_walk_resumes_its_execution_from_the_cached_checkpoint(tmp_path: Path, api: JsonApi) -> None:
    import os
    import signal
    import subprocess
    import sys

    api.records.extend(records(12))
    serve = watermark_pages(api.records, "updated_at", 2)
    release = threading.Event()

    inside = threading.Event()

    def fourth_page_hangs(request: Request) -> Reply:
        if len(api.requests_to("/items")) == 4 and not release.is_set():
            inside.set()
            release.wait(300)
        return serve(request)

    api.route("/items", fourth_page_hangs)
    manifest_for(tmp_path, f"{api.url}/items")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline", "run",
                              "--checkpoint-mib", "0.000001"], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert inside.wait(300), "the walk never asked for page 4"
    os.killpg(child.pid, signal.SIGKILL)  # the walk is inside page 4's request
    child.wait()
    release.set()

    store = Store.open(tmp_path / ".contextful" / "store")
    scope = "pipeline:events"
    owner = store.journal.owner(scope)
    table = store.table("events")
    committed, seq = table.cursor(scope)
    assert owner is not None and owner.status == "pending" and owner.closed_us is None
    cached = json.loads(owner.cursor)
    assert cached == {"position": committed, "run_id": table.commits()[-1].run_id, "commit_seq": seq}
    assert committed["kind"] == "walk" and committed["token"]
    assert all(step.seq >= owner.replay_from for step in store.journal.steps(owner.execution_id))
    landed = ids_of(store)
    api.requests.clear()
    manifest = parse_manifest(tomllib.loads((tmp_path / "contextful.toml").read_text()), tmp_path)
    with Decoder() as decoder:
        result = run(store, manifest, decoder)
    assert result.execution == owner.execution_id  # the same execution, resumed
    first = api.requests[0]
    assert first.query.get("page_token") == committed["token"]
    assert ids_of(store) == list(range(12)) and len(landed) < 12  # every row exactly once
    assert store.journal.owner(scope).status == "closed-ok"
    store.close()
