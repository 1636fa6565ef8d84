"""A derived row lives only as long as its parent (decision "derived-unit-follows").

Passage ids are unique within their table (under ``retain_versions`` too), and a parent that leaves —
deleted from its table, re-landed without it, or a parent passage gone after its unit re-derived to
fewer passages — takes its derived rows with it at the next run of the derive pipeline (docs/derive.md,
"When a derived row leaves"). The oracle is plain DuckDB over the parent table's stored rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from contextful.storage import Store

from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline


def _machine(project: DeriveProject, lines_env: str = "") -> None:
    """``lines`` (the parent tier's engine) and ``words`` (the child's): one script, two bindings,
    each logging its calls to a file of its own; ``lines_env`` adds to the parent binding's env (a
    changed binding: a new task version of the parent tier)."""
    def block(name: str, env: str = "") -> str:
        log = json.dumps(str(project.root / f"{name}.calls"))
        return (f'[derive.{name}]\ncommand = [{json.dumps(sys.executable)}, '
                f'{json.dumps(str(project.root / "engine.py"))}, "{{input}}"]\n'
                f'env = {{ DERIVE_LOG = {log}{env} }}\n')
    (project.root / "contextful.machine.toml").write_text(block("lines", lines_env) + block("words"))


def _calls(project: DeriveProject, name: str) -> list[str]:
    path = project.root / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


def _chain(tmp_path: Path, parent_config: str = "") -> DeriveProject:
    """``docs`` landed; ``lines`` derived from each doc's file (one passage per line, each line the
    path of a word file); ``words`` derived from each line's passage, its media the line's text."""
    manifest = (HEADER + files_pipeline("docs")
                + derive_pipeline("lines", "docs", engine="lines", media_column="path", config=parent_config)
                + derive_pipeline("words", "lines", parent_id_column="passage_id", engine="words",
                                  media_column="text"))
    project = DeriveProject(tmp_path, manifest=manifest)
    _machine(project)
    return project


@pytest.mark.clause("run.emit.version-retained", "run.select.anti-join")
def test_a_chained_tier_over_retained_versions_derives_each_passage_once_and_answers_stably(tmp_path: Path) -> None:
    project = _chain(tmp_path, "retain_versions = true")
    for word in ("w1", "w2"):
        project.media(f"{word}.txt", f"{word} text")
    project.parents([{"id": "d1", "path": project.media("d1.txt", "media/w1.txt\nmedia/w2.txt")}])
    project.run()
    _machine(project, lines_env=', VERSION = "2"')  # the parent's binding changed: its task version too
    project.run()
    # the oracle: the parent's live passages, one per (unit, version, cue), each with its own id
    passages = project.rows("SELECT unit_ref, task_version, cue_seq, passage_id FROM lines WHERE kind = 'passage'")
    assert len(passages) == 4 and len({(u, v, c) for u, v, c, _ in passages}) == 4
    assert len({p for *_, p in passages}) == 4, passages  # passage ids are unique within the table
    derived = project.rows("SELECT unit_ref, text FROM words WHERE kind = 'passage' ORDER BY 1")
    assert sorted(u for u, _ in derived) == sorted(p for *_, p in passages)
    calls = len(_calls(project, "words"))
    assert calls == 4  # one engine call per parent passage, whatever the order the runs took
    for _ in range(3):  # nothing outstanding: no call, the same answer
        results = {r.pipeline: r.derive for r in project.run()}
        assert results["words"] is not None and results["words"]["outstanding"] == 0, results
        assert len(_calls(project, "words")) == calls
        assert project.rows("SELECT unit_ref, text FROM words WHERE kind = 'passage' ORDER BY 1") == derived


def _live_parent_ids(project: DeriveProject) -> set[str]:
    """The oracle for a landed parent: plain DuckDB over the ``docs`` table's live part files."""
    import duckdb

    with project.store() as store:
        uris = list(store.table("docs").snapshot().uris)
    if not uris:
        return set()
    return {r[0] for r in duckdb.sql(f"SELECT DISTINCT id FROM read_parquet({uris!r})").fetchall()}


def _units(project: DeriveProject, table: str) -> set[str]:
    """The units ``table`` answers any row of (passages and markers alike)."""
    return {r[0] for r in project.rows(f"SELECT DISTINCT unit_ref FROM {table}")}


def _dry_run(project: DeriveProject) -> dict[str, dict[str, int]]:
    from tests.support.cli import contextful

    shown = json.loads(contextful(project.root, "--json", "pipeline", "run", "--dry-run").stdout)
    return {p["pipeline"]: p for p in shown if p["source"] == "derive"}


def _run(project: DeriveProject) -> dict[str, dict[str, int]]:
    results = {r.pipeline: r.derive for r in project.run()}
    return {k: v for k, v in results.items() if v is not None}


@pytest.mark.clause("run.select.anti-join", "run.emit.stale-supersedes", "run.select.dry-run")
def test_a_parent_that_leaves_takes_its_derived_rows_and_its_chained_rows_at_the_next_run(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    project = _chain(tmp_path)
    for word in ("w1", "w2", "w3"):
        project.media(f"{word}.txt", f"{word} text")
    project.parents([{"id": "d1", "path": project.media("d1.txt", "media/w1.txt\nmedia/w2.txt")},
                     {"id": "d2", "path": project.media("d2.txt", "media/w3.txt\nmedia/w1.txt")},
                     {"id": "d3", "path": project.media("d3.txt", "FAIL")}])  # a failed marker: a derived row too
    _run(project)

    def agrees() -> None:  # the derived tables answer exactly the live parents' units
        assert _units(project, "lines") == _live_parent_ids(project)
        live_passages = {r[0] for r in project.rows("SELECT passage_id FROM lines WHERE kind = 'passage'")}
        assert _units(project, "words") == live_passages
        assert not project.rows("SELECT w.unit_ref FROM words AS w ANTI JOIN lines AS l "
                                "ON l.passage_id = w.unit_ref AND l.kind = 'passage'")  # no orphaned citation

    agrees()
    assert _units(project, "words") == {"d1:0", "d1:1", "d2:0", "d2:1"}

    # d1 and d3 deleted: the parent table re-landed without them
    remaining = tmp_path / "remaining.ndjson"
    remaining.write_text(json.dumps({"id": "d2", "path": "media/d2.txt"}) + "\n")
    contextful(tmp_path, "table", "load", "docs", str(remaining), "--replace")
    assert _live_parent_ids(project) == {"d2"}
    dry = _dry_run(project)
    assert (dry["lines"]["outstanding"], dry["lines"]["retiring"]) == (0, 2), dry
    assert dry["words"]["retiring"] == 0  # d1's passages still answer until `lines` runs
    shown = contextful(tmp_path, "pipeline", "run", "--dry-run", "lines").stdout
    assert "0 outstanding, 2 to retire (parent gone)" in shown
    calls = (len(_calls(project, "lines")), len(_calls(project, "words")))
    results = _run(project)
    assert (results["lines"]["retired"], results["words"]["retired"]) == (2, 2), results
    assert (len(_calls(project, "lines")), len(_calls(project, "words"))) == calls  # retiring calls no engine
    agrees()
    assert _units(project, "lines") == {"d2"} and _units(project, "words") == {"d2:0", "d2:1"}
    assert _dry_run(project)["lines"]["retiring"] == 0
    assert _run(project)["lines"]["retired"] == 0  # retired once
    for table in ("lines", "words"):  # a fold drops what the retirements withhold, and answers the same
        contextful(tmp_path, "table", "fold", table)
    agrees()
    assert _units(project, "lines") == {"d2"} and _units(project, "words") == {"d2:0", "d2:1"}

    # d2 re-derived to fewer passages: its child of the passage gone leaves on the same run
    project.media("d2.txt", "media/w3.txt")
    results = _run(project)
    assert (results["lines"]["outstanding"], results["words"]["retired"]) == (1, 1), results
    agrees()
    assert _units(project, "words") == {"d2:0"}
    assert project.rows("SELECT text FROM words WHERE kind = 'passage'") == [("w3 text",)]

    # d1 comes back: derived again, and answers again
    project.parents([{"id": "d1", "path": "media/d1.txt"}])
    results = _run(project)
    assert (results["lines"]["outstanding"], results["lines"]["retired"]) == (1, 0), results
    agrees()
    assert _units(project, "words") == {"d1:0", "d1:1", "d2:0"}
    assert project.rows("SELECT unit_ref, text FROM words WHERE unit_ref LIKE 'd1:%' ORDER BY 1") == [
        ("d1:0", "w1 text"), ("d1:1", "w2 text")]


def _register(name: str, version: str) -> None:
    from contextful.engine.derive.tasks import TaskUnit, register_task, unregister_task

    unregister_task(name)

    @register_task(name, task_version=version, marker_table="chunks_done", content_tables=["chunks"], columns=["body"])
    def split(unit: TaskUnit) -> dict[str, list[dict[str, str]]]:
        return {"chunks": [{"text": f"v{version} {part}"} for part in unit.parent["body"].split("|")]}


@pytest.mark.clause("run.emit.version-retained", "run.emit.stale-supersedes", "run.select.dry-run")
def test_a_deleted_parent_takes_every_versions_content_and_marker_rows_on_every_store(
        tmp_path: Path, store: Store, request: pytest.FixtureRequest) -> None:
    """A host task under ``retain_versions`` on each store adapter, through the library: the parent
    table is loaded and re-loaded without a row (``load_file(replace=True)``), the pipeline run and
    dry-run as the command line runs them."""
    from contextful.engine.config import load_manifest
    from contextful.engine.derive.bind import machine_path, read_machine
    from contextful.engine.derive.run import dry_run, run_derive
    from contextful.engine.derive.tasks import unregister_task
    from contextful.engine.load import load_file

    name = f"chunks_{request.node.callspec.id.replace('-', '_')}"
    (tmp_path / "contextful.toml").write_text(HEADER + derive_pipeline(
        "chunking", "docs", task=name, table="chunks_done",
        config='tables = ["chunks_done", "chunks"]\nretain_versions = true'))
    _register(name, "1")
    manifest = load_manifest(tmp_path)
    spec = manifest.pipeline("chunking")
    machine, _ = read_machine(machine_path(tmp_path))

    def docs(rows: list[dict[str, str]], *, replace: bool = False) -> set[str]:
        path = tmp_path / "docs.ndjson"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        load_file(store, "docs", path, primary_key=("id",), replace=replace)
        uris = list(store.table("docs").snapshot().uris)  # the oracle: plain DuckDB over the live parts
        con = store.duckdb()  # (the store's filesystem registered: an s3:// part reads through it)
        try:
            return {r[0] for r in con.sql(f"SELECT DISTINCT id FROM read_parquet({uris!r})").fetchall()}
        finally:
            con.close()

    def answered(table: str) -> list[tuple[str, str]]:
        rows = store.table(table).to_arrow().to_pylist()
        return sorted((r["unit_ref"], r["task_version"]) for r in rows)

    try:
        docs([{"id": "d1", "body": "a|b"}, {"id": "d2", "body": "c"}])
        run_derive(store, manifest, spec, machine)
        _register(name, "2")
        run_derive(store, manifest, spec, machine)
        ids = [r["passage_id"] for r in store.table("chunks").to_arrow().to_pylist()]
        assert len(ids) == len(set(ids)) == 6  # two versions of three chunks, each id its own
        assert answered("chunks_done") == [("d1", "1"), ("d1", "2"), ("d2", "1"), ("d2", "2")]

        live = docs([{"id": "d2", "body": "c"}], replace=True)  # d1 deleted
        assert live == {"d2"}
        counts = dry_run(store, manifest, spec, machine)
        assert (counts.outstanding, counts.retiring) == (0, 2)  # d1's two versions
        assert answered("chunks_done") == [("d1", "1"), ("d1", "2"), ("d2", "1"), ("d2", "2")]  # a dry run lands nothing
        result = run_derive(store, manifest, spec, machine)
        assert result.derive is not None and result.derive["retired"] == 2
        for table in ("chunks", "chunks_done"):
            assert {u for u, _ in answered(table)} == live, table
        assert answered("chunks") == [("d2", "1"), ("d2", "2")]
        assert dry_run(store, manifest, spec, machine).retiring == 0

        docs([{"id": "d1", "body": "a|b"}])  # d1 back: derived again under the current version
        result = run_derive(store, manifest, spec, machine)
        assert result.derive is not None and (result.derive["outstanding"], result.derive["retired"]) == (1, 0)
        assert sorted(r["text"] for r in store.table("chunks").to_arrow().to_pylist() if r["unit_ref"] == "d1") == [
            "v2 a", "v2 b"]
    finally:
        unregister_task(name)
