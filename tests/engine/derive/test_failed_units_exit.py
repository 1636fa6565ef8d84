"""A derive run whose units fail exits as a run with a failed input does (``contextful pipeline run``
in a child process): non-zero with the first failure's code, the first few errors on their own
``error:`` lines and ``and N more``, while every failed unit stays a marker row holding its error
and every unit that derived lands."""

from __future__ import annotations

import json
from pathlib import Path

from contextful.storage.errors import EXIT_CODES

from tests.engine.derive.project import DeriveProject
from tests.support.cli import contextful


def test_a_run_whose_units_all_failed_exits_non_zero_naming_the_first_errors(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path)
    project.parents([{"id": f"u{n}", "path": project.media(f"u{n}.txt", "FAIL\n")} for n in range(6)])
    proc = contextful(tmp_path, "pipeline", "run", check=False)
    assert proc.returncode == EXIT_CODES["transient"], proc.stderr  # DeriveStepExit's code, as a failed input's
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3 and all(e.startswith("error: DeriveStepExit: unit u") for e in errors), proc.stderr
    assert "  and 3 more failed unit(s): each marker row holds its error (last_error)" in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
    markers = project.rows("SELECT unit_ref, unit_status, last_error FROM passages WHERE kind = 'marker' ORDER BY 1")
    assert [(u, s) for u, s, _ in markers] == [(f"u{n}", "failed") for n in range(6)]
    assert all(e.startswith("DeriveStepExit") for _, _, e in markers)
    shown = {e.split(": ", 2)[2].split(":")[0] for e in errors}  # "unit 'uN'" as each line names its unit
    assert len(shown) == 3
    as_json = json.loads(contextful(tmp_path, "--json", "pipeline", "run", check=False).stdout)[-1]
    assert as_json["ok"] is False and as_json["derive"]["failed"] == 6  # the markers retry (max_attempts)
    assert len(as_json["failures"]) == 3 and as_json["failures_not_shown"] == 3


def test_some_units_failing_land_the_others_and_still_exit_non_zero(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path)
    project.parents([{"id": "good", "path": project.media("good.txt", "one\ntwo\n")},
                     {"id": "bad", "path": project.media("bad.txt", "FAIL\n")}])
    proc = contextful(tmp_path, "pipeline", "run", check=False)
    assert proc.returncode == EXIT_CODES["transient"], proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: DeriveStepExit: unit bad: derive step engine exited 3"), proc.stderr
    assert "more failed unit(s)" not in proc.stderr
    assert "passages -> passages:" in proc.stdout  # what landed is reported
    assert project.rows("SELECT unit_ref, text FROM passages WHERE kind = 'passage' ORDER BY text") == [
        ("good", "one"), ("good", "two")]
    assert project.rows("SELECT unit_ref, unit_status FROM passages WHERE kind = 'marker'") == [("bad", "failed")]
