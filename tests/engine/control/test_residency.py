"""Residency: the ``[residency]`` allow-set and what it gates at startup (``surface.reside.*``;
docs/control.md "Residency").

Buckets are real ones on the test session's S3-compatible server, created in the region each test
names; every command is a real ``contextful`` child process.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import boto3
import pytest

from tests.engine.control.scenario import ControlProject, files_pipeline
from tests.support.cli import contextful_in
from tests.support.s3_server import CREDENTIALS, S3Server


def _bucket_in(server: S3Server, region: str) -> str:
    """A new bucket on ``server`` whose location is ``region``."""
    name = f"r-{uuid.uuid4().hex[:16]}"
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=region,
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    return name


def _project(root: Path, regions: list[str], store: str | None = None) -> ControlProject:
    project = ControlProject(root)
    project_block = f'store = "{store}"\ncatalog = "catalog.sqlite"\n' if store else ""
    residency = "[residency]\nregions = [" + ", ".join(f'"{r}"' for r in regions) + "]\n"
    text = f'[project]\nname = "{project.name}"\n{project_block}\n{residency}\n' + files_pipeline("orders")
    (root / "contextful.toml").write_text(text)
    project.rows("orders", 3)
    return project


def _run(project: ControlProject, *args: str, server: S3Server | None = None) -> subprocess.CompletedProcess[str]:
    env = {"CONTEXTFUL_S3_ENDPOINT_URL": server.endpoint} if server else {}
    return contextful_in(None, "--project", str(project.root), *args, env=env, check=False)


@pytest.mark.clause("surface.reside.region-entries")
def test_an_allow_set_holds_at_most_sixteen_regions(tmp_path: Path) -> None:
    sixteen = [f"eu-west-{n}" for n in range(1, 17)]
    project = _project(tmp_path / "p16", sixteen)
    proc = _run(project, "pipeline", "validate")
    assert proc.returncode == 0, proc.stderr
    project = _project(tmp_path / "p17", [*sixteen, "eu-west-17"])
    proc = _run(project, "pipeline", "validate")
    assert proc.returncode == 3, proc.stderr
    assert "ManifestValueInvalid: [residency].regions: holds 17 entries; a residency allow-set holds at most 16" \
        in proc.stderr
    # and nothing claims a version from it
    proc = _run(project, "pipeline", "import")
    assert proc.returncode == 3 and not (project.root / ".contextful" / "control").exists()


@pytest.mark.clause("surface.reside.region-mismatch")
def test_a_store_in_a_region_the_policy_omits_stops_serve_before_it_serves(tmp_path: Path,
                                                                           s3_server: S3Server) -> None:
    bucket = _bucket_in(s3_server, "eu-west-1")
    store = f"s3://{bucket}/shop"
    project = _project(tmp_path / "p", ["eu-central-1", "eu-north-1"], store)
    assert _run(project, "pipeline", "import", server=s3_server).returncode == 0
    cycle = _run(project, "--json", "pipeline", "serve", "--cycle", server=s3_server)
    assert cycle.returncode == 3, cycle.stderr
    assert (f"EnforceRegionMismatch: the store root {store} resolves to region 'eu-west-1', outside [residency] "
            "regions ['eu-central-1', 'eu-north-1']; nothing is served") in cycle.stderr
    daemon = _run(project, "pipeline", "serve", "--http", "127.0.0.1:0", server=s3_server)
    assert daemon.returncode == 3 and "EnforceRegionMismatch" in daemon.stderr
    assert "listening on" not in daemon.stdout  # nothing was bound
    s3 = boto3.client("s3", endpoint_url=s3_server.endpoint, region_name="eu-west-1")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # nothing fired: no store was written
    # the same site allowed the bucket's region serves and fires
    text = (project.root / "contextful.toml").read_text().replace('"eu-north-1"]', '"eu-west-1"]')
    (project.root / "contextful.toml").write_text(text)
    assert _run(project, "pipeline", "apply", server=s3_server).returncode == 0
    cycle = _run(project, "--json", "pipeline", "serve", "--cycle", server=s3_server)
    assert cycle.returncode == 0, cycle.stderr
    assert json.loads(cycle.stdout)["fired"] == ["orders"]


@pytest.mark.clause("surface.reside.region-mismatch")
def test_a_bucket_whose_region_cannot_be_learned_is_refused_not_assumed(tmp_path: Path,
                                                                         s3_server: S3Server) -> None:
    store = f"s3://absent-{uuid.uuid4().hex[:12]}/shop"
    project = _project(tmp_path / "p", ["eu-west-1"], store)
    assert _run(project, "pipeline", "import", server=s3_server).returncode == 0
    cycle = _run(project, "pipeline", "serve", "--cycle", server=s3_server)
    assert cycle.returncode == 3, cycle.stderr
    assert f"EnforceRegionMismatch: the store root {store} resolves to region 'unresolved (" in cycle.stderr
