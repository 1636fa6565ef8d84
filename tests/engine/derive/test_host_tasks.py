"""Host tasks: registered Python callables deriving content tables and a marker table."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.derive.keys import SEPARATOR
from contextful.engine.derive.tasks import TaskJoin, TaskUnit, register_task, unregister_task
from contextful.storage.errors import DeriveTaskNameTaken, DeriveUnknownTask, ManifestInvalid

from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline


class Calls:
    def __init__(self) -> None:
        self.units: list[str] = []
        self.during: Any = None


@pytest.fixture
def task(request: pytest.FixtureRequest) -> Iterator[tuple[str, Calls]]:
    """A host task splitting a doc's body into chunks, joining the doc's notes."""
    name = f"chunks_{request.node.name[:40].replace('[', '_').replace(']', '_').replace('-', '_')}"
    calls = Calls()

    @register_task(name, task_version="1", marker_table="chunks_done", content_tables=["chunks", "tags"],
                   columns=["body"], joins=[TaskJoin("notes", "doc", ("text",))])
    def chunk(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
        calls.units.append(unit.unit_ref)
        if calls.during is not None:
            calls.during(unit)
        body = unit.parent["body"]
        if body == "BOOM":
            raise RuntimeError("the chunker broke")
        if body == "FOREIGN":
            return {"elsewhere": [{"x": 1}]}
        notes = sorted(n["text"] for n in unit.joined.get("notes", []))
        return {"chunks": [{"text": part} for part in body.split("|") if part],
                "tags": [{"tag": t} for t in notes]}

    try:
        yield name, calls
    finally:
        unregister_task(name)


def _project(tmp_path: Path, task: str, *, tables: str = '["chunks_done", "chunks", "tags"]', extra: str = "",
             marker: str = "chunks_done") -> DeriveProject:
    manifest = (HEADER + files_pipeline("docs") + files_pipeline("notes", "notes/*.ndjson")
                + derive_pipeline("chunking", "docs", task=task, table=marker, config=f"tables = {tables}\n{extra}"))
    project = DeriveProject(tmp_path, manifest=manifest)
    (tmp_path / "notes").mkdir(exist_ok=True)
    return project


def _notes(project: DeriveProject, name: str, rows: list[dict[str, Any]]) -> None:
    (project.root / "notes" / f"{name}.ndjson").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.clause("run.emit.host-rows", "run.bind.host-task")
def test_content_rows_carry_their_unit_and_every_unit_lands_one_marker(tmp_path: Path,
                                                                      task: tuple[str, Calls]) -> None:
    name, _calls = task
    project = _project(tmp_path, name)
    project.parents([{"id": "a", "body": "x|y"}, {"id": "b", "body": ""}])
    _notes(project, "n1", [{"id": 1, "doc": "a", "text": "red"}])
    results = project.run()
    assert results[-1].derive is not None and results[-1].derive["ok"] == 1 and results[-1].derive["empty"] == 1
    chunks = project.rows("SELECT unit_ref, cue_seq, kind, unit_status, task_version, text, length(derivation_key) "
                          "FROM chunks WHERE kind = 'passage' ORDER BY unit_ref, cue_seq")
    assert chunks == [("a", 0, "passage", "ok", "1", "x", 64), ("a", 1, "passage", "ok", "1", "y", 64)]
    markers = project.rows("SELECT unit_ref, cue_seq, kind, unit_status, rows FROM chunks_done ORDER BY unit_ref")
    assert markers == [("a", -1, "marker", "ok", 3), ("b", -1, "marker", "empty", 0)]
    keys = project.rows("SELECT DISTINCT c.derivation_key = m.derivation_key FROM chunks c JOIN chunks_done m "
                        "USING (unit_ref)")
    assert keys == [(True,)]
    with pytest.raises(DeriveTaskNameTaken, match=name):
        register_task(name, task_version="9", marker_table="m", content_tables=["c"])(lambda unit: {})
    with pytest.raises(DeriveTaskNameTaken, match="built-in"):
        register_task("transcribe", task_version="1", marker_table="m", content_tables=["c"])(lambda unit: {})


@pytest.mark.clause("run.bind.unknown-task")
def test_a_task_neither_built_in_nor_registered_is_refused_listing_both(tmp_path: Path,
                                                                       task: tuple[str, Calls]) -> None:
    project = _project(tmp_path, "no_such_task")
    with pytest.raises(ManifestInvalid) as caught:
        project.manifest()
    unknown = [p for p in caught.value.problems if isinstance(p, DeriveUnknownTask)]
    assert unknown and unknown[0].builtin == ("transcribe", "link_preview") and task[0] in unknown[0].registered
    assert "transcribe" in unknown[0].detail and task[0] in unknown[0].detail


@pytest.mark.clause("run.emit.output-tables")
def test_a_host_pipeline_declares_exactly_its_tables_and_a_unit_returns_only_its_content(
        tmp_path: Path, task: tuple[str, Calls]) -> None:
    name, _calls = task
    project = _project(tmp_path, name, tables='["chunks_done", "chunks"]')
    with pytest.raises(ManifestInvalid) as caught:
        project.manifest()
    assert [p.name for p in caught.value.problems] == ["DeriveOutputTablesMismatch"]
    assert "chunks_done, chunks, tags" in caught.value.problems[0].detail
    project = _project(tmp_path, name)
    project.parents([{"id": "good", "body": "g"}, {"id": "bad", "body": "FOREIGN"}])
    results = project.run()
    assert results[-1].derive is not None and (results[-1].derive["ok"], results[-1].derive["failed"]) == (1, 1)
    assert project.rows("SELECT unit_ref FROM chunks WHERE kind = 'passage'") == [("good",)]
    bad = project.rows("SELECT unit_status, last_error, retry FROM chunks_done WHERE unit_ref = 'bad'")
    assert bad[0][0] == "failed" and bad[0][1].startswith("DeriveOutputTablesMismatch") and "elsewhere" in bad[0][1]
    assert bad[0][2] is False


@pytest.mark.clause("run.select.unit-parents")
def test_joined_rows_are_read_once_before_the_first_unit(tmp_path: Path, task: tuple[str, Calls]) -> None:
    name, calls = task
    project = _project(tmp_path, name, extra="")
    project.parents([{"id": "a", "body": "x"}, {"id": "b", "body": "y"}])
    _notes(project, "n1", [{"id": 1, "doc": "a", "text": "first"}, {"id": 2, "doc": "b", "text": "second"},
                           {"id": 3, "doc": "b", "text": "third"}])
    project.run(["docs"])  # docs and its descendants: chunking; notes lands apart
    project.run(["notes"])

    def land_more(unit: TaskUnit) -> None:  # lands a note for b while the run derives a
        if unit.unit_ref == "a":
            with project.store() as store:
                store.append("notes", pa.table({"id": [4], "doc": ["b"], "text": ["late"]}), primary_key=["id"])

    calls.during = land_more
    project.parents([{"id": "a", "body": "x2"}, {"id": "b", "body": "y2"}])
    project.run(["docs"])
    tags = project.rows("SELECT unit_ref, tag FROM tags WHERE kind = 'passage' ORDER BY 1, 2")
    assert tags == [("a", "first"), ("b", "second"), ("b", "third")]  # "late" landed after the read
    calls.during = None
    project.run(["docs"])  # the late note changed b's join: b alone re-derives, with it
    assert project.rows("SELECT tag FROM tags WHERE unit_ref = 'b' AND kind = 'passage' ORDER BY 1") == [
        ("late",), ("second",), ("third",)]


@pytest.mark.clause("run.select.join-key")
def test_a_joined_row_landing_changing_or_leaving_rederives_that_unit_alone(tmp_path: Path,
                                                                           task: tuple[str, Calls]) -> None:
    name, calls = task
    project = _project(tmp_path, name)
    project.parents([{"id": d, "body": d} for d in ("a", "b", "c")])
    _notes(project, "n1", [{"id": 1, "doc": "a", "text": "one"}, {"id": 2, "doc": "b", "text": "two"}])
    project.run()
    assert sorted(calls.units) == ["a", "b", "c"]
    for change in ([{"id": 3, "doc": "c", "text": "new"}],        # lands for c
                   [{"id": 1, "doc": "a", "text": "uno"}]):       # changes a's
        calls.units.clear()
        _notes(project, f"n{len(list((project.root / 'notes').iterdir())) + 1}", change)
        project.run()
        assert calls.units == [change[0]["doc"]]
    calls.units.clear()
    with project.store() as store:  # b's note leaves: its row moves to another doc
        store.append("notes", pa.table({"id": [2], "doc": ["zzz"], "text": ["two"]}), primary_key=["id"])
    project.run(["chunking"])
    assert calls.units == ["b"]


def _host_key(name: str, version: str, columns: list[str], unit: str, parent: dict[str, Any],
              parent_key: str) -> str:
    """The clause's recipe, computed here (docs/derive.md, engine.derive.keys): SHA-256 over the build's
    part (registered name, task_version, declared columns) then the parent row's id, its declared
    columns and its derivation_key."""
    build = json.dumps({"task": name, "task_version": version, "columns": columns}, sort_keys=True,
                       separators=(",", ":"))
    parts = [hashlib.sha256(build.encode()).hexdigest(), json.dumps(unit),
             json.dumps({c: parent[c] for c in columns}, separators=(",", ":")), parent_key, "", ""]
    return hashlib.sha256(SEPARATOR.join(parts).encode()).hexdigest()


@pytest.mark.clause("run.emit.task-version")
def test_the_host_key_follows_name_version_columns_and_parent_key_and_a_raised_version_reselects_all(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A host task chained on a derive tier's passages: its rows carry the key the clause's recipe
    gives, computed here; one input changed at a time (task_version, registered name, declared
    columns, the parent's derivation_key) changes every unit's key and re-derives every unit."""
    names = ("tv_lines", "tv_lines_renamed")
    ran: list[str] = []

    def register(name: str, version: str, columns: list[str]) -> None:
        unregister_task(name)

        @register_task(name, task_version=version, marker_table="lines_done", content_tables=["lines"],
                       columns=columns)
        def copy(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
            ran.append(unit.unit_ref)
            return {"lines": [{"text": unit.parent["text"].upper()}]}

    request.addfinalizer(lambda: [unregister_task(n) for n in names])
    manifest = (HEADER + files_pipeline("docs")
                + derive_pipeline("passages", "docs", engine="lines", media_column="path")
                + derive_pipeline("lining", "passages", parent_id_column="passage_id", task=names[0],
                                  table="lines_done", config='tables = ["lines_done", "lines"]'))
    register(names[0], "1", ["text"])
    project = DeriveProject(tmp_path, manifest=manifest)
    project.parents([{"id": "a", "path": project.media("a.txt", "one\ntwo")},
                     {"id": "b", "path": project.media("b.txt", "three")}])

    def run(name: str, version: str, columns: list[str]) -> dict[str, str]:
        ran.clear()
        results = {r.pipeline: r.derive for r in project.run()}
        assert results["lining"] is not None and results["lining"]["outstanding"] == 3, results
        assert sorted(ran) == ["a:0", "a:1", "b:0"]
        parents = {u: (dict(zip(("text", "cue_seq"), rest, strict=True)), key) for u, *rest, key in project.rows(
            "SELECT passage_id, text, cue_seq, derivation_key FROM passages")}
        landed = project.rows("SELECT unit_ref, derivation_key FROM lines_done UNION ALL "
                              "SELECT unit_ref, derivation_key FROM lines")
        keys = dict(landed)
        assert len(landed) == 6 and len(keys) == 3  # the marker and the content row carry one key
        assert keys == {u: _host_key(name, version, columns, u, parent, parent_key)
                        for u, (parent, parent_key) in parents.items()}
        assert project.rows("SELECT DISTINCT task_version FROM lines_done") == [(version,)]
        return keys

    first = run(names[0], "1", ["text"])
    assert project.run()[-1].derive["outstanding"] == 0  # type: ignore[index]  # settled under its key
    register(names[0], "2", ["text"])                      # the task_version
    raised = run(names[0], "2", ["text"])
    register(names[1], "2", ["text"])                      # the registered name
    (tmp_path / "contextful.toml").write_text(manifest.replace(f'task = "{names[0]}"', f'task = "{names[1]}"'))
    renamed = run(names[1], "2", ["text"])
    register(names[1], "2", ["text", "cue_seq"])           # the declared columns
    widened = run(names[1], "2", ["text", "cue_seq"])
    project.write_machine(extra='allow_hosts = ["127.0.0.1"]\n')  # the parent tier's binding: its keys move,
    reparented = run(names[1], "2", ["text", "cue_seq"])          # its passages (the units' values) do not
    steps = [first, raised, renamed, widened, reparented]
    for before, after in itertools.pairwise(steps):
        assert all(before[u] != after[u] for u in before)


@pytest.mark.clause("run.emit.version-retained")
def test_retained_versions_keep_each_versions_rows(tmp_path: Path, task: tuple[str, Calls]) -> None:
    from contextful.engine.derive import tasks

    name, _calls = task
    project = _project(tmp_path, name, extra="retain_versions = true")
    project.parents([{"id": "a", "body": "p|q"}])
    project.run()
    registered = tasks.host_task(name)
    assert registered is not None
    unregister_task(name)
    register_task(name, task_version="2", marker_table="chunks_done", content_tables=["chunks", "tags"],
                  columns=["body"], joins=registered.joins)(lambda unit: {"chunks": [{"text": "v2"}]})
    project.run()
    assert project.rows("SELECT task_version, text FROM chunks WHERE kind = 'passage' ORDER BY 1, 2") == [
        ("1", "p"), ("1", "q"), ("2", "v2")]


@pytest.mark.clause("run.emit.marker-last")
def test_a_failing_content_table_lands_none_of_the_units_rows_and_the_rerun_derives_it(
        tmp_path: Path, task: tuple[str, Calls]) -> None:
    name, calls = task
    project = _project(tmp_path, name)
    project.parents([{"id": "a", "body": "x|y"}])
    _notes(project, "n1", [{"id": 1, "doc": "a", "text": "t"}])
    with project.store() as store:  # tags.tag is a number: the unit's text tag cannot land in it
        from contextful.engine.derive.emit import KEY_COLUMNS
        from contextful.storage.supersede import Supersede

        store.create_table("tags", KEY_COLUMNS, supersede=Supersede(("unit_ref",)))
        store.append("tags", pa.table({"unit_ref": ["zz"], "derivation_key": ["k"], "cue_seq": [0],
                                       "kind": ["passage"], "unit_status": ["ok"], "task_version": ["1"],
                                       "tag": [[1.5]]}))
    results = project.run()
    assert any(f.error == "SchemaIrreconcilable" for r in results for f in r.failures), [
        f.error for r in results for f in r.failures]
    with project.store() as store:  # content and marker land in one commit: none of them landed
        assert "chunks" not in store.table_names() or store.table("chunks").snapshot().rows_stored == 0
        assert store.table("chunks_done").snapshot().rows_stored == 0
        store.drop_table("tags")
    calls.units.clear()
    project.run()
    assert calls.units == ["a"]  # its marker never landed: the unit ran again
    assert project.rows("SELECT count(*), count(DISTINCT cue_seq) FROM chunks WHERE unit_ref = 'a'") == [(2, 2)]
    assert project.rows("SELECT unit_status FROM chunks_done") == [("ok",)]


@pytest.mark.clause("run.emit.settled-revived")
def test_a_unit_settled_by_another_run_meanwhile_lands_none_of_this_runs_rows(tmp_path: Path,
                                                                             task: tuple[str, Calls]) -> None:
    name, calls = task
    project = _project(tmp_path, name)
    project.parents([{"id": "a", "body": "mine"}, {"id": "b", "body": "b"}])

    def other_run_settles(unit: TaskUnit) -> None:  # another tick lands a's marker under the same key
        if unit.unit_ref == "a":
            with project.store() as store:
                store.append("chunks_done", pa.table({
                    "unit_ref": ["a"], "derivation_key": [unit.derivation_key], "task_version": ["1"],
                    "cue_seq": [-1], "kind": ["marker"], "unit_status": ["empty"], "rows": [0], "attempts": [1],
                    "last_error": pa.array([None], pa.string()), "retry": [False]}))

    calls.during = other_run_settles
    results = project.run()
    revived = [f for f in results[-1].failures if f.error == "DeriveSettledUnitRevived"]
    assert [f.input for f in revived] == ["unit a"]
    assert project.rows("SELECT unit_ref FROM chunks WHERE kind = 'passage' ORDER BY 1") == [("b",)]
    assert project.rows("SELECT unit_ref, unit_status FROM chunks_done ORDER BY 1") == [("a", "empty"), ("b", "ok")]


def test_a_canceled_derive_run_lands_nothing_more_and_the_rerun_derives_what_is_missing(
        tmp_path: Path, task: tuple[str, Calls]) -> None:
    from contextful.engine.run.cancel import request_cancel

    name, calls = task
    project = _project(tmp_path, name)
    project.parents([{"id": d, "body": d} for d in ("a", "b", "c")])

    def cancel_on_first(unit: TaskUnit) -> None:  # `contextful run cancel pipeline:chunking`, mid-run
        if len(calls.units) == 1:
            with project.store() as store:
                request_cancel(store.journal, "pipeline:chunking")

    calls.during = cancel_on_first
    results = project.run()
    assert [f.error for f in results[-1].failures] == ["RunCanceled"]
    with project.store() as store:
        assert store.table("chunks_done").snapshot().rows_stored == 0  # nothing it staged landed
    calls.during = None
    calls.units.clear()
    results = project.run()
    assert results[-1].derive is not None and results[-1].derive["outstanding"] == 3
    assert project.rows("SELECT count(*) FROM chunks_done WHERE unit_status IN ('ok', 'empty')") == [(3,)]


def test_content_columns_come_from_every_row_whichever_unit_lands_first(tmp_path: Path,
                                                                       task: tuple[str, Calls]) -> None:
    """A unit with no content rows lands a marker row in each content table; the table's columns are
    still the union of every row's (a first row without `text` drops no column)."""
    name, _calls = task
    project = _project(tmp_path, name)
    project.parents([{"id": "a", "body": ""}])  # lands first, alone: markers only
    project.run()
    project.parents([{"id": "b", "body": ""}, {"id": "c", "body": "x|y"}])
    project.run()
    assert project.rows("SELECT unit_ref, text FROM chunks WHERE kind = 'passage' ORDER BY 1, 2") == [
        ("c", "x"), ("c", "y")]
    from contextful.engine.derive.emit import host_content_schema

    marker_first = [{"unit_ref": "b", "cue_seq": -1, "kind": "marker"},
                    {"unit_ref": "c", "cue_seq": 0, "kind": "passage", "text": "x"}]
    assert host_content_schema(marker_first, pa.string()).names == ["unit_ref", "cue_seq", "kind", "text"]
