"""``contextful run history`` and ``run show`` as a user runs them: a failed run is shown failed,
with its masked error line; one run is shown whole; ``run rewind --force`` is refused like any unsafe rewind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import contextful, contextful_in

MANIFEST = """\
[project]
name = "runs"

[[pipeline]]
id = "events"
normalize = "relational"

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""

SECRET = "AKIA" + "Q" * 16
"""An AWS access key id the secret guard masks as ``[masked:aws-access-key-id]``."""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text(f'{{"id": 1, "tags": ["x", "y"], "note": "key {SECRET}"}}\n')
    (tmp_path / "raw" / "b.ndjson").write_text('{"id": 2.5, "tags": ["z"], "note": "plain"}\n')
    return tmp_path


def _store_files(project: Path) -> set[Path]:
    return set((project / ".contextful").rglob("*"))


def test_a_failed_run_shows_failed_with_its_masked_error_line(project: Path) -> None:
    contextful(project, "pipeline", "run")
    bad = project / "raw" / f"c-{SECRET}.ndjson"  # the error names the input, so the secret too
    bad.write_text('{"id": 3, "tags": \n')
    failed = contextful(project, "pipeline", "run", check=False)
    assert failed.returncode == 4 and "InputMalformed" in failed.stderr

    history = json.loads(contextful(project, "--json", "run", "history").stdout)
    assert [r["status"] for r in history if r["table"] == "events"] == ["committed", "failed"]
    last = history[-1]
    assert last["failure"]["error"] == "InputMalformed"
    assert "[masked:aws-access-key-id]" in last["failure"]["detail"] and SECRET not in last["failure"]["detail"]

    text = contextful(project, "run", "history").stdout
    assert SECRET not in text
    line = next(x for x in text.splitlines() if x.startswith(f"  {last['run_id']} failed: "))
    assert line.startswith(f"  {last['run_id']} failed: InputMalformed: ") and "c-[masked:aws-access-key-id]" in line

    shown = contextful(project, "run", "show", last["run_id"]).stdout
    assert "status       failed" in shown and "error: InputMalformed: " in shown and SECRET not in shown
    detail = json.loads(contextful(project, "--json", "run", "show", last["run_id"]).stdout)
    assert detail["status"] == "failed" and detail["failure"] == last["failure"] and detail["rows"] is None


@pytest.mark.parametrize("children", ["0", "2"])
def test_a_run_given_up_after_it_opened_is_failed_not_planned(tmp_path: Path, children: str) -> None:
    """A null key refuses the batch: landed by the run process (``CONTEXTFUL_LAND_CHILDREN=0``) after
    the run opened (its plan row), and the run is given up; landed by the input's child, before it
    opened. Either way history says failed, never a run forever planned."""
    (tmp_path / "contextful.toml").write_text(MANIFEST.replace('normalize = "relational"', 'primary_key = ["id"]'))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.ndjson").write_text('{"id": null, "note": "x"}\n')
    failed = contextful_in(None, "--project", str(tmp_path), "pipeline", "run", check=False,
                           env={"CONTEXTFUL_LAND_CHILDREN": children})
    assert failed.returncode == 4 and "PrimaryKeyNull" in failed.stderr
    history = json.loads(contextful(tmp_path, "--json", "run", "history").stdout)
    assert [(r["status"], r["failure"]["error"]) for r in history] == [("failed", "PrimaryKeyNull")]
    detail = json.loads(contextful(tmp_path, "--json", "run", "show", history[0]["run_id"]).stdout)
    assert detail["finished_at"] is not None
    assert (detail["planned_at"] is not None) == (children == "0")  # it had opened in the run process


def test_run_show_shows_one_run_whole(project: Path) -> None:
    landed = json.loads(contextful(project, "--json", "pipeline", "run").stdout)[0]
    root_run = landed["tables"][0]["run_ids"][0]
    detail = json.loads(contextful(project, "--json", "run", "show", root_run).stdout)
    assert detail["status"] == "committed" and detail["table"] == "events" and detail["origin"] == "pipeline events"
    assert [Path(i).name for i in detail["inputs"]] == ["a.ndjson", "b.ndjson"]
    tables = {t["table"]: t for t in detail["tables"]}
    assert set(tables) == {"events", "events__tags"}
    assert tables["events"]["rows"] == 2 and tables["events__tags"]["rows"] == 3
    assert all(t["bytes"] > 0 for t in tables.values())
    assert detail["masked_cells"] == {"note": 1}
    assert [(e["path"], e["source_type"], e["landed_type"]) for e in detail["downgrade_events"]] == [
        ("id", "double", "double")]

    text = contextful(project, "run", "show", root_run).stdout
    assert f"run          {root_run}" in text and "made by      pipeline events" in text
    assert "inputs (2)" in text and "a.ndjson" in text and "events__tags" in text
    assert "masked cells (1)" in text and "  note: 1" in text
    assert "downgrade events (1)" in text and "events.id" in text


def test_an_unknown_run_is_a_not_found_error_and_creates_nothing(project: Path) -> None:
    contextful(project, "pipeline", "run")
    before = _store_files(project)
    proc = contextful(project, "run", "show", "r-nope", check=False)
    assert proc.returncode == 6
    assert proc.stderr.strip() == ("error: RunNotFound: no run 'r-nope' in this store's run records "
                                   "(`contextful run history` lists them)")
    assert _store_files(project) == before
