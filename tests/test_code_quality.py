"""The conventions a machine can check: ruff over the tree, mypy over the packages' code.

Versions are pinned in the test extra, so a new release cannot change what passes here. mypy reads
the code as it is installed, ``contextful.engine`` and the rest: the repository keeps ``engine/``
and its siblings at its top and the install maps them under ``contextful`` (setup.py), a mapping
mypy cannot follow, so the test lays the namespace out as links in a temporary directory.
"""

from __future__ import annotations

import os
import re
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


def test_mypy_finds_nothing_in_the_packages(tmp_path: Path) -> None:
    namespace = tmp_path / "contextful"
    namespace.mkdir()
    for entry in (ROOT / "contextful").iterdir():
        if entry.suffix == ".py":
            (namespace / entry.name).symlink_to(entry)
    for package in ("engine", "storage", "iceberg"):
        (namespace / package).symlink_to(ROOT / package, target_is_directory=True)
    proc = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-incremental",
                           "--cache-dir", os.devnull, "-p", "contextful"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checked = re.search(r"in (\d+) source files", proc.stdout)
    assert checked is not None and int(checked.group(1)) > 100, proc.stdout  # the links were followed
