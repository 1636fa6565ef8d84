"""A scheduled store-driven job end to end, as an operator runs it: ``pipeline serve --cycle
--issuer-key`` (a real serve process) dispatches ``job:score-documents`` through the cadence lease and
the pool as the child ``contextful job fire``, which admits the credential serve minted for it,
runs the registered body of the project's module over the applied statement, and records the fire
that ``contextful job history`` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.control.credentials import generate_key
from contextful.engine.project import open_project_store

from tests.engine.jobs.project import applied, write_project
from tests.support.cli import contextful


@pytest.mark.clause("surface.fire.scheduled-body", "surface.dispatch.fire-credential")
def test_serve_fires_a_scheduled_store_driven_job_under_its_identity_with_a_minted_credential(tmp_path: Path) -> None:
    root = write_project(tmp_path / "project", extra='\n[project.zone]\ndefault = "eu"\n')
    manifest = root / "contextful.toml"  # yearly: due when first armed, then not again for months
    manifest.write_text(manifest.read_text().replace('schedule = "every 1m"', 'schedule = "0 0 1 1 *"'))
    with open_project_store(root, create=True) as store:
        store.append("documents", pa.table({"doc_id": ["d1", "d2", "d3"], "body": ["a", "bb", "ccc"]}))
    applied(root)
    # a draft edit never reaches the fire: the applied statement is the one that runs
    (root / "contextful.toml").write_text((root / "contextful.toml").read_text().replace("ORDER BY doc_id",
                                                                                        "WHERE false"))
    _pin, key = generate_key(tmp_path / "keys" / "issuer.pem")
    done = contextful(root, "--json", "pipeline", "serve", "--cycle", "--issuer-key", str(key), check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["fired"] == ["job:score-documents"] and answer["failed"] == []
    with open_project_store(root) as store:
        scores = store.table("scores").to_arrow().sort_by("doc_id").to_pylist()
    assert scores == [{"doc_id": "d1", "score": 1}, {"doc_id": "d2", "score": 2}, {"doc_id": "d3", "score": 3}]
    [fire] = json.loads(contextful(root, "--json", "job", "history", "score-documents").stdout)
    assert (fire["status"], fire["version"], fire["identity"]) == ("ok", 1, "job:score-documents")
    assert fire["detail"]["completed"] == 3 and fire["rows"] == 3 and fire["duration_s"] >= 0
    # the cadence recorded it: a second cycle finds nothing due
    again = json.loads(contextful(root, "--json", "pipeline", "serve", "--cycle", "--issuer-key", str(key)).stdout)
    assert again["fired"] == [] and again["pending"] == []
