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
