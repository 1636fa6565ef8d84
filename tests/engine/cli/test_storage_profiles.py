"""Storage profiles as a user meets them from the command line (real child processes): the
``postgres`` profile without a DSN says the DSN is required and which variable binds it, instead of
trying a local socket; and every message names a profile by its ``CONTEXTFUL_STORAGE_PROFILE`` value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from contextful.storage.catalog import PROFILES
from contextful.storage.errors import EXIT_CODES


def _contextful(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``contextful --project PROJECT ARGS`` with no ``CONTEXTFUL_*`` nor libpq ``PG*`` variable but ``env``'s."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CONTEXTFUL_", "PG"))} | env
    return subprocess.run([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), *args],
                          capture_output=True, text=True, env=clean, timeout=300, check=False)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "profiles"\n')
    (tmp_path / "a.ndjson").write_text('{"a": 1}\n')
    return tmp_path


@pytest.mark.parametrize("args", [["table", "load", "t", "a.ndjson"], ["pipeline", "run"]])
def test_the_postgres_profile_without_a_dsn_names_the_variable_it_needs(project: Path, args: list[str]) -> None:
    proc = _contextful(project, *[str(project / a) if a.endswith(".ndjson") else a for a in args],
                       CONTEXTFUL_STORAGE_PROFILE="postgres")
    assert proc.returncode == EXIT_CODES["spec-invalid"], proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: CatalogDsnMissing: CONTEXTFUL_STORAGE_PROFILE=postgres keeps the catalog in "
                           "PostgreSQL and needs its DSN: set CONTEXTFUL_POSTGRES_DSN"), line
    assert "CatalogUnavailable" not in proc.stderr and "socket" not in proc.stderr


def test_messages_name_a_profile_by_its_value(project: Path) -> None:
    assert PROFILES == ("local", "postgres", "cloudflare-d1")
    loaded = _contextful(project, "table", "load", "t", str(project / "a.ndjson"))
    assert loaded.returncode == 0, loaded.stderr
    proc = _contextful(project, "store", "provision")  # the container profile's verb, under the local one
    assert proc.returncode == EXIT_CODES["permanent"], proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: StorageCapabilityMissing: storage profile 'local' lacks the container profile "
                           "(CONTEXTFUL_STORAGE_PROFILE=postgres)"), line
    unknown = _contextful(project, "table", "list", CONTEXTFUL_STORAGE_PROFILE="sqlite")
    assert unknown.returncode == EXIT_CODES["spec-invalid"]
    assert "CONTEXTFUL_STORAGE_PROFILE='sqlite' is not one of local, postgres, cloudflare-d1" in unknown.stderr
