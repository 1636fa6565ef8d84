"""``contextful store compaction`` as a user runs it (real child processes): it shows the automatic
compaction policy in force per table and where each field comes from, sets the store's or a table's
own fields (naming only those given), removes a setting with --reset, and a table turned off keeps
every part its commits add while the others fold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import contextful


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text('[project]\nname = "compaction"\n')
    for name in ("quiet", "busy"):
        (root / f"{name}.csv").write_text("id\n1\n")
        contextful(root, "table", "load", name, str(root / f"{name}.csv"))
    return root


def shown(project: Path) -> dict[str, object]:
    return json.loads(contextful(project, "--json", "store", "compaction").stdout)


def test_the_policy_in_force_and_where_each_field_comes_from(project: Path) -> None:
    before = shown(project)
    assert before["store"] == {}
    assert {t["table"]: (t["enabled"], t["fanout"], t["small_bytes"]) for t in before["tables"]} == {
        "quiet": (True, 8, 2**20), "busy": (True, 8, 2**20)}

    contextful(project, "store", "compaction", "--fanout", "3", "--small-mib", "4")
    contextful(project, "store", "compaction", "quiet", "--off")
    contextful(project, "store", "compaction", "quiet", "--fanout", "5")  # names fanout, keeps --off
    after = shown(project)
    assert after["store"] == {"fanout": 3, "small_bytes": 4 * 2**20}
    rows = {t["table"]: t for t in after["tables"]}
    assert (rows["quiet"]["enabled"], rows["quiet"]["fanout"], rows["quiet"]["small_bytes"]) == (False, 5, 4 * 2**20)
    assert rows["quiet"]["from"] == {"enabled": "table", "fanout": "table", "small_bytes": "store"}
    assert (rows["busy"]["enabled"], rows["busy"]["fanout"]) == (True, 3)
    assert rows["busy"]["from"] == {"enabled": "default", "fanout": "store", "small_bytes": "store"}
    text = contextful(project, "store", "compaction", "quiet").stdout
    assert "store setting: fanout = 3, small_bytes = 4194304" in text
    assert "quiet" in text and "off" in text and "enabled: table, fanout: table" in text

    contextful(project, "store", "compaction", "quiet", "--reset")
    contextful(project, "store", "compaction", "--reset")
    assert shown(project) == before  # settings commit nothing: the parts are as they were


def test_a_table_turned_off_keeps_its_parts_while_the_others_fold(project: Path) -> None:
    contextful(project, "store", "compaction", "--fanout", "2")
    contextful(project, "store", "compaction", "quiet", "--off")
    for n in range(2, 6):
        for name in ("quiet", "busy"):
            (project / f"{name}.csv").write_text(f"id\n{n}\n")
            contextful(project, "table", "load", name, str(project / f"{name}.csv"))
    parts = {t["table"]: t["live_parts"] for t in shown(project)["tables"]}
    assert parts["quiet"] == 5  # one per commit
    assert parts["busy"] < 5
    rows = json.loads(contextful(project, "--json", "sql", "SELECT count(*) AS n FROM busy").stdout)
    assert rows == [{"n": 5}]  # folding changed no answer


@pytest.mark.parametrize(("args", "error"), [
    (["--fanout", "1"], "ArgumentInvalid: --fanout 1"),
    (["--small-mib", "0"], "ArgumentInvalid: --small-mib 0"),
    (["--reset", "--off"], "ArgumentInvalid: --reset"),
    (["nope", "--off"], "TableNotFound"),
])
def test_impossible_settings_are_refused_in_one_line_and_change_nothing(project: Path, args: list[str],
                                                                        error: str) -> None:
    before = shown(project)
    proc = contextful(project, "store", "compaction", *args, check=False)
    assert proc.returncode in (3, 6), proc.stderr
    assert proc.stderr.startswith(f"error: {error}") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert shown(project) == before


def test_outside_a_project_it_creates_no_store(tmp_path: Path) -> None:
    proc = contextful(tmp_path, "store", "compaction", check=False)
    assert proc.returncode != 0 and "ProjectNotFound" in proc.stderr
    assert list(tmp_path.iterdir()) == []
