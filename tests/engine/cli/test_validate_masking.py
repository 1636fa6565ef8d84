"""``pipeline validate --json`` reports each problem's detail through the secret guard, as the text
report does: a credential typed into a wrong place never reaches a terminal or a CI log whole."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import contextful

SECRET = "AKIA" + "Q" * 16
"""An AWS access key id the secret guard masks as ``[masked:aws-access-key-id]``."""


def test_a_problem_naming_a_secret_is_masked_in_text_and_json(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(f"""\
[project]
name = "shop"

[[pipeline]]
id = "events"
schedule = "{SECRET}"
source = {{ kind = "files", config = {{ paths = ["raw/*.ndjson"] }} }}
""")
    text = contextful(tmp_path, "pipeline", "validate", check=False)
    assert text.returncode == 3 and "ScheduleUnreadable" in text.stderr
    assert SECRET not in text.stderr and "[masked:aws-access-key-id]" in text.stderr
    done = contextful(tmp_path, "--json", "pipeline", "validate", check=False)
    assert done.returncode == 3
    problems = json.loads(done.stdout)["problems"]
    assert [p["error"] for p in problems] == ["ScheduleUnreadable"]
    assert SECRET not in done.stdout and "[masked:aws-access-key-id]" in problems[0]["detail"]
