"""The ``contextful`` command as a user runs it: a real child process per command."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.support.cli import contextful


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "cli"\n')
    (tmp_path / "events.csv").write_text("id,kind\n1,click\n2,view\n3,click\n")
    with gzip.open(tmp_path / "more.ndjson.gz", "wt") as fh:
        fh.write('{"id": 4, "kind": "view", "meta": {"ua": "x"}}\n{"id": 5.5, "kind": "buy"}\n')
    return tmp_path


def test_load_then_query_list_show_and_history(project: Path) -> None:
    out = contextful(project, "table", "load", "events", str(project / "events.csv")).stdout
    assert "3 rows" in out and "commit_seq 1" in out
    loaded = json.loads(contextful(project, "--json", "table", "load", "events", str(project / "more.ndjson.gz")).stdout)
    assert loaded["rows"] == 2 and loaded["commit_seq"] == 2
    assert loaded["downgrade_events"][0]["path"] == "id"
    assert (project / ".contextful" / "store" / "catalog.sqlite").exists()

    rows = json.loads(contextful(project, "--json", "sql", "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind").stdout)
    assert rows == [{"kind": "buy", "n": 1}, {"kind": "click", "n": 2}, {"kind": "view", "n": 2}]
    text = contextful(project, "sql", "SELECT id FROM events ORDER BY id").stdout
    assert "(5 rows)" in text and "5.5" in text

    listed = json.loads(contextful(project, "--json", "table", "list").stdout)
    assert [t["table"] for t in listed] == ["events"] and listed[0]["commit_seq"] == 2
    shown = json.loads(contextful(project, "--json", "table", "show", "events").stdout)
    assert shown["rows"] == 5 and [c["name"] for c in shown["schema"]] == ["id", "kind", "meta"]
    assert [c["commit_seq"] for c in shown["commits"]] == [1, 2]

    history = json.loads(contextful(project, "--json", "run", "history").stdout)
    assert [h["status"] for h in history] == ["committed", "committed"]
    assert history[1]["downgrade_events"][0]["landed_type"] == "double"
    assert "column widened" in contextful(project, "run", "history").stdout


def test_expected_errors_print_one_line_and_exit_by_category(project: Path) -> None:
    contextful(project, "table", "load", "events", str(project / "events.csv"))
    missing = contextful(project, "table", "show", "nope", check=False)
    assert missing.returncode == 6
    assert missing.stderr.strip() == "error: TableNotFound: no table 'nope' in this store"
    bad_sql = contextful(project, "sql", "SELEC 1", check=False)
    assert bad_sql.returncode == 3 and bad_sql.stderr.startswith("error: QueryInvalid: ")
    assert "Traceback" not in bad_sql.stderr
    (project / "bad.ndjson").write_text('{"id": "text now"}\n')
    clash = contextful(project, "table", "load", "events", str(project / "bad.ndjson"), check=False)
    assert clash.returncode == 4 and "SchemaIrreconcilable" in clash.stderr and "column id" in clash.stderr
    nofile = contextful(project, "table", "load", "events", str(project / "absent.csv"), check=False)
    assert nofile.returncode == 6 and "InputNotFound" in nofile.stderr
    assert json.loads(contextful(project, "--json", "table", "show", "events").stdout)["rows"] == 3


def test_replace_fold_and_collect(project: Path) -> None:
    for _ in range(3):
        contextful(project, "table", "load", "events", str(project / "events.csv"), "--primary-key", "id")
    shown = json.loads(contextful(project, "--json", "table", "show", "events").stdout)
    assert shown["rows"] == 3 and shown["parts"] == 3
    folded = json.loads(contextful(project, "--json", "table", "fold", "events").stdout)
    assert folded["parts_removed"] == 3
    assert json.loads(contextful(project, "--json", "table", "show", "events").stdout)["rows"] == 3
    contextful(project, "table", "load", "events", str(project / "events.csv"), "--replace")
    collected = json.loads(contextful(project, "--json", "store", "collect", "--retain-seconds", "0",
                                      "--grace-seconds", "0").stdout)
    assert collected["removed_parts"] == 4
    assert json.loads(contextful(project, "--json", "sql", "SELECT count(*) AS n FROM events").stdout) == [{"n": 3}]


def test_help_is_instant_and_lists_commands(project: Path) -> None:
    out = contextful(project, "--help").stdout
    for command in ("sql", "table", "run", "store"):
        assert command in out
