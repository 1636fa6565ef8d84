"""A derive flush publishes all or nothing, and a flush failing transiently leaves its execution to resume.

Decision "host-registered-derive" ("a unit spanning several tables is whole once its marker
commits") and the store's promise of no representable torn publication: a host task's content
tables and its marker table land in one catalog commit that requires the marker head the revival
check read (``run.emit.settled-revived``), so a run losing the race to another run publishes
nothing. A transient failure at a flush (``StagingFailed``, ``CatalogUnavailable``) leaves the
execution pending, as a kill does: the next run resumes it and replays the journaled answers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.derive.tasks import TaskUnit, register_task, unregister_task
from contextful.engine.land.results import PipelineResult
from contextful.engine.run.units import run_pipelines

from tests.conftest import StoreFactory
from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline

CATALOGS = pytest.mark.parametrize("store_kind", ["local", pytest.param("postgres", marks=pytest.mark.postgres)],
                                   indirect=True)


@pytest.fixture
def task(request: pytest.FixtureRequest) -> Iterator[str]:
    """A host task writing, as each chunk's text, which pipeline's run derived it (its pool thread)."""
    name = f"race_{request.node.name[:40].replace('[', '_').replace(']', '_').replace('-', '_')}"

    @register_task(name, task_version="1", marker_table="chunks_done", content_tables=["chunks"], columns=["body"])
    def chunk(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
        run = threading.current_thread().name.rsplit("_", 1)[0]  # derive-<pipeline id>
        return {"chunks": [{"text": f"{part} by {run}"} for part in unit.parent["body"].split("|")]}

    try:
        yield name
    finally:
        unregister_task(name)


def _pipelines(project_tasks: str) -> str:
    tier = 'tables = ["chunks_done", "chunks"]'
    return (HEADER + files_pipeline("docs")
            + derive_pipeline("chunking", "docs", task=project_tasks, table="chunks_done", config=tier)
            + derive_pipeline("chunking_b", "docs", task=project_tasks, table="chunks_done", config=tier))


def _rows(store: Any, sql: str) -> list[tuple[Any, ...]]:
    from contextful.engine.read import connect

    con = connect(store)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _committed_by(store: Any, table: str) -> list[str]:
    """The pipeline each commit of ``table`` was made for, oldest first (its run manifest's meta)."""
    t = store.table(table)
    return [t.manifest(c.run_id).meta.get("pipeline") for c in t.commits() if c.run_id]


@CATALOGS
@pytest.mark.clause("run.emit.settled-revived", "run.emit.marker-last")
def test_a_run_losing_the_marker_race_publishes_none_of_its_content(
        tmp_path: Path, make_store: StoreFactory, store_kind: str, task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    project = DeriveProject(tmp_path, manifest=HEADER + files_pipeline("docs"))
    project.parents([{"id": "a", "body": "x|y"}, {"id": "b", "body": "z"}])
    store, other = make_store(), make_store()
    run_pipelines(store, project.manifest())  # the parents alone: a run of docs runs its derive children too
    (tmp_path / "contextful.toml").write_text(_pipelines(task))
    manifest = project.manifest()
    other_results: list[PipelineResult] = []

    def other_run() -> None:
        other_results.extend(run_pipelines(other, manifest, ["chunking_b"]))

    original = store.catalog.commit_many
    raced: list[bool] = []

    def commit_many(requests: Any, clock: Any) -> list[int]:
        # The other run settles every unit after this run checked for revival, before its first
        # commit lands: between this run's content and its marker, as the two ran before.
        if not raced and any(r.table == "chunks" for r in requests):
            raced.append(True)
            racer = threading.Thread(target=other_run)
            racer.start()
            racer.join()
        return original(requests, clock)

    monkeypatch.setattr(store.catalog, "commit_many", commit_many)
    results = run_pipelines(store, manifest, ["chunking"])
    monkeypatch.undo()
    assert raced
    assert other_results[-1].derive is not None and other_results[-1].derive["ok"] == 2
    mine = results[-1]
    assert sorted(f.input for f in mine.failures if f.error == "DeriveSettledUnitRevived") == ["unit a", "unit b"]
    assert [(t.table, t.rows) for t in mine.tables] == [("chunks", 0), ("chunks_done", 0)]
    # What readers see: content and marker from the other run alone (an oracle over the rows).
    assert _rows(other, "SELECT unit_ref, text FROM chunks WHERE kind = 'passage' ORDER BY 1, 2") == [
        ("a", "x by derive-chunking_b"), ("a", "y by derive-chunking_b"), ("b", "z by derive-chunking_b")]
    assert _rows(other, "SELECT unit_ref, unit_status, rows FROM chunks_done ORDER BY 1") == [
        ("a", "ok", 2), ("b", "ok", 1)]
    assert _committed_by(other, "chunks") == ["chunking_b"]
    assert _committed_by(other, "chunks_done") == ["chunking_b"]


@CATALOGS
def test_a_flush_failing_transiently_leaves_the_execution_to_resume_without_asking_the_engine_again(
        tmp_path: Path, make_store: StoreFactory, store_kind: str) -> None:
    project = DeriveProject(tmp_path)
    project.parents([{"id": f"u{n}", "path": project.media(f"u{n}.txt", f"line {n}")} for n in range(4)])
    store = make_store()
    root = Path(store.objects.uri("tables/passages"))
    root.mkdir(parents=True)
    (root / "parts").write_text("a file where the part directory goes")  # the part write fails: StagingFailed
    failing = run_pipelines(store, project.manifest())
    assert [f.error for f in failing[-1].failures] == ["StagingFailed"]
    assert len(project.engine_calls()) == 4
    owner = store.journal.owner("pipeline:passages")
    (root / "parts").unlink()  # the disk is writable again
    again = run_pipelines(store, project.manifest())
    assert len(project.engine_calls()) == 4  # one engine call per unit across both runs
    derive = again[-1].derive
    assert again[-1].ok and derive is not None
    assert (derive["replayed"], derive["ok"]) == (4, 4)
    assert owner is not None and owner.status == "pending"  # left to resume, as a kill leaves it
    assert again[-1].execution == owner.execution_id  # the same execution, resumed
    assert _rows(store, "SELECT unit_ref, text FROM passages WHERE kind = 'passage' ORDER BY 1") == [
        (f"u{n}", f"line {n}") for n in range(4)]
    closed = store.journal.owner("pipeline:passages")
    assert closed is not None and closed.status == "closed-ok"
