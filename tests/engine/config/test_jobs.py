"""``[[job]]`` blocks are read and checked by ``pipeline validate`` (a real child process), every
problem at once: the closed kind union, undispatched kinds naming their command, a store-driven
job's required ``max_in_flight``, bound targets, build dependencies and dispatch identities."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import contextful_in

HEAD = """\
[project]
name = "jobs"
modules = ["shop.bodies"]

[[pipeline]]
id = "orders"
schedule = "every 10m"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]

[[model]]
name = "daily"
sql = "SELECT count(*) AS n FROM orders"
"""


BODIES = '''\
from contextful.engine.run.bodies import register_body


def enrich(item):
    return item


register_body("enrich", enrich)
'''


def _validate(tmp_path: Path, jobs: str) -> tuple[int, list[str]]:
    """``pipeline validate`` of the project with ``jobs``: its exit code and error lines. The project's
    module ``shop.bodies`` registers the body ``enrich``."""
    (tmp_path / "raw").mkdir(exist_ok=True)
    (tmp_path / "shop").mkdir(exist_ok=True)
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "bodies.py").write_text(BODIES)
    (tmp_path / "contextful.toml").write_text(HEAD + jobs)
    done = contextful_in(tmp_path, "pipeline", "validate", check=False)
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error: ")]


def test_valid_jobs_of_every_dispatched_kind_validate(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, """
[[job]]
name = "build_daily"
kind = "build"
after = "orders"
target = ["daily"]

[[job]]
name = "nightly_fold"
kind = "fold"
schedule = "0 3 * * *"
target = "orders"

[[job]]
name = "enrich"
kind = "store-driven"
body = "enrich"
statement = "SELECT * FROM orders"
tables = ["enriched"]
max_in_flight = 2
""")
    assert (code, errors) == (0, [])


@pytest.mark.clause("surface.fire.job-kind-unknown")
@pytest.mark.parametrize("block, named", [
    ('kind = "cron"', "kind 'cron' is none of build, fold, sync-push, store-driven, plan, synthesize"),
    ('kind = "fold"\ncommand = "rm -rf raw"', "declares 'command': a job never runs a host command"),
    ('kind = "build"\nargv = ["python", "x.py"]', "declares 'argv'"),
])
def test_a_kind_outside_the_union_or_a_host_command_is_job_kind_unknown(tmp_path: Path, block: str, named: str) -> None:
    code, errors = _validate(tmp_path, f'\n[[job]]\nname = "j"\n{block}\n')
    assert code == 3
    assert errors == [f"error: JobKindUnknown: [[job]] 'j': {named}" + errors[0].split(named, 1)[1]]


@pytest.mark.clause("surface.fire.kind-undispatched")
@pytest.mark.parametrize("kind, command", [("sweep", "contextful store collect"),
                                           ("rebuild-catalog", "contextful export run"),
                                           ("validate", "contextful pipeline validate")])
def test_an_undispatched_kind_names_the_command_doing_its_work(tmp_path: Path, kind: str, command: str) -> None:
    code, errors = _validate(tmp_path, f'\n[[job]]\nname = "j"\nkind = "{kind}"\n')
    assert code == 3
    assert errors == [(f"error: JobKindUndispatched: [[job]] 'j': kind {kind!r} is never dispatched as a job; "
                      f"`{command}` does that work")]


@pytest.mark.clause("surface.fire.store-driven-concurrency")
@pytest.mark.parametrize("bound", ["", "max_in_flight = 0", "max_in_flight = -1", 'max_in_flight = "2"',
                                   "max_in_flight = true"])
def test_a_store_driven_job_without_a_positive_max_in_flight_is_refused(tmp_path: Path, bound: str) -> None:
    code, errors = _validate(tmp_path, f'\n[[job]]\nname = "e"\nkind = "store-driven"\nbody = "b"\n{bound}\n')
    assert code == 3
    assert len(errors) == 1 and errors[0].startswith("error: JobConcurrencyUnset: [[job]] 'e': a store-driven job "
                                                     "needs max_in_flight, a positive integer")
    assert "no default applies" in errors[0]


@pytest.mark.clause("surface.fire.target-unbound")
def test_targets_naming_no_model_or_no_produced_table_are_unbound(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, """
[[job]]
name = "f"
kind = "fold"
target = ["orders", "nope"]

[[job]]
name = "b"
kind = "build"
target = ["daily", "orders"]
""")
    assert code == 3
    assert errors == [("error: JobTargetUnbound: [[job]] 'f': target 'nope' is unbound: no pipeline, model or "
                      "external produces it"),
                      "error: JobTargetUnbound: [[job]] 'b': target 'orders' is unbound: no [[model]] of that name"]


@pytest.mark.clause("surface.fire.build-dependency-invalid")
def test_a_dependency_naming_no_pipeline_beside_a_schedule_or_on_another_kind_is_refused(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, """
[[job]]
name = "b1"
kind = "build"
after = "nothing"
target = "daily"

[[job]]
name = "b2"
kind = "build"
after = "orders"
schedule = "every 1h"
target = "daily"

[[job]]
name = "f"
kind = "fold"
after = "orders"
target = "orders"
""")
    assert code == 3
    assert errors == [
        "error: ManifestValueInvalid: [[job]] 'b1'.after: names no pipeline: 'nothing'",
        ("error: ManifestValueInvalid: [[job]] 'b2'.after: a job depending on a pipeline inherits its schedule: "
        "declare `after` or `schedule`, not both"),
        "error: ManifestValueInvalid: [[job]] 'f'.after: only a build job depends on a pipeline, not a fold job",
    ]


@pytest.mark.clause("surface.fire.job-identity")
def test_a_pipeline_sharing_a_jobs_dispatch_identity_fails_validation(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, '\n[[job]]\nname = "orders"\nkind = "fold"\ntarget = "orders"\n')
    assert code == 3
    assert errors == [("error: ManifestValueInvalid: [[job]] 'orders'.name: pipeline 'orders' shares its dispatch "
                      "identity: one exclusion key cannot dispatch two operations")]


@pytest.mark.clause("surface.fire.store-driven-body")
def test_a_store_driven_body_must_be_registered_by_the_projects_modules(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, """
[[job]]
name = "ok"
kind = "store-driven"
body = "enrich"
statement = "SELECT * FROM orders"
max_in_flight = 2

[[job]]
name = "lost"
kind = "store-driven"
body = "score"
statement = "SELECT * FROM orders"
max_in_flight = 2

[[job]]
name = "remote"
kind = "store-driven"
body = { delegate = "scorer" }
statement = "SELECT * FROM orders"
max_in_flight = 1
""")
    assert code == 3
    assert errors == [
        ("error: JobBodyUnregistered: [[job]] 'lost': body 'score' is neither a body this executable registers nor a "
        "bound delegate (registered: enrich; [project] modules imported: shop.bodies; contextful.tasks entry "
        "points: none)"),
        ("error: JobDelegateUnbound: job 'remote': its body names delegate 'scorer', which no [control.delegates] "
         "binding declares; nothing fires"),
    ]


def test_job_validate_and_job_list_name_each_job(tmp_path: Path) -> None:
    """``job validate`` reports every problem on its own line as ``pipeline validate`` does, and
    names the jobs when there is none; ``job list`` says how each fires."""
    code, _ = _validate(tmp_path, '\n[[job]]\nname = "gc"\nkind = "sweep"\n\n[[job]]\nname = "x"\nkind = "cron"\n')
    refused = contextful_in(tmp_path, "job", "validate", check=False)
    assert (code, refused.returncode) == (3, 3)
    assert [line.split(":")[1].strip() for line in refused.stderr.splitlines()] == ["JobKindUndispatched",
                                                                                   "JobKindUnknown"]
    (tmp_path / "contextful.toml").write_text(HEAD + """
[[job]]
name = "build_daily"
kind = "build"
after = "orders"
target = "daily"

[[job]]
name = "nightly_fold"
kind = "fold"
schedule = "0 3 * * *"
target = "orders"
""")
    assert contextful_in(tmp_path, "job", "validate").stdout.strip() == "2 job(s) valid: build_daily, nightly_fold"
    listed = json.loads(contextful_in(tmp_path, "--json", "job", "list").stdout)
    assert [(j["name"], j["identity"], j["schedule"], j["after"], j["target"]) for j in listed] == [
        ("build_daily", "job:build_daily", None, "orders", ["daily"]),
        ("nightly_fold", "job:nightly_fold", "0 3 * * *", None, ["orders"])]


@pytest.mark.clause("surface.fire.kind-undispatched", "surface.fire.job-identity",
                    "surface.fire.build-dependency-invalid")
def test_import_and_apply_claim_no_version_over_a_refused_job(tmp_path: Path) -> None:
    """The checks run before a version is claimed: ``pipeline import`` claims nothing over an
    undispatched kind, and ``pipeline apply`` claims nothing over a job sharing a pipeline's identity
    or a dependency beside a schedule."""
    code, _ = _validate(tmp_path, '\n[[job]]\nname = "gc"\nkind = "rebuild-catalog"\n')
    assert code == 3
    refused = contextful_in(tmp_path, "pipeline", "import", check=False)
    assert refused.returncode == 3 and "JobKindUndispatched" in refused.stderr, refused.stderr
    assert not list((tmp_path / ".contextful").glob("**/manifest@v*.toml"))
    (tmp_path / "contextful.toml").write_text(HEAD)
    contextful_in(tmp_path, "pipeline", "import")
    for jobs, named in (('\n[[job]]\nname = "orders"\nkind = "fold"\ntarget = "orders"\n', "dispatch identity"),
                        (('\n[[job]]\nname = "b"\nkind = "build"\nafter = "orders"\nschedule = "every 1h"\n'
                         'target = "daily"\n'), "`after` or `schedule`, not both")):
        (tmp_path / "contextful.toml").write_text(HEAD + jobs)
        refused = contextful_in(tmp_path, "pipeline", "apply", check=False)
        assert refused.returncode == 3 and named in refused.stderr, refused.stderr
    versions = json.loads(contextful_in(tmp_path, "--json", "pipeline", "versions").stdout)
    assert [v["version"] for v in versions] == [1]


@pytest.mark.parametrize("command", [("pipeline", "validate"), ("job", "validate")])
def test_a_jobs_unreadable_schedule_is_a_problem_of_that_job(tmp_path: Path, command: tuple[str, str]) -> None:
    code, errors = _validate(tmp_path, '\n[[job]]\nname = "f"\nkind = "fold"\nschedule = "every blue moon"\n'
                                       'target = "orders"\n')
    assert code == 3
    assert len(errors) == 1 and errors[0].startswith("error: ScheduleUnreadable: ") and "job:f" in errors[0]
    done = contextful_in(tmp_path, *command, check=False)
    assert done.returncode == 3 and [line for line in done.stderr.splitlines() if line.startswith("error: ")] == errors
