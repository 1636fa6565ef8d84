"""The manifest: parsed once, every problem reported at once, each by its catalogue error."""

from __future__ import annotations

from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.storage.errors import (
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    PipelineAfterCycle,
    PipelineAfterUnknown,
    PipelineIdDuplicate,
    PipelineNormalizeModeUnknown,
    PipelinePrimaryKeyInvalid,
    PipelineSourceKindUnknown,
    TableNameCollision,
    TypeSpellingUnreadable,
)

GOOD = """
[project]
name = "demo"
store = "data/store"

[[pipeline]]
id = "events"
table = "gh_events"
primary_key = ["id"]
types = { id = "bigint", created_at = "timestamp[us, UTC]" }
schedule = "every 1h"
priority = 5
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson.gz"]

[[pipeline]]
id = "users"
after = ["events"]
schedule = "0 * * * *"
[pipeline.source]
kind = "files"
config = { paths = "users.csv", format = "csv" }
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "contextful.toml").write_text(text)
    return tmp_path


def test_a_good_manifest_parses_into_specs(tmp_path: Path) -> None:
    manifest = load_manifest(write(tmp_path, GOOD))
    assert manifest.project.name == "demo"
    assert manifest.project.store == str((tmp_path / "data" / "store").resolve())
    events = manifest.pipeline("events")
    assert (events.table, events.primary_key, events.priority, events.normalize) == ("gh_events", ("id",), 5, "nested")
    assert events.source.config == {"paths": ["raw/*.ndjson.gz"]}
    users = manifest.pipeline("users")
    assert users.table == "users" and users.after == ("events",)
    assert [p.id for p in manifest.in_dependency_order()] == ["events", "users"]
    assert [p.id for p in manifest.in_dependency_order(["users"])] == ["users"]


def test_manifest_found_from_a_subdirectory(tmp_path: Path) -> None:
    write(tmp_path, GOOD)
    (tmp_path / "raw").mkdir()
    assert load_manifest(tmp_path / "raw").root == tmp_path.resolve()


def test_every_problem_is_reported_at_once_each_by_its_error(tmp_path: Path) -> None:
    bad = """
[project]
name = "demo"
colour = "blue"

[[pipeline]]
id = "a"
normalize = "flat"
batch_size = 5
types = { n = "bigint", when = "timestamp[fortnights]" }
after = ["ghost"]
[pipeline.source]
kind = "ftp"

[[pipeline]]
id = "a"
priority = "high"
schedule = "sometimes"
[pipeline.source]
kind = "files"
config = { pattern = "*.csv" }

[[pipeline]]
id = "b"
after = ["c"]
source = { kind = "files", config = { paths = "x" } }

[[pipeline]]
id = "c"
after = ["b"]
source = { kind = "files", config = { paths = "x" } }
"""
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(write(tmp_path, bad))
    problems = info.value.problems
    kinds = [type(p) for p in problems]
    unknown_keys = {(p.block, p.key) for p in problems if isinstance(p, ManifestKeyUnknown)}
    assert unknown_keys == {("[project]", "colour"), ("[[pipeline]] 'a'", "batch_size"),
                            ("[[pipeline]] 'a' source.config", "pattern")}
    mode = next(p for p in problems if isinstance(p, PipelineNormalizeModeUnknown))
    assert "'flat'" in str(mode) and "'nested'" in str(mode) and "'relational'" in str(mode)
    assert next(p for p in problems if isinstance(p, PipelineSourceKindUnknown)).kind == "ftp"
    assert next(p for p in problems if isinstance(p, TypeSpellingUnreadable)).column == "when"
    assert next(p for p in problems if isinstance(p, PipelineAfterUnknown)).after == "ghost"
    assert PipelineIdDuplicate in kinds
    assert set(next(p for p in problems if isinstance(p, PipelineAfterCycle)).cycle) == {"b", "c"}
    invalid = {(p.key) for p in problems if isinstance(p, ManifestValueInvalid)}
    assert {"priority", "paths"} <= invalid
    # a schedule the grammar cannot read is a problem of its pipeline alone, never of the document:
    # validate reports it (ScheduleUnreadable) and serve arms every other entry
    assert "schedule" not in invalid
    assert info.value.category == "spec-invalid"


def test_unknown_top_level_block_and_missing_source(tmp_path: Path) -> None:
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(write(tmp_path, '[[pipelines]]\nid = "x"\n\n[[pipeline]]\nid = "y"\n'))
    rendered = [str(p) for p in info.value.problems]
    assert any("ManifestKeyUnknown" in r and "'pipelines'" in r for r in rendered)
    assert any("source" in r and "required" in r for r in rendered)


@pytest.mark.clause("run.normalize.mode-unknown")
def test_a_normalize_mode_outside_the_two_is_refused_printing_both_spellings(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    (tmp_path / "contextful.toml").write_text(
        '[[pipeline]]\nid = "a"\nnormalize = "flattened"\nsource = { kind = "files", config = { paths = "x" } }\n')
    for verb in ("validate", "run"):
        out = contextful(tmp_path, "pipeline", verb, check=False)
        assert out.returncode == 3 and "PipelineNormalizeModeUnknown" in out.stderr
        assert "'nested'" in out.stderr and "'relational'" in out.stderr and "'flattened'" in out.stderr


KEYS = """
[[pipeline]]
id = "ev"
normalize = "relational"
primary_key = ["id", "id", "_cf_id", "tags", "actor"]
types = { tags = "list<string>", actor = "struct<login: string>", id = "bigint" }
[pipeline.source]
kind = "files"
config = { paths = "raw/*.ndjson" }

[[pipeline]]
id = "labels"
table = "ev__tags"
[pipeline.source]
kind = "files"
config = { paths = "labels/*.ndjson" }

[[model]]
name = "EV__Daily"
sql = "SELECT 1 AS x"

[[model]]
name = "Ev"
sql = "SELECT 1 AS x"
"""


def test_primary_keys_the_table_can_never_have_and_child_table_collisions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestInvalid) as caught:
        load_manifest(write(tmp_path, KEYS))
    keys = [(p.column, p.reason.split(": under")[0]) for p in caught.value.problems
            if isinstance(p, PipelinePrimaryKeyInvalid)]
    assert keys == [("id", "is named twice"), ("_cf_id", "starts with '_cf_'"),
                    ("tags", "is declared 'list<string>'"), ("actor", "is declared 'struct<login: string>'")]
    collisions = [(p.table, p.first, p.second) for p in caught.value.problems if isinstance(p, TableNameCollision)]
    assert collisions == [("ev__tags", "pipeline 'ev'", "pipeline 'labels'"),
                          ("EV__Daily", "pipeline 'ev'", "model 'EV__Daily'"),
                          ("Ev", "table 'ev' of pipeline 'ev'", "model 'Ev'")]
    assert len(caught.value.problems) == 7


def test_a_nested_pipeline_may_key_on_a_struct_and_name_tables_freely(tmp_path: Path) -> None:
    text = KEYS.replace('normalize = "relational"', 'normalize = "nested"').replace(', "id", "_cf_id", "tags"', "")
    text = text.replace('name = "Ev"', 'name = "daily"')
    manifest = load_manifest(write(tmp_path, text))
    assert manifest.pipeline("ev").primary_key == ("id", "actor")
