"""The conventions a machine can check: ruff over the tree, mypy over the packages' code, and the
direction imports point in (DESIGN.md: a stage never imports a stage above it).

Versions are pinned in the test extra, so a new release cannot change what passes here. mypy reads
the code as it is installed, ``contextful.engine`` and the rest: the repository keeps ``engine/``
and its siblings at its top and the install maps them under ``contextful`` (setup.py), a mapping
mypy cannot follow, so the test lays the namespace out as links in a temporary directory.
"""

from __future__ import annotations

import ast
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


IMPORTS_REFUSED = {
    "engine/land": ("contextful.engine.derive", "contextful.engine.control", "contextful.engine.run.units"),
    "engine/derive": ("contextful.engine.control", "contextful.engine.run.units"),
    "storage": ("contextful.engine", "contextful.iceberg"),
}
"""Package directory -> the modules it must not import: landing knows neither derive nor the units
above both, derive does not know the control plane, the store layer uses neither engine nor iceberg."""


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere (top level, inside a function, under TYPE_CHECKING)."""
    package = ["contextful", *path.relative_to(ROOT).parent.parts]  # the install maps engine/ under contextful
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
            module = ".".join(p for p in (base, node.module or "") if p)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def test_no_stage_imports_a_stage_above_it() -> None:
    crossing = []
    for package, refused in IMPORTS_REFUSED.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            crossing += [f"{path.relative_to(ROOT)} imports {name}" for name in sorted(imported_modules(path))
                         if any(name == r or name.startswith(f"{r}.") for r in refused)]
    assert not crossing, "\n".join(crossing)
