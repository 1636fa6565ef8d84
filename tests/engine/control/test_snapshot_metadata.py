"""What an applied version keeps beside its pipelines: jobs and models (``surface.fire.job-snapshot``,
``surface.fire.model-snapshot``), through ``contextful pipeline import | apply [--pipelines-only]``
(real child processes) and read back with ``load_applied``, the function serve and ``job fire`` read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from contextful.engine.control.apply import MARKER, load_applied

from tests.support.cli import contextful

BASE = """\
[project]
name = "shop"

[[pipeline]]
id = "events"
source = { kind = "files", config = { paths = ["raw/*.ndjson"] } }
schedule = "every 10m"

[[model]]
name = "daily"
sql_file = "models/daily.sql"
"""

BUILD_JOB = """
[[job]]
name = "build_daily"
kind = "build"
after = "events"
target = ["daily"]
"""

FOLD_JOB = """
[[job]]
name = "nightly_fold"
kind = "fold"
schedule = "0 3 * * *"
target = ["events"]
"""

FIRST_SQL = "SELECT count(*) AS n FROM events\n"
SECOND_SQL = "SELECT count(*) AS n, 2 AS edition FROM events\n"


def make_project(path: Path, text: str) -> Path:
    (path / "models").mkdir(parents=True)
    (path / "models" / "daily.sql").write_text(FIRST_SQL)
    (path / "contextful.toml").write_text(text)
    return path


def version_text(project: Path, version: int) -> str:
    return (project / ".contextful" / "control" / "shop" / f"manifest@v{version}.toml").read_text()


def apply(project: Path, *args: str) -> dict[str, object]:
    out: dict[str, object] = json.loads(contextful(project, "--json", "pipeline", "apply", *args).stdout)
    return out


@pytest.mark.clause("surface.fire.model-snapshot")
def test_a_version_runs_the_model_sql_it_was_applied_with_whatever_the_file_holds_now(tmp_path: Path) -> None:
    project = make_project(tmp_path / "shop", BASE)
    contextful(project, "pipeline", "import")
    assert FIRST_SQL.strip() in version_text(project, 1).split(MARKER)[1]  # inlined in the file itself
    (project / "models" / "daily.sql").write_text(SECOND_SQL)  # a draft: edited, not applied
    applied = load_applied(project)
    assert applied is not None
    daily = applied.manifest.model("daily")
    assert (daily.sql, daily.sql_file) == (FIRST_SQL, "models/daily.sql")  # the file's name kept for errors
    (project / "models" / "daily.sql").unlink()  # a version never reads the project's file again
    applied = load_applied(project)
    assert applied is not None and applied.manifest.model("daily").sql == FIRST_SQL


@pytest.mark.clause("surface.fire.model-snapshot")
def test_a_full_apply_claims_an_edited_model_file_and_a_pipelines_only_apply_keeps_the_applied_sql(
        tmp_path: Path) -> None:
    project = make_project(tmp_path / "shop", BASE)
    contextful(project, "pipeline", "import")
    assert apply(project)["claimed"] is False  # nothing changed: nothing claimed
    (project / "models" / "daily.sql").write_text(SECOND_SQL)
    # pipelines-only: the applied models stay, so a model file edited alone is no change at all
    assert apply(project, "--pipelines-only")["claimed"] is False
    (project / "contextful.toml").write_text(BASE.replace("every 10m", "every 5m"))
    out = apply(project, "--pipelines-only")
    assert (out["claimed"], out["version"]) == (True, 2)
    applied = load_applied(project)
    assert applied is not None and applied.manifest.model("daily").sql == FIRST_SQL
    assert applied.manifest.pipeline("events").schedule == "every 5m"
    # a pipelines-only apply validates with the applied SQL, not the project's (broken) file
    (project / "models" / "daily.sql").write_text("SELEC nonsense")
    (project / "contextful.toml").write_text(BASE.replace("every 10m", "every 1m"))
    assert apply(project, "--pipelines-only")["version"] == 3
    proc = contextful(project, "pipeline", "apply", check=False)  # a full apply reads the file: refused
    assert proc.returncode == 3 and "ApplyValidationRefused" in proc.stderr and "daily" in proc.stderr
    (project / "models" / "daily.sql").write_text(SECOND_SQL)
    out = apply(project)  # the file edited alone is a change a full apply claims
    assert (out["claimed"], out["version"]) == (True, 4)
    applied = load_applied(project)
    assert applied is not None and applied.manifest.model("daily").sql == SECOND_SQL


@pytest.mark.clause("surface.fire.job-snapshot")
def test_import_and_apply_keep_jobs_and_a_pipelines_only_apply_preserves_the_applied_ones(tmp_path: Path) -> None:
    project = make_project(tmp_path / "shop", BASE + BUILD_JOB)
    contextful(project, "pipeline", "import")
    applied = load_applied(project)
    assert applied is not None and [j.name for j in applied.manifest.jobs] == ["build_daily"]
    (project / "contextful.toml").write_text(BASE + BUILD_JOB + FOLD_JOB)
    assert apply(project)["version"] == 2
    applied = load_applied(project)
    assert applied is not None and [j.name for j in applied.manifest.jobs] == ["build_daily", "nightly_fold"]
    # a pipelines-only apply takes the working pipelines and keeps the applied jobs, whatever the draft says
    (project / "contextful.toml").write_text(BASE.replace("every 10m", "every 5m"))
    assert apply(project, "--pipelines-only")["version"] == 3
    applied = load_applied(project)
    assert applied is not None
    assert [j.name for j in applied.manifest.jobs] == ["build_daily", "nightly_fold"]
    assert applied.manifest.pipeline("events").schedule == "every 5m"


@pytest.mark.clause("surface.fire.job-snapshot")
def test_a_pipelines_only_apply_that_would_strand_an_applied_job_is_refused_and_claims_nothing(
        tmp_path: Path) -> None:
    project = make_project(tmp_path / "shop", BASE + BUILD_JOB)
    contextful(project, "pipeline", "import")
    renamed = BASE.replace('id = "events"', 'id = "clicks"').replace("FROM events", "FROM clicks")
    (project / "contextful.toml").write_text(renamed + BUILD_JOB.replace('"events"', '"clicks"'))
    proc = contextful(project, "pipeline", "apply", "--pipelines-only", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "ApplyValidationRefused" in proc.stderr and "build_daily" in proc.stderr and "events" in proc.stderr
    assert not (project / ".contextful" / "control" / "shop" / "manifest@v2.toml").exists()
    applied = load_applied(project)
    assert applied is not None and applied.version == 1 and applied.manifest.jobs[0].after == "events"
