"""The conventions a machine can check: ruff over the tree, mypy over the packages' code.

Versions are pinned in the test extra, so a new release cannot change what passes here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)


def test_ruff_finds_nothing() -> None:
    proc = run("ruff", "check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing_in_the_packages() -> None:
    proc = run("mypy", "--ignore-missing-imports", "--no-incremental", "engine", "storage", "iceberg")
    assert proc.returncode == 0, proc.stdout + proc.stderr
