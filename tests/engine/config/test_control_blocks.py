"""The manifest's ``[control]`` block and its ``[[external]]`` blocks: parsed into ``ControlSpec``
and ``ExternalSpec``, every problem reported at once, each by its catalogue error."""

from __future__ import annotations

from pathlib import Path

import pytest
from contextful.engine.config import ControlSpec, ExternalSpec, load_manifest
from contextful.storage.errors import (
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    TableNameCollision,
)

PIPELINE = """
[[pipeline]]
id = "events"
normalize = "relational"
source = { kind = "files", config = { paths = ["raw/*.ndjson"] } }

[[model]]
name = "daily"
sql = "SELECT 1 AS one"
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "contextful.toml").write_text(text)
    return tmp_path


def test_control_defaults_to_the_projects_own_snapshot_directory(tmp_path: Path) -> None:
    manifest = load_manifest(write(tmp_path, '[project]\nname = "shop"\n' + PIPELINE))
    assert manifest.control == ControlSpec(str(tmp_path / ".contextful" / "control" / "shop"), 4, "in-process")
    assert manifest.externals == ()


def test_control_keys_are_read_and_snapshot_dir_resolved_against_the_project(tmp_path: Path) -> None:
    text = '[project]\nname = "shop"\n\n[control]\nsnapshot_dir = "../ops/v"\npool = 2\ntrigger = "anything"\n'
    (tmp_path / "inner").mkdir()
    manifest = load_manifest(write(tmp_path / "inner", text + PIPELINE))
    # trigger is not checked here: serve refuses an unknown adapter when it starts (surface.arm.unknown-trigger)
    assert manifest.control == ControlSpec(str((tmp_path / "ops" / "v").resolve()), 2, "anything", source="../ops/v")


def test_control_problems_are_reported_with_the_rest(tmp_path: Path) -> None:
    text = ('[project]\nname = "shop"\n\n[control]\npool = 0\ntrigger = 5\nsnapshot_dir = ""\nrefresh = "every 30s"\n'
            'poll = "every 0s"\n')
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(write(tmp_path, text + PIPELINE.replace('"relational"', '"flat"')))
    problems = info.value.problems
    assert {(p.block, p.key) for p in problems if isinstance(p, ManifestKeyUnknown)} == {("[control]", "refresh")}
    assert {(p.block, p.key) for p in problems if isinstance(p, ManifestValueInvalid)} == {
        ("[control]", "pool"), ("[control]", "trigger"), ("[control]", "snapshot_dir"), ("[control]", "poll")}
    assert any(p.name == "PipelineNormalizeModeUnknown" for p in problems)


@pytest.mark.clause("surface.reconcile.poll-cadence")
def test_poll_takes_a_schedule_string_and_defaults_to_every_30_s(tmp_path: Path) -> None:
    head = '[project]\nname = "shop"\n\n[control]\nurl = "http://127.0.0.1:8787/control"\n'
    assert load_manifest(write(tmp_path, head + PIPELINE)).control.poll == "every 30s"
    for poll in ("every 5s", "every 2m", "*/5 * * * *", "0 3 * * 1-5"):
        assert load_manifest(write(tmp_path, head + f'poll = "{poll}"\n' + PIPELINE)).control.poll == poll
    for poll, problem in (('"@hourly"', "'@hourly' is not a schedule"), ('"every 0s"', "'every 0s' is not a schedule"),
                          ("30", "must be a schedule string, not 30")):
        with pytest.raises(ManifestInvalid) as info:
            load_manifest(write(tmp_path, head + f"poll = {poll}\n" + PIPELINE))
        [found] = info.value.problems
        assert isinstance(found, ManifestValueInvalid) and (found.block, found.key) == ("[control]", "poll")
        assert problem in found.problem


def test_a_project_name_that_is_no_directory_name_needs_a_snapshot_dir(tmp_path: Path) -> None:
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(write(tmp_path, '[project]\nname = "../elsewhere"\n' + PIPELINE))
    [problem] = info.value.problems
    assert isinstance(problem, ManifestValueInvalid) and (problem.block, problem.key) == ("[project]", "name")
    named = load_manifest(write(tmp_path, '[project]\nname = "../elsewhere"\n[control]\nsnapshot_dir = "v"\n' + PIPELINE))
    assert named.control.snapshot_dir == str(tmp_path / "v")


@pytest.mark.clause("surface.apply.external-snapshot")
def test_externals_parse_with_their_table_defaulting_to_the_id(tmp_path: Path) -> None:
    text = PIPELINE + '\n[[external]]\nid = "crm"\ndescription = "CRM sync"\n\n[[external]]\nid = "ledger"\ntable = "gl"\n'
    manifest = load_manifest(write(tmp_path, text))
    assert manifest.externals == (ExternalSpec("crm", "crm", "CRM sync"), ExternalSpec("ledger", "gl", None))


def test_external_problems_each_by_their_error(tmp_path: Path) -> None:
    text = PIPELINE + """
[[external]]
id = "crm"
[[external]]
id = "crm"
table = "crm2"
[[external]]
id = "9lives"
[[external]]
id = "feed"
table = "events"
[[external]]
id = "build"
table = "daily"
[[external]]
id = "child"
table = "events__items"
[[external]]
id = "shouting"
table = "CRM"
[[external]]
id = "events"
table = "other"
owner = "ops"
[[external]]
id = "spaced"
table = "a b"
"""
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(write(tmp_path, text))
    problems = info.value.problems
    values = {(p.block, p.key) for p in problems if isinstance(p, ManifestValueInvalid)}
    assert values == {("[[external]] 'crm'", "id"), ("[[external]] '9lives'", "id"),
                      ("[[external]] '9lives'", "table"),  # its table defaults to the id, as a pipeline's does
                      ("[[external]] 'events'", "id"), ("[[external]] 'spaced'", "table")}
    assert {(p.block, p.key) for p in problems if isinstance(p, ManifestKeyUnknown)} == {("[[external]] 'events'", "owner")}
    collisions = {(p.table, p.first, p.second) for p in problems if isinstance(p, TableNameCollision)}
    assert ("events", "pipeline 'events'", "external 'feed'") in collisions
    assert ("daily", "model 'daily'", "external 'build'") in collisions
    assert ("events__items", "pipeline 'events'", "external 'child'") in collisions  # a relational child table
    assert ("CRM", "table 'crm' of external 'crm'", "external 'shouting'") in collisions  # differing in case
    assert len(collisions) == 4


def test_externals_must_be_blocks(tmp_path: Path) -> None:
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(write(tmp_path, 'external = "crm"\ncontrol = 3\n' + PIPELINE))
    assert {(p.block, p.key) for p in info.value.problems} == {("the manifest", "external"), ("the manifest", "control")}
