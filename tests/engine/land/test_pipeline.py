"""``contextful pipeline run`` end to end: generated shards land, re-runs land only what is new,
a bad input fails alone and by name, checkpoints commit at input boundaries."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from contextful.datasets.gharchive import expected_counts, write_shards
from contextful.engine.config import load_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.pipeline import cursor_scope
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store

from tests.support.cli import contextful

MANIFEST = """
[project]
name = "e2e"

[[pipeline]]
id = "gh"
table = "gh_events"
types = { id = "bigint", created_at = "timestamp[s, UTC]" }
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson.gz"]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    (tmp_path / "raw").mkdir()
    return tmp_path



@pytest.mark.clause("run.land.typed-pull")
def test_generated_events_land_and_reruns_land_only_new_inputs(project: Path) -> None:
    n = 3000
    write_shards(n, project / "raw", shards=3, seed=5, gzip=True)
    out = json.loads(contextful(project, "--json", "pipeline", "run").stdout)
    assert out[0]["ok"] and out[0]["tables"][0]["rows"] == n and len(out[0]["inputs_landed"]) == 3
    counts = expected_counts(n, seed=5)
    rows = json.loads(contextful(project, "--json", "sql",
                                 "SELECT type, count(*) AS n FROM gh_events GROUP BY type ORDER BY type").stdout)
    assert {r["type"]: r["n"] for r in rows} == counts["by_type"]
    commits = json.loads(contextful(project, "--json", "sql",
                                    "SELECT sum(len(payload.commits))::BIGINT AS c FROM gh_events WHERE type = 'PushEvent'").stdout)
    assert commits[0]["c"] == counts["push_commits"]
    schema = {c["name"]: c["type"] for c in json.loads(contextful(project, "--json", "table", "show", "gh_events").stdout)["schema"]}
    assert schema["id"] == "int64" and schema["created_at"] == "timestamp[s, tz=UTC]"  # the pull's types landed

    again = json.loads(contextful(project, "--json", "pipeline", "run").stdout)
    assert again[0]["tables"][0]["rows"] == 0 and again[0]["inputs_skipped"] == 3 and again[0]["tables"][0]["run_ids"] == []

    # two more shards of a longer deterministic stream: only their rows land
    bigger = write_shards(2 * n, project / "more", shards=6, seed=5, gzip=True)
    for path in bigger[3:]:
        path.rename(project / "raw" / path.name.replace("events-", "events-b"))
    plan = json.loads(contextful(project, "--json", "pipeline", "plan").stdout)["pipelines"]
    assert len(plan[0]["pull"]) == 3 and len(plan[0]["skip"]) == 3
    third = json.loads(contextful(project, "--json", "pipeline", "run").stdout)
    assert third[0]["tables"][0]["rows"] == n
    total = json.loads(contextful(project, "--json", "sql", "SELECT count(*) AS n, count(DISTINCT id) AS d FROM gh_events").stdout)
    assert total == [{"n": 2 * n, "d": 2 * n}]


def test_a_malformed_input_fails_alone_by_name_and_a_rerun_lands_exactly_it(project: Path) -> None:
    write_shards(600, project / "raw", shards=2, seed=9, gzip=True)
    bad = project / "raw" / "events-zz.ndjson.gz"
    lines = ['{"id": "900001", "type": "WatchEvent"}', '{"id": "900002", "type": ', '{"id": "900003", "type": "X"}']
    bad.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    proc = contextful(project, "--json", "pipeline", "run", check=False)
    assert proc.returncode == 4
    result = json.loads(proc.stdout)[0]
    assert result["tables"][0]["rows"] == 600 and len(result["inputs_landed"]) == 2
    failure = result["failures"][0]
    assert failure["error"] == "InputMalformed" and failure["input"].endswith("events-zz.ndjson.gz")
    assert "line 2" in failure["detail"]
    assert "error: InputMalformed" in contextful(project, "pipeline", "run", check=False).stderr

    lines[1] = '{"id": "900002", "type": "ForkEvent"}'
    bad.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    fixed = json.loads(contextful(project, "--json", "pipeline", "run").stdout)[0]
    assert fixed["inputs_landed"] == [str(bad)] and fixed["tables"][0]["rows"] == 3
    assert json.loads(contextful(project, "--json", "sql", "SELECT count(*) AS n FROM gh_events").stdout) == [{"n": 603}]


def test_checkpoints_commit_at_input_boundaries_with_the_cursor_so_far(project: Path, decoder: Decoder) -> None:
    paths = write_shards(2000, project / "raw", shards=4, seed=3, gzip=True)
    manifest = load_manifest(project)
    with Store.open(manifest.project.store) as store:
        [result] = run_pipelines(store, manifest, checkpoint_bytes=1, decoder=decoder)
        assert len(result.tables[0].run_ids) == 4  # every input reached the bound: one commit each
        table = store.table("gh_events")
        for seq, path in zip(result.tables[0].commit_seqs, paths):
            manifest_doc = table.manifest(table.commits()[seq - 1].run_id)
            assert list(manifest_doc.cursor["value"]["inputs"])[-1] == path.relative_to(project).as_posix()
        value, seq = table.cursor(cursor_scope(manifest.pipeline("gh")))
        assert seq == result.tables[0].commit_seqs[-1] and len(value["inputs"]) == 4
        assert table.count() == 2000


def test_validate_prints_every_problem_and_exits_spec_invalid(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(
        '[[pipeline]]\nid = "a"\nnormalize = "flat"\nwat = 1\n[pipeline.source]\nkind = "gopher"\n')
    proc = contextful(tmp_path, "pipeline", "validate", check=False)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert any(line.startswith("error: PipelineNormalizeModeUnknown:") for line in lines)
    assert any(line.startswith("error: ManifestKeyUnknown:") and "'wat'" in line for line in lines)
    assert any(line.startswith("error: PipelineSourceKindUnknown:") and "'gopher'" in line for line in lines)
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    assert "ok, 1 pipeline" in contextful(tmp_path, "pipeline", "validate").stdout


def test_a_staging_write_failure_fails_the_run_by_name_and_lands_nothing(project: Path) -> None:
    import resource
    import signal

    write_shards(8000, project / "raw", shards=1, seed=2, gzip=True)
    limit = 1024 * 1024  # a file-size limit the catalog stays under and the part does not

    def small_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead

    proc = contextful(project, "pipeline", "run", check=False, preexec_fn=small_disk)
    assert proc.returncode == 75, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: StagingFailed: table 'gh_events'") and "File too large" in last
    assert "Traceback" not in proc.stderr
    plan = json.loads(contextful(project, "--json", "pipeline", "plan").stdout)["pipelines"]
    assert len(plan[0]["pull"]) == 1  # the cursor did not move
    done = json.loads(contextful(project, "--json", "pipeline", "run").stdout)
    assert done[0]["tables"][0]["rows"] == 8000
