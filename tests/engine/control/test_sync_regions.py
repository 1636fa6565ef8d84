"""A push records the pushing site's residency allow-set in the bucket head, and a site whose set
differs from the one another site recorded is refused (surface.reside.site-regions).

Through the command: one node per site, each a project directory of its own syncing through one
bucket (moto on loopback); ``[sync] site`` names the site and ``[residency] regions`` its allow-set.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.control.test_apply import SECOND_PIPELINE, one_error
from tests.engine.control.test_sync import BucketView, Node, make_keys, make_node
from tests.engine.control.test_sync_push import copy_node
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.s3


def as_site(node: Node, site: str, regions: list[str] | None, added: str = "") -> None:
    """Make ``node``'s working document site ``site`` residing in ``regions`` (None: no [residency])."""
    text = node.root.joinpath("contextful.toml").read_text().split("\n[residency]\n")[0]
    text = "\n".join(line for line in text.splitlines() if not line.startswith("site = ")) + "\n"
    text = text.replace("\n[sync]\n", f"{added}\n[sync]\n") + f'site = "{site}"\n'
    if regions is not None:
        text += f"\n[residency]\nregions = {json.dumps(regions)}\n"
    node.write(text)


@pytest.mark.clause("surface.reside.site-regions")
def test_a_push_records_its_sites_regions_and_a_differing_set_of_another_site_is_refused(
        tmp_path: Path, s3_server: S3Server) -> None:
    keys = make_keys(tmp_path / "keys")
    alpha = make_node(tmp_path / "alpha", s3_server, s3_server.new_bucket(), keys)
    as_site(alpha, "alpha", ["eu-west-1", "eu-central-1"])
    alpha.run("pipeline", "import")
    view = BucketView(s3_server, alpha.bucket)
    body, meta = view.head()
    assert body == b"1\n" and meta["site"] == "alpha" and json.loads(meta["regions"]) == ["eu-central-1", "eu-west-1"]
    held = {name: view.get(name) for name in view.names()}

    for site, regions, recorded in (("beta", ["us-east-1"], "['us-east-1']"), ("gamma", None, "none recorded"),
                                    ("delta", ["eu-west-1"], "['eu-west-1']")):
        other = copy_node(alpha, tmp_path / site)  # a node of another site holding the bucket's v1
        as_site(other, site, regions, SECOND_PIPELINE)
        line = one_error(other.run("pipeline", "apply", check=False), "ResidencySitesDiverge", 5)
        assert f"this site resides in {recorded}" in line and "['eu-central-1', 'eu-west-1']" in line, line
        assert "pushed by site 'alpha'" in line
        one_error(other.run("control", "push", check=False), "ResidencySitesDiverge", 5)
        assert {name: view.get(name) for name in view.names()} == held  # nothing committed, v2 not uploaded
        assert view.head()[1]["site"] == "alpha"

    same = copy_node(alpha, tmp_path / "epsilon")  # another site residing where alpha does pushes
    as_site(same, "epsilon", ["eu-west-1", "eu-central-1"], SECOND_PIPELINE)
    assert same.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"
    body, meta = view.head()
    assert body == b"2\n" and meta["site"] == "epsilon" and json.loads(meta["regions"]) == ["eu-central-1",
                                                                                          "eu-west-1"]

    # a site recorded with no allow-set is divergent from one that declares a set (an absent one included)
    bare = make_node(tmp_path / "bare", s3_server, s3_server.new_bucket(), keys)
    as_site(bare, "bare", None)
    bare.run("pipeline", "import")
    assert "regions" not in BucketView(s3_server, bare.bucket).head()[1]
    sited = copy_node(bare, tmp_path / "sited")
    as_site(sited, "sited", ["eu-west-1"], SECOND_PIPELINE)
    line = one_error(sited.run("pipeline", "apply", check=False), "ResidencySitesDiverge", 5)
    assert "this site resides in ['eu-west-1'] but the bucket records none recorded" in line


@pytest.mark.clause("surface.reside.region-mismatch")
def test_serve_refuses_a_sync_bucket_in_a_region_the_allow_set_omits(tmp_path: Path, s3_server: S3Server) -> None:
    node = make_node(tmp_path / "shop", s3_server, s3_server.new_bucket(), make_keys(tmp_path / "keys"))
    as_site(node, "eu-1", ["eu-west-1"])
    node.run("pipeline", "import")
    cycle = node.run("pipeline", "serve", "--cycle", check=False)
    assert cycle.returncode == 3, cycle.stderr
    assert (f"EnforceRegionMismatch: the [sync] bucket s3://{node.bucket}/sync resolves to region 'us-east-1', "
            "outside [residency] regions ['eu-west-1']; nothing is served") in cycle.stderr
    as_site(node, "eu-1", ["eu-west-1", "us-east-1"])  # the bucket's region allowed: the cycle runs
    node.run("pipeline", "apply")
    assert node.run("pipeline", "serve", "--cycle").returncode == 0
