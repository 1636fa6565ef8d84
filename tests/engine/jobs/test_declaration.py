"""The keys the store-driven and plan kinds read beside the declaration's: ``as_of`` (an instant),
``retry`` (a retry schedule's configuration), a store-driven ``statement`` and a plan job's
``plan``, each problem named at once with the rest of the manifest's."""

from __future__ import annotations

from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.storage.errors import ManifestInvalid

from tests.engine.jobs.project import write_project

BAD = """
[[job]]
name = "fold-at"
kind = "fold"
schedule = "every 1h"
target = "documents"
as_of = "2030-01-01T00:00:00Z"

[[job]]
name = "bad-keys"
kind = "store-driven"
body = "score"
statement = "SELECT * FROM documents"
max_in_flight = 1
as_of = "yesterday"
retry = { attempts = 0, tries = 3 }

[[job]]
name = "no-statement"
kind = "store-driven"
body = "score"
max_in_flight = 1
tables = ["scores"]

[[job]]
name = "no-plan"
kind = "plan"
schedule = "every 1h"
"""


def test_as_of_and_retry_are_read_onto_the_job(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", extra='as_of = 2030-01-01T01:00:00+01:00')
    job = load_manifest(root).jobs[0]
    assert job.as_of == "2030-01-01T00:00:00+00:00"  # a TOML date-time, as a UTC instant
    assert dict(job.retry) == {"attempts": 2, "base_s": 0, "max_s": 0}


def test_every_problem_of_the_kind_keys_is_named_at_once(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p")
    (root / "contextful.toml").write_text((root / "contextful.toml").read_text() + BAD)
    with pytest.raises(ManifestInvalid) as raised:
        load_manifest(root)
    named = sorted((type(p).__name__, str(p.fields.get("key"))) for p in raised.value.problems)
    assert named == [("ManifestKeyUnknown", "tries"), ("ManifestValueInvalid", "as_of"),
                     ("ManifestValueInvalid", "as_of"), ("ManifestValueInvalid", "attempts"),
                     ("ManifestValueInvalid", "plan"), ("ManifestValueInvalid", "statement")]
    assert any("is a store-driven job's key only" in str(p) for p in raised.value.problems)
