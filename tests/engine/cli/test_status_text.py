"""``build status`` and ``export status`` text say what their ``--json`` says: stale, watermark,
changed and why; the export's credential, snapshot, source read, rows and files."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "status"

[[pipeline]]
id = "events"

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["raw/*.csv"]

[[model]]
name = "by_kind"
sql = "SELECT kind, count(*) AS n FROM events GROUP BY kind"

[[export]]
name = "kinds"
source = "by_kind"
namespace = "bi"
credential = "analysts"
"""


def test_build_and_export_status_text_match_their_json(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.csv").write_text("id,kind\n1,click\n2,view\n3,click\n")

    before = contextful(tmp_path, "export", "status").stdout.splitlines()
    assert before == ["kinds: bi.kinds (credential analysts)", "  snapshot: none yet (run `contextful export run`)"]
    unbuilt = contextful(tmp_path, "build", "status").stdout.splitlines()
    assert unbuilt[0] == "by_kind: no build published, current"
    listed = json.loads(contextful(tmp_path, "--json", "build", "list").stdout)
    assert [(r["model"], r["build_id"]) for r in listed] == [("by_kind", None)]
    assert not (tmp_path / ".contextful").exists()  # reading before anything landed creates no store

    for args in (("pipeline", "run"), ("build", "run"), ("export", "run")):
        contextful(tmp_path, *args)
    status = json.loads(contextful(tmp_path, "--json", "build", "status").stdout)[0]
    assert status["stale"] is False
    assert contextful(tmp_path, "build", "status").stdout.splitlines() == [
        f"by_kind: build {status['build_id']}, current", f"  watermark: events@{status['watermark']['events']}",
        "  stale inputs: none", "  changed: nothing"]

    exported = json.loads(contextful(tmp_path, "--json", "export", "status").stdout)[0]
    assert contextful(tmp_path, "export", "status").stdout.splitlines() == [
        "kinds: bi.kinds (credential analysts)", f"  snapshot: {exported['snapshot_id']}",
        f"  source read: model by_kind build {exported['source']['build_id']}",
        f"  rows: {exported['rows']}, files: {exported['files']}"]
    assert exported["rows"] == 2

    (tmp_path / "raw" / "b.csv").write_text("id,kind\n4,buy\n")
    contextful(tmp_path, "pipeline", "run")
    (tmp_path / "contextful.toml").write_text(MANIFEST.replace("count(*) AS n", "count(*) AS total"))
    stale = json.loads(contextful(tmp_path, "--json", "build", "status").stdout)[0]
    assert stale["stale"] and stale["stale_inputs"] == ["events"] and stale["changed"] == ["sql"]
    assert contextful(tmp_path, "build", "status").stdout.splitlines() == [
        f"by_kind: build {stale['build_id']}, stale", f"  watermark: events@{stale['watermark']['events']}",
        "  stale inputs: events", "  changed: sql", f"  why: {'; '.join(stale['why'])}"]
    assert "sql changed" in stale["why"] and any("input events" in w for w in stale["why"])
