"""``contextful run cancel``: a mark on a run in flight, a status of its own, abandoned work.

``run.cancel.not-in-flight``: only a pending owner takes the mark (every journal adapter); a stop
matching nothing pending is CancelTargetNotInFlight (409, non-zero exit); marking twice keeps the
first mark. ``run.cancel.distinct-terminal-status``: a canceled run records ``canceled`` (its owner
``closed-canceled``), never ``failed``, and upstream health skips it. ``run.cancel.abandoned-work``:
a real ``contextful pipeline run`` over a loopback HTTP source, held on its second page until the
test has canceled it, lands nothing, records canceled, leaves its position alone, and the re-run
lands exactly what is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.run.cancel import request_cancel
from contextful.engine.run.execution import Execution, open_execution, plan_reference
from contextful.engine.run.health import upstream_health
from contextful.engine.run.keeper import Keeper
from contextful.storage import Store
from contextful.storage.clock import ManualClock
from contextful.storage.errors import CancelTargetNotInFlight, RunCanceled
from contextful.storage.journal import (
    CLOSED_CANCELED,
    CLOSED_FAILED,
    CLOSED_OK,
    PENDING,
    RETIRED,
    JournalStore,
)
from contextful.storage.run_record import RunFailure

from tests.support.cli import contextful
from tests.support.http_api import JsonApi, Reply, Request, next_url_pages

Opener = Callable[..., Execution]
"""How a scenario opens its executions: ``open_execution`` here; the orchestrator's conformance suite
(``tests/engine/run/test_orchestrate.py``) passes one that opens each as the unit of a provider step."""

T0 = 1_700_000_000_000_000
PLAN = plan_reference({"pipeline": "orders", "v": 1})


@pytest.fixture
def keeper() -> Keeper:
    return Keeper(ManualClock(T0), start=False)  # nothing renews behind the test's back


def _cli(project: Path, *args: str, code: int = 0) -> str:
    """``contextful`` in this process (click's runner): the child-process cost goes to the run itself."""
    from click.testing import CliRunner
    from contextful.engine.cli import cli

    result = CliRunner().invoke(cli, ["--project", str(project), *args])
    assert result.exit_code == code, result.output
    return result.output


# --- run.cancel.not-in-flight ---------------------------------------------------------------------


@pytest.mark.clause("run.cancel.not-in-flight")
def test_only_a_pending_owner_takes_the_mark_and_a_second_mark_keeps_the_first(
        journal: JournalStore, keeper: Keeper, open_execution: Opener = open_execution) -> None:
    clock = ManualClock(T0)
    ex = open_execution(journal, "host:crawl", PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
    marked = request_cancel(journal, ex.execution_id, clock=clock)
    assert (marked.execution_id, marked.status, marked.cancel_requested_us) == (ex.execution_id, PENDING, T0)
    clock.advance(5)
    again = request_cancel(journal, "host:crawl", clock=clock)  # by scope, and a second time: idempotent
    assert again.cancel_requested_us == T0 and journal.owner("host:crawl") == again
    assert not ex.cancel_token.is_set()  # the mark is durable; the token is fed by a poll or renewal
    assert ex.poll_cancel() and ex.cancel_token.is_set()
    with pytest.raises(RunCanceled) as canceled:
        ex.raise_if_canceled()
    assert (canceled.value.execution, canceled.value.scope, canceled.value.category) == (
        ex.execution_id, "host:crawl", "canceled")
    ex.close_canceled()

    # every terminal status refuses the mark, by execution id and by scope, and is left as it was
    for scope, settle in (("s:ok", lambda e: e.close(ok=True)), ("s:failed", lambda e: e.close(ok=False)),
                          ("s:retired", lambda e: journal.retire(e.execution_id, T0)),
                          ("s:canceled", lambda e: e.close_canceled())):
        done = open_execution(journal, scope, PLAN, holder="h", lease_s=30, clock=clock, keeper=keeper)
        settle(done)
        before = journal.owner(scope)
        assert before is not None and before.status in (CLOSED_OK, CLOSED_FAILED, RETIRED, CLOSED_CANCELED)
        for target in (done.execution_id, scope):
            with pytest.raises(CancelTargetNotInFlight) as info:
                request_cancel(journal, target, clock=clock)
            assert info.value.target == target and before.status in info.value.detail
            assert (info.value.http_status, info.value.exit_code) == (409, 5)
        assert journal.owner(scope) == before
    with pytest.raises(CancelTargetNotInFlight) as unknown:
        request_cancel(journal, "no-such-run", clock=clock)
    assert "no-such-run" in str(unknown.value) and "run executions" in str(unknown.value)


@pytest.mark.clause("run.cancel.not-in-flight")
def test_run_cancel_at_the_terminal_marks_once_and_refuses_what_is_not_in_flight(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "c"\n')
    with Store.open(tmp_path / ".contextful" / "store") as store:
        execution = open_execution(store.journal, "pipeline:orders", PLAN, holder="elsewhere:1:x", lease_s=600,
                                   keeper=Keeper(start=False)).execution_id  # in flight in "another process"
    first = json.loads(_cli(tmp_path, "--json", "run", "cancel", execution))
    assert first["execution"] == execution and first["status"] == PENDING
    second = json.loads(_cli(tmp_path, "--json", "run", "cancel", "pipeline:orders"))
    assert second == first  # marking twice is marking once: the first instant stays
    listed = json.loads(_cli(tmp_path, "--json", "run", "executions", "--pending"))
    assert [(o["execution"], o["cancel_requested_at"]) for o in listed] == [(execution, first["cancel_requested_at"])]
    missing = contextful(tmp_path, "run", "cancel", "nope", check=False)  # a real terminal: the exit code
    assert missing.returncode == 5 and "error: CancelTargetNotInFlight" in missing.stderr and "nope" in missing.stderr


@pytest.mark.clause("run.cancel.not-in-flight")
def test_a_stop_matching_nothing_in_flight_answers_409_over_the_served_face(tmp_path: Path,
        open_execution: Opener = open_execution) -> None:
    """The control plane's stop route arrives with it; any route of the served face calling the same
    verb answers CancelTargetNotInFlight with 409 and the error's name."""
    import re
    import urllib.error
    import urllib.request

    from contextful.engine.served.face import Route, serve_face

    with Store.open(tmp_path / "store") as store:
        ex = open_execution(store.journal, "pipeline:orders", PLAN, lease_s=600, keeper=Keeper(start=False))

        def stop(exchange: Any, match: re.Match[str]) -> None:
            owner = request_cancel(store.journal, match["run"])
            exchange.send_json(200, {"execution": owner.execution_id})

        face = serve_face(("127.0.0.1", 0), [Route("POST", re.compile(r"/runs/(?P<run>[^/]+)/cancel"), stop,
                                                    "POST /runs/<run>/cancel")])
        try:
            def post(run: str) -> tuple[int, dict[str, Any]]:
                request = urllib.request.Request(f"{face.url}/runs/{run}/cancel", data=b"", method="POST")
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        return answer.status, json.loads(answer.read())
                except urllib.error.HTTPError as refused:
                    return refused.code, json.loads(refused.read())

            assert post(ex.execution_id) == (200, {"execution": ex.execution_id})
            ex.close_canceled()
            status, body = post(ex.execution_id)
            assert status == 409 and body["error"] == "CancelTargetNotInFlight" and "closed-canceled" in body["detail"]
            assert post("nope")[0] == 409
        finally:
            face.shutdown(grace_s=5)


# --- run.cancel.distinct-terminal-status -------------------------------------------------------------


def _run(store: Store, table: str, outcome: str) -> str:
    """One recorded run of ``table``: committed, failed or canceled (given up on RunCanceled)."""
    txn = store.table(table).transaction("append")
    txn.stage(pa.table({"id": [1]}))
    if outcome == "committed":
        txn.commit()
    else:
        exc = RunCanceled("e1", f"pipeline:{table}") if outcome == "canceled" else ValueError("source broke")
        txn.abort(RunFailure.of(exc, lambda text: text))
    return txn.run_id


@pytest.mark.clause("run.cancel.distinct-terminal-status")
def test_a_canceled_run_records_canceled_and_upstream_health_skips_it(tmp_path: Path) -> None:
    from contextful.engine.run.records import run_detail, run_history

    with Store.open(tmp_path / "store") as store:
        store.create_table("up", ())
        store.create_table("down", ())
        ok = _run(store, "up", "committed")
        canceled = _run(store, "up", "canceled")
        failed = _run(store, "down", "failed")
        _run(store, "down", "canceled")
        by_id = {r["run_id"]: r for r in run_history(store)}
        assert by_id[canceled]["status"] == "canceled" and by_id[failed]["status"] == "failed"
        assert by_id[canceled]["failure"]["error"] == "RunCanceled"
        assert run_detail(store, canceled)["status"] == "canceled"
        health = upstream_health(store, ["up", "down", "never"])
    up, down = health["up"], health["down"]
    assert up is not None and (up.run_id, up.status, up.healthy) == (ok, "committed", True)  # not spoiled
    assert down is not None and (down.run_id, down.status, down.healthy) == (failed, "failed", False)  # not restored
    assert down.error == "ValueError" and health["never"] is None


# --- run.cancel.abandoned-work ---------------------------------------------------------------------

MANIFEST = """
[project]
name = "cancel"

[[pipeline]]
id = "events"
table = "events"
incremental = "updated_at"
primary_key = ["id"]
[pipeline.source]
kind = "http"
[pipeline.source.config]
url = "{url}"
paginate = "next_url"
"""


class HeldPages:
    """Pages of the API's records; when armed, the second page waits until the test releases it."""

    def __init__(self, api: JsonApi) -> None:
        self.pages = next_url_pages(api.records, 2)
        self.armed = False
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, request: Request) -> Reply:
        if self.armed and request.query.get("page") == "2":
            self.reached.set()
            assert self.release.wait(120), "the test never released the held page"
        return self.pages(request)


def _landed(project: Path) -> tuple[list[int], Any]:
    with Store.open(project / ".contextful" / "store") as store:
        table = store.table("events")
        ids = sorted(table.to_arrow().column("id").to_pylist())
        return ids, table.cursor("pipeline:events")


def _run_here(project: Path) -> dict[str, Any]:
    return json.loads(_cli(project, "--json", "pipeline", "run"))[0]


@pytest.mark.clause("run.cancel.abandoned-work", "run.cancel.distinct-terminal-status")
def test_a_canceled_pipeline_run_lands_nothing_records_canceled_and_leaves_its_position(tmp_path: Path) -> None:
    with JsonApi() as api:
        held = HeldPages(api)
        api.route("/items", held)
        api.records.extend({"id": i, "updated_at": i} for i in range(4))
        (tmp_path / "contextful.toml").write_text(MANIFEST.format(url=f"{api.url}/items"))
        assert _run_here(tmp_path)["ok"]
        ids, position = _landed(tmp_path)
        assert ids == [0, 1, 2, 3] and position is not None

        api.records.extend({"id": i, "updated_at": i} for i in range(4, 10))
        held.armed = True
        child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path),
                                  "--json", "pipeline", "run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        try:
            assert held.reached.wait(120), "the run never asked for its second page"
            pending = json.loads(_cli(tmp_path, "--json", "run", "executions", "--pending"))
            assert [o["scope"] for o in pending] == ["pipeline:events"]
            execution = pending[0]["execution"]
            _cli(tmp_path, "run", "cancel", execution)
        finally:
            held.release.set()
            out, err = child.communicate(timeout=300)
        held.armed = False

        assert child.returncode == 10, err  # the canceled category's exit code: non-zero, not a failure's
        result = json.loads(out)[0]
        assert not result["ok"] and [f["error"] for f in result["failures"]] == ["RunCanceled"]
        assert execution in result["failures"][0]["detail"]
        assert _landed(tmp_path) == (ids, position)  # nothing landed, the position left alone

        owners = json.loads(_cli(tmp_path, "--json", "run", "executions"))
        assert [(o["execution"], o["status"]) for o in owners] == [(execution, CLOSED_CANCELED)]
        history = json.loads(_cli(tmp_path, "--json", "run", "history"))
        assert history[-1]["status"] == "canceled" and history[-1]["failure"]["error"] == "RunCanceled"
        assert [r["status"] for r in history].count("committed") == 1  # only the first run's commit
        shown = _cli(tmp_path, "run", "show", history[-1]["run_id"])
        assert "canceled" in shown and "RunCanceled" in shown

        rerun = _run_here(tmp_path)
        assert rerun["ok"] and rerun["execution"] != execution
        ids, _ = _landed(tmp_path)
        assert ids == list(range(10))  # exactly what was missing, each once


TWO_PIPELINES = """
[project]
name = "two"

[[pipeline]]
id = "up"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["up/*.ndjson"]

[[pipeline]]
id = "down"
after = ["up"]
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["down/*.ndjson"]
"""


@pytest.mark.clause("run.cancel.distinct-terminal-status", "run.cancel.abandoned-work")
def test_a_canceled_upstream_neither_lands_nor_fails_what_runs_after_it(tmp_path: Path, decoder: Any) -> None:
    from contextful.engine.config import load_manifest
    from contextful.engine.land.results import Progress
    from contextful.engine.run.units import run_pipelines

    (tmp_path / "contextful.toml").write_text(TWO_PIPELINES)
    for name in ("up", "down"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.ndjson").write_text('{"id": 1}\n')
    manifest = load_manifest(tmp_path)
    with Store.open(tmp_path / ".contextful" / "store") as store:
        assert all(r.ok for r in run_pipelines(store, manifest, decoder=decoder))
        position = store.table("up").cursor("pipeline:up")
        (tmp_path / "up" / "b.ndjson").write_text('{"id": 2}\n')
        (tmp_path / "down" / "b.ndjson").write_text('{"id": 2}\n')

        def cancel_up(progress: Progress) -> None:  # `run cancel` from elsewhere, while up is in flight
            if progress.pipeline == "up":
                request_cancel(store.journal, "pipeline:up")

        up, down = run_pipelines(store, manifest, decoder=decoder, progress=cancel_up)
        assert [f.error for f in up.failures] == ["RunCanceled"] and up.failures[0].exit_code == 10
        assert store.table("up").cursor("pipeline:up") == position and store.table("up").count() == 1
        owner = store.journal.owner("pipeline:up")
        assert owner is not None and owner.status == CLOSED_CANCELED
        assert down.ok and store.table("down").count() == 2  # its upstream's health skipped the cancel
        health = upstream_health(store, ["up"])["up"]
        assert health is not None and health.healthy


@pytest.mark.clause("run.cancel.abandoned-work")
def test_a_cancel_ends_a_retry_wait_under_way_with_the_canceled_tag(tmp_path: Path, decoder: Any) -> None:
    from contextful.engine.config import load_manifest
    from contextful.engine.run.units import run_pipelines

    with JsonApi() as api, Store.open(tmp_path / ".contextful" / "store") as store:
        def unavailable(request: Request) -> Reply:  # and `run cancel` arrives while the run waits to retry
            request_cancel(store.journal, "pipeline:events")
            return Reply(503, {"error": "down"})

        api.route("/items", unavailable)
        (tmp_path / "contextful.toml").write_text(
            MANIFEST.format(url=f"{api.url}/items") + "retry = { attempts = 3, base_s = 600, max_s = 600 }\n")
        [result] = run_pipelines(store, load_manifest(tmp_path), decoder=decoder)
        assert [f.error for f in result.failures] == ["RunCanceled"]
        assert len(api.requests) == 1  # the 600 s wait ended at the keeper's next poll: no second request
        owner = store.journal.owner("pipeline:events")
        assert owner is not None and owner.status == CLOSED_CANCELED
        assert "events" not in store.table_names() or store.table("events").count() == 0
