"""An ``http`` pipeline without ``incremental`` reads its whole source on every run: refused unless
a primary key keeps one row per key, and said so at validate and in the plan."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.pipeline import plan_pipeline, run_pipeline
from contextful.storage import Store
from contextful.storage.errors import ManifestInvalid, ManifestValueInvalid

from tests.support.cli import contextful
from tests.support.http_api import JsonApi, next_url_pages

MANIFEST = """
[project]
name = "rereads"

[[pipeline]]
id = "events"
{key}
[pipeline.source]
kind = "http"
[pipeline.source.config]
url = "{url}"
"""


def test_an_http_source_without_incremental_or_key_is_refused_at_validate(tmp_path: Path) -> None:
    text = MANIFEST.format(key="", url="http://127.0.0.1:9/items")
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest(tomllib.loads(text), tmp_path)
    [problem] = caught.value.problems
    assert isinstance(problem, ManifestValueInvalid) and problem.key == "incremental"
    assert "'events'" in problem.block and "primary_key" in problem.problem and "every run" in problem.problem
    (tmp_path / "contextful.toml").write_text(text)
    proc = contextful(tmp_path, "pipeline", "validate", check=False)
    assert proc.returncode == 3 and "ManifestValueInvalid" in proc.stderr and "incremental" in proc.stderr


def test_a_keyed_http_source_without_incremental_rereads_said_at_validate_and_in_the_plan(
        tmp_path: Path, decoder: Decoder) -> None:
    with JsonApi() as api:
        api.records.extend({"id": i, "v": i} for i in range(5))
        api.route("/items", next_url_pages(api.records, 2))
        text = MANIFEST.format(key='primary_key = ["id"]', url=f"{api.url}/items")
        (tmp_path / "contextful.toml").write_text(text)
        validated = json.loads(contextful(tmp_path, "--json", "pipeline", "validate").stdout)
        assert any("'events'" in w and "every row again" in w for w in validated["warnings"])
        assert "every row again" in contextful(tmp_path, "pipeline", "validate").stderr
        manifest = parse_manifest(tomllib.loads(text), tmp_path)
        spec = manifest.pipeline("events")
        with Store.open(tmp_path / "store") as store:
            assert plan_pipeline(store, manifest, spec).to_json()["rereads_all"] is True
            run_pipeline(store, manifest, spec, decoder)
            run_pipeline(store, manifest, spec, decoder)
            assert sorted(r["id"] for r in store.table("events").to_arrow().to_pylist()) == list(range(5))
