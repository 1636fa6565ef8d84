"""``[control.delegates.<name>]`` through the CLI a user runs: a binding's url, mode and timeout,
its host (loopback or the contextful.delegate virtual host, no credential), its timeout's default
and ceiling, and a store-driven body naming a delegate no block binds."""

from __future__ import annotations

from pathlib import Path

import pytest
from contextful.engine.config.delegates import DelegateBinding
from contextful.engine.config.parse import load_manifest

from tests.support.cli import contextful_in

HEAD = """\
[project]
name = "delegated"

[[pipeline]]
id = "orders"
schedule = "every 10m"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""

JOB = """
[[job]]
name = "enrich-orders"
kind = "store-driven"
schedule = "every 1m"
body = { delegate = "enricher" }
statement = "SELECT * FROM orders"
max_in_flight = 2
tables = ["enriched"]
"""


def _validate(root: Path, control: str, jobs: str = JOB) -> tuple[int, list[str]]:
    """``pipeline validate``: its exit code and error lines."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "raw").mkdir(exist_ok=True)
    (root / "contextful.toml").write_text(HEAD + control + jobs)
    done = contextful_in(root, "pipeline", "validate", check=False)
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error: ")]


def _binding(root: Path) -> DelegateBinding:
    """The binding of ``enricher`` the public API reads from the project at ``root``."""
    binding = load_manifest(root).control.delegate("enricher")
    assert binding is not None
    return binding


@pytest.mark.clause("surface.delegate.binding")
def test_a_binding_names_url_mode_and_timeout_and_a_body_naming_no_binding_is_unbound(tmp_path: Path) -> None:
    bound = """
[control.delegates.enricher]
url = "http://127.0.0.1:9005/enrich"
mode = "call"
timeout = "90s"
"""
    assert _validate(tmp_path / "bound", bound) == (0, [])
    binding = _binding(tmp_path / "bound")
    assert (binding.url, binding.mode, binding.timeout_s) == ("http://127.0.0.1:9005/enrich", "call", 90)
    other = bound.replace("enricher", "scorer")
    assert _validate(tmp_path / "unbound", other) == (3, [
        ("error: JobDelegateUnbound: job 'enrich-orders': its body names delegate 'enricher', which no "
         "[control.delegates] binding declares; nothing fires")])
    assert _validate(tmp_path / "mode", bound.replace('"call"', '"push"')) == (3, [
        "error: ManifestValueInvalid: [control.delegates.enricher].mode: must be \"call\" or \"submit\", not 'push'"])


@pytest.mark.clause("surface.delegate.host")
@pytest.mark.parametrize(("url", "reason"), [
    ("https://127.0.0.1:9005/enrich", "its scheme is 'https': a delegate is reached over http:// on this host"),
    ("http://delegates.example.com/enrich", ("host 'delegates.example.com' is neither a loopback address nor the "
                                             "contextful.delegate virtual host")),
    ("http://10.0.0.7:9005/enrich", ("host '10.0.0.7' is neither a loopback address nor the contextful.delegate "
                                     "virtual host")),
    ("http://svc:hunter2@127.0.0.1:9005/enrich", "it carries a credential (user info): a delegate url carries none"),
    ("http://127.0.0.1:9005/enrich?token=abc", ("it carries a query or fragment: a delegate url carries no "
                                                "credential, and nothing else beside its path")),
])
def test_a_delegate_url_off_loopback_or_carrying_a_credential_is_refused_and_serve_arms_nothing(
        tmp_path: Path, url: str, reason: str) -> None:
    control = f'\n[control.delegates.enricher]\nurl = "{url}"\nmode = "call"\n'
    assert _validate(tmp_path, control) == (3, [
        f"error: DelegateHostRefused: [control.delegates.enricher] url {url!r}: {reason}; nothing is armed"])
    served = contextful_in(tmp_path, "pipeline", "serve", "--cycle", check=False)
    assert served.returncode == 3
    assert f"DelegateHostRefused: [control.delegates.enricher] url {url!r}" in served.stderr
    assert not (tmp_path / ".contextful" / "store").exists()  # nothing armed, nothing run


@pytest.mark.clause("surface.delegate.host")
@pytest.mark.parametrize("url", ["http://127.0.0.1:9005/enrich", "http://localhost:9005/enrich",
                                 "http://[::1]:9005/enrich", "http://contextful.delegate/enrich"])
def test_loopback_hosts_and_the_virtual_host_bind(tmp_path: Path, url: str) -> None:
    assert _validate(tmp_path, f'\n[control.delegates.enricher]\nurl = "{url}"\nmode = "call"\n') == (0, [])


@pytest.mark.clause("surface.delegate.call-timeout")
def test_a_call_delegates_timeout_defaults_to_300_s(tmp_path: Path) -> None:
    control = '\n[control.delegates.enricher]\nurl = "http://127.0.0.1:9005/enrich"\nmode = "call"\n'
    assert _validate(tmp_path, control) == (0, [])
    assert _binding(tmp_path).timeout_s == 300


@pytest.mark.clause("surface.delegate.call-timeout-ceiling")
def test_a_call_timeout_above_3600_s_is_refused_at_validation(tmp_path: Path) -> None:
    control = '\n[control.delegates.enricher]\nurl = "http://127.0.0.1:9005/enrich"\nmode = "call"\n'
    assert _validate(tmp_path / "at", control + 'timeout = "1h"\n') == (0, [])
    assert _validate(tmp_path / "over", control + 'timeout = "3601s"\n') == (3, [
        "error: DelegateTimeoutRefused: [control.delegates.enricher] timeout 3601 s is above the 3600 s ceiling"])
    assert _validate(tmp_path / "over-m", control + 'timeout = "61m"\n') == (3, [
        "error: DelegateTimeoutRefused: [control.delegates.enricher] timeout 3660 s is above the 3600 s ceiling"])
