"""Chained derive pipelines: order, parent outcomes, cycles, ``after`` conflicts, foreign tables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.derive.tasks import TaskJoin, TaskUnit, register_task, unregister_task
from contextful.storage.errors import ManifestInvalid

from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline


def _chain_manifest(after: Sequence[str] = ()) -> str:
    """``docs`` landed, ``lines`` derived from each doc's ``path``, ``words`` from each line's ``text``.

    The grandchild is declared first: declaration order gives no landing order.
    """
    return (HEADER + files_pipeline("docs")
            + derive_pipeline("words", "lines", parent_id_column="passage_id", engine="lines",
                              media_column="text", after=after)
            + derive_pipeline("lines", "docs", engine="lines", media_column="path"))


def _chain(tmp_path: Path, after: Sequence[str] = ()) -> DeriveProject:
    return DeriveProject(tmp_path, manifest=_chain_manifest(after))


@pytest.mark.clause("run.select.derive-order")
def test_a_derive_child_runs_after_its_parent_on_the_parents_run(tmp_path: Path) -> None:
    project = _chain(tmp_path)
    assert [p.id for p in project.manifest().in_dependency_order()] == ["docs", "lines", "words"]
    assert [p.id for p in project.manifest().in_dependency_order(["lines"])] == ["lines", "words"]
    project.parents([{"id": "d1", "path": project.media("d1.txt", "alpha\nbeta")}])
    results = project.run(["docs"])  # the parent's run carries the new row through its children
    assert [r.pipeline for r in results] == ["docs", "lines", "words"]
    # the child's units are the parent's passages; the child's media is each passage's text, a
    # local path that does not exist: each fails alone, by name, as a marker of the child
    words = project.rows("SELECT unit_status, last_error FROM words ORDER BY unit_ref")
    assert len(words) == 2 and all(s == "failed" and e.startswith("DeriveMediaUnreadable") for s, e in words)


@pytest.mark.clause("run.select.parent-outcome")
def test_a_child_runs_after_a_failed_parent_outcome_but_not_after_a_launch_failure(tmp_path: Path) -> None:
    project = _chain(tmp_path)
    project.parents([{"id": "d1", "path": project.media("d1.txt", "FAIL")},
                     {"id": "d2", "path": project.media("d2.txt", "ok line")}])
    results = {r.pipeline: r for r in project.run()}
    assert results["lines"].derive is not None and results["lines"].derive["failed"] == 1  # a failed unit
    assert results["words"].derive is not None  # ...is an outcome: the child ran over the committed rows
    assert results["words"].derive["eligible"] == 1  # d2's passage (a marker is no unit)
    broken = _chain(tmp_path / "broken")
    text = (broken.root / "contextful.toml").read_text().replace('media_column = "path"', 'media_column = "nope"')
    (broken.root / "contextful.toml").write_text(text)
    broken.parents([{"id": "d1", "path": broken.media("d1.txt", "x")}])
    results = {r.pipeline: r for r in broken.run()}
    assert [f.error for f in results["lines"].failures] == ["TableNotFound"]  # could not start
    assert [f.error for f in results["words"].failures] == ["UpstreamFailed"]


@pytest.mark.clause("run.select.derive-cycle")
def test_derive_pipelines_reading_each_other_are_a_cycle_naming_every_pipeline(tmp_path: Path) -> None:
    text = _chain_manifest().replace('source_table = "docs"', 'source_table = "words"')
    project = DeriveProject(tmp_path, manifest=text)
    with pytest.raises(ManifestInvalid) as caught:
        project.manifest()
    cycles = [p for p in caught.value.problems if p.name == "DeriveCycle"]
    assert len(cycles) == 1 and set(cycles[0].cycle) == {"lines", "words"}
    assert "lines" in cycles[0].detail and "words" in cycles[0].detail


@pytest.mark.clause("run.select.derive-after-conflict")
def test_a_child_whose_after_names_another_pipeline_is_refused(tmp_path: Path) -> None:
    assert _chain(tmp_path / "ok", after=["lines"]).manifest().pipeline("words").follows == ("lines",)
    project = _chain(tmp_path / "bad", after=["docs"])
    with pytest.raises(ManifestInvalid) as caught:
        project.manifest()
    conflict = [p for p in caught.value.problems if p.name == "DeriveAfterConflict"]
    assert len(conflict) == 1 and conflict[0].parent == "lines" and conflict[0].after == ("docs",)


@pytest.mark.clause("run.select.foreign-output-table")
def test_a_config_key_naming_another_pipelines_output_is_refused(tmp_path: Path) -> None:
    text = _chain_manifest().replace('media_column = "text"', 'media_column = "text"\noutput_table = "lines"')
    with pytest.raises(ManifestInvalid) as caught:
        DeriveProject(tmp_path, manifest=text).manifest()
    foreign = [p for p in caught.value.problems if p.name == "DeriveForeignOutputTable"]
    assert len(foreign) == 1 and foreign[0].key == "output_table" and "lines" in foreign[0].detail


@pytest.fixture
def joining() -> Iterator[str]:
    name = "summaries_join_order"

    @register_task(name, task_version="1", marker_table="summary_done", content_tables=["summaries"],
                   columns=["id"], joins=[TaskJoin("lines", "unit_ref", ("text",)), TaskJoin("words", "unit_ref", ("text",))])
    def summarize(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
        return {"summaries": [{"lines": len(unit.joined["lines"]), "words": len(unit.joined["words"])}]}

    try:
        yield name
    finally:
        unregister_task(name)


@pytest.mark.clause("run.select.join-order")
def test_a_host_task_joining_derive_outputs_runs_after_the_last_of_them(tmp_path: Path, joining: str) -> None:
    text = _chain_manifest() + derive_pipeline("summary", "docs", task=joining, table="summary_done",
                                               config='tables = ["summary_done", "summaries"]')
    project = DeriveProject(tmp_path, manifest=text.replace(
        '[[pipeline]]\nid = "words"', '[[pipeline]]\nid = "words"\npriority = -5'))
    manifest = project.manifest()
    assert manifest.pipeline("summary").derive_parents == ("docs", "lines", "words")
    order = [p.id for p in manifest.in_dependency_order()]
    assert order.index("summary") > order.index("words") > order.index("lines")
    project.parents([{"id": "d1", "path": project.media("d1.txt", "a\nb")}])
    project.run()
    # lines answered before summary read it (words keys its units by passage_id, joining none of d1)
    assert project.rows("SELECT unit_ref, lines, words FROM summaries WHERE kind = 'passage'") == [("d1", 2, 0)]


def test_a_child_over_a_derive_parent_with_nothing_landed_yet_has_no_units(tmp_path: Path) -> None:
    from contextful.engine.derive.bind import machine_path, read_machine
    from contextful.engine.derive.run import build_tier, ensure_tables

    project = _chain(tmp_path)
    machine, _ = read_machine(machine_path(tmp_path))
    with project.store() as store:  # the parent's tables exist (its first run created them) but hold no commit
        ensure_tables(store, build_tier(project.manifest().pipeline("lines"), machine))
    [words] = project.run(["words"])
    assert words.ok and words.derive is not None and words.derive["eligible"] == 0
