"""Installing this repository as a user does, into a fresh virtual environment outside it.

The environment imports the dependencies (pyarrow, duckdb, ...: no network here) from exactly the
site directories of the interpreter running the tests, named in a ``.pth`` file: a virtual
environment's own site-packages when the suite runs in one, the machine's when it runs on the
system interpreter (a ``--system-site-packages`` environment would see the base interpreter's,
which lacks them when they live in the user's environment). A ``.pth`` line that names a directory
adds it and nothing more: the ``.pth`` files inside it (the repository's editable install among
them) do not run, so what the test installs into the environment is the ``contextful`` it imports.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "contextful", "engine", "storage", "iceberg", "datasets")
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".contextful", "raw", "*.egg-info")


def sh(*args: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def user_env() -> dict[str, str]:
    """The environment without this session's PYTHONPATH, virtual environment or CONTEXTFUL_* variables."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")
            and not k.startswith("CONTEXTFUL_")}


def copy_sources(dest: Path) -> Path:
    """A copy of what a clone holds of the distribution, at ``dest`` (building writes beside it)."""
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=IGNORED)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def dependency_dirs() -> list[str]:
    """The site directories the interpreter running the tests imports from, in its order."""
    sites = {*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])}
    real = {os.path.realpath(d) for d in sites}
    return [entry for entry in sys.path if entry and os.path.realpath(entry) in real and os.path.isdir(entry)]


def fresh_venv(venv: Path, env: dict[str, str]) -> Path:
    """A new virtual environment at ``venv`` importing the dependencies as above; its bin directory."""
    proc = sh(sys.executable, "-m", "venv", venv, cwd=venv.parent, env=env)
    assert proc.returncode == 0, proc.stderr
    bin_dir = venv / "bin"
    purelib = sh(bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=venv.parent,
                 env=env)
    assert purelib.returncode == 0, purelib.stderr
    dependencies = dependency_dirs()
    assert dependencies, sys.path
    (Path(purelib.stdout.strip()) / "dependencies.pth").write_text("".join(f"{d}\n" for d in dependencies))
    return bin_dir
