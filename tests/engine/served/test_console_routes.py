"""The console's routes (engine.served.console_routes) on ``contextful pipeline serve --http``, over real HTTP.

The page and its assets (content types, cache headers, the security policy, no path outside the
console's folder), and the overview (``engine.served.console_overview``): admitted only for a
``control`` credential, saying whether its holder is an Admin, and showing what the CLI's status
commands show of a project whose pipelines have run. The browser test (test_console_browser.py)
drives the same page in Chromium.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from contextful.engine.control.apply import snapshot_dir
from contextful.engine.control.receipts import KeySigner, sign_receipt

from tests.engine.served.console_site import Answer, Site, console_served, get
from tests.support.cli import contextful


def refused(answer: Answer) -> tuple[int, str]:
    doc = answer.json()
    assert set(doc) == {"error", "detail"}
    return answer.status, doc["error"]


def test_the_page_and_its_assets_are_served_with_their_types_and_cache_headers(url: str) -> None:
    page = get(url, "/console/")
    assert page.status == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    references = dict(re.findall(r'(?:src|href)="([a-z.]+)\?v=([0-9a-f]{16})"', page.body.decode()))
    assert set(references) == {"console.js", "console.css"}  # every asset named with its digest
    for name, kind in (("console.js", "text/javascript; charset=utf-8"), ("console.css", "text/css; charset=utf-8")):
        versioned = get(url, f"/console/{name}?v={references[name]}")
        assert (versioned.status, versioned.headers["content-type"]) == (200, kind)
        assert versioned.headers["cache-control"] == "public, max-age=31536000, immutable"
        source = Path(__file__).parents[3] / "engine" / "served" / "console" / name
        assert versioned.body == source.read_bytes()
        for stale in (f"/console/{name}", f"/console/{name}?v=0000000000000000"):  # not its digest: revalidated
            assert get(url, stale).headers["cache-control"] == "no-cache"
    moved = get(url, "/console")
    assert (moved.status, moved.headers["location"]) == (308, "/console/")


@pytest.mark.parametrize("path", [
    "/console/../console_routes.py", "/console/%2e%2e/console_routes.py", "/console/..%2fconsole_routes.py",
    "/console/console_routes.py", "/console/__init__.py", "/console/.%2e/face.py", "/console/index.html/x",
    "/console//etc/passwd", "/console/%2fetc%2fpasswd", "/console/..", "/console/index.html%00.js",
])
def test_no_path_names_a_file_outside_the_console_folder(url: str, path: str) -> None:
    assert refused(get(url, path)) == (404, "NotFound")


def test_the_overview_admits_only_a_control_credential(site: Site, url: str, tmp_path: Path) -> None:
    assert refused(get(url, "/console/api/overview")) == (401, "CredentialUnadmitted")
    assert refused(get(url, "/console/api/overview", site.credential("relay", audience="awake"))) == \
        (401, "CredentialUnadmitted")
    stranger = Site(tmp_path)  # a key this project does not pin
    assert refused(get(url, "/console/api/overview", stranger.credential("mallory", admin=True))) == \
        (401, "CredentialUnadmitted")
    assert refused(get(url, "/console/api/overview", "not-a-credential")) == (401, "CredentialUnadmitted")


def test_a_reader_sees_the_status_the_cli_prints_and_is_told_it_holds_no_admin_grant(site: Site, url: str) -> None:
    answer = get(url, "/console/api/overview", site.credential("ops", operator="rita"))
    assert answer.status == 200 and answer.headers["cache-control"] == "no-store"
    doc = answer.json()
    assert doc["holder"]["admin"] is False and doc["holder"]["operator"] == "rita"
    assert doc["project"] == "shop" and doc["applied"]["version"] == 1 and doc["applied"]["receipt"] is None
    status = json.loads(contextful(site.project.root, "--json", "pipeline", "status").stdout)
    orders, customers = doc["pipelines"]
    [armed] = status["armed"]
    assert (orders["id"], orders["schedule"], orders["armed"]) == ("orders", "every 1h", True)
    assert (orders["last_fire"], orders["next_fire"]) == (armed["last_fire"], armed["next_fire"])
    assert orders["last_outcome"]["status"] == "committed" and orders["last_outcome"]["rows"] == 7
    assert (customers["schedule"], customers["armed"]) == (None, False)
    assert customers["unarmed"] == next(u["reason"] for u in status["unarmed"] if u["pipeline"] == "customers")
    history = json.loads(contextful(site.project.root, "--json", "run", "history").stdout)
    assert [(r["run_id"], r["rows"], r["bytes"]) for r in doc["runs"]] == \
        [(r["run_id"], r["rows"], r["bytes"]) for r in history]
    assert sorted(r["rows"] for r in doc["runs"] if r["table"] == "orders") == [5, 7]
    assert all(r["bytes"] > 0 and r["status"] == "committed" for r in doc["runs"])
    assert doc["derive"] == []
    [model] = doc["models"]
    assert model == json.loads(contextful(site.project.root, "--json", "build", "status").stdout)[0]
    assert model["build_id"] is not None and model["stale"] and model["stale_inputs"] == ["orders"]
    [export] = doc["exports"]
    assert export == json.loads(contextful(site.project.root, "--json", "export", "status").stdout)[0]
    assert export["snapshot_id"] is not None and export["source"]["name"] == "order_count"


def test_an_admin_is_told_so_with_the_console_key_its_credential_binds(site: Site, url: str) -> None:
    key = Site(site.base / "other").pin  # any Ed25519 public key stands for a browser's
    doc = get(url, "/console/api/overview", site.credential("ops", operator="ada", admin=True, console_key=key)).json()
    assert doc["holder"] | {"expires_at": None} == {"subject": "ops", "operator": "ada", "admin": True,
                                                     "console_key": key, "expires_at": None}


def test_the_overview_shows_the_receipt_a_synced_claim_wrote(site: Site, url: str) -> None:
    snapshots = snapshot_dir(site.project.root)
    receipt = sign_receipt(KeySigner.from_file(site.key_file), "shop", 1, None, snapshots.file(1).read_bytes())
    (snapshots.path / "receipt@v1.json").write_bytes(receipt.to_bytes())
    try:
        applied = get(url, "/console/api/overview", site.credential("ops")).json()["applied"]
    finally:
        (snapshots.path / "receipt@v1.json").unlink()
    assert applied["receipt"] == {**receipt.document(), "digest": receipt.digest()}


def test_the_overview_of_a_project_with_no_store_creates_none(tmp_path: Path) -> None:
    from tests.engine.control.scenario import files_pipeline

    site = Site(tmp_path)
    site.write(files_pipeline("orders"))
    with console_served(site) as serve:
        doc = get(serve.url, "/console/api/overview", site.credential("ops")).json()
    assert doc["applied"]["version"] is None and doc["runs"] == []
    assert [(p["id"], p["last_outcome"]) for p in doc["pipelines"]] == [("orders", None)]
    assert not (site.project.root / ".contextful").exists()


def test_the_overview_counts_each_derive_pipelines_units_as_a_dry_run_does(tmp_path: Path) -> None:
    """The example's speech pipelines (datasets/example): six recordings, transcribed offline."""
    import shutil

    example = Path(__file__).parents[3] / "datasets"
    shutil.copytree(example / "speech", tmp_path / "speech", ignore=shutil.ignore_patterns("__pycache__"))
    site = Site(tmp_path)
    shutil.copy(example / "example" / "contextful.machine.toml", site.project.root)
    manifest = (example / "example" / "contextful.toml").read_text()
    site.write(manifest[manifest.index('[[pipeline]]\nid = "recordings"'):])  # the speech blocks, as they are
    site.project.cli("pipeline", "run")
    with console_served(site) as serve:
        doc = get(serve.url, "/console/api/overview", site.credential("ops")).json()
    dry = json.loads(contextful(site.project.root, "--json", "pipeline", "run", "--dry-run", "transcripts").stdout)
    assert doc["derive"] == [{k: dry[0][k] for k in ("pipeline", "table", "eligible", "derived", "outstanding",
                                                      "retiring")}]
    assert (doc["derive"][0]["eligible"], doc["derive"][0]["derived"]) == (6, 6)
