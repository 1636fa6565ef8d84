"""The distribution as a user gets it: a wheel built from this repository, installed into a fresh
virtual environment outside it, used from another directory. It installs one import name,
``contextful``; ``engine`` and its siblings are not importable; an unrelated package named
``storage`` installed beside it shadows nothing.

The environment imports the dependencies from the test interpreter's site directories and nothing
of the repository's editable install (tests/support/install.py), so the wheel itself, installed into
the environment, is the ``contextful`` it imports, and the test checks that.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.install import REPO, copy_sources, fresh_venv, sh, user_env


def build_wheel(source: Path, out: Path, env: dict[str, str]) -> Path:
    proc = sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, source,
              cwd=out, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next(out.glob("*.whl"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(the environment's bin directory, a directory outside the repository, the environment)."""
    work = tmp_path_factory.mktemp("wheel")
    env = user_env()
    source = copy_sources(work / "source")  # a copy: building writes build/ and egg-info beside the sources
    wheels = work / "wheels"
    wheels.mkdir()
    ours = build_wheel(source, wheels, env)
    with zipfile.ZipFile(ours) as wheel:  # nothing but the namespace and its metadata
        tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    assert tops == {"contextful", next(t for t in tops if t.endswith(".dist-info"))}, tops
    unrelated = work / "unrelated"
    (unrelated / "storage").mkdir(parents=True)
    (unrelated / "storage" / "__init__.py").write_text('WHO = "an unrelated package named storage"\n')
    (unrelated / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                               '"setuptools.build_meta"\n[project]\nname = "storage"\nversion = "1.0"\n')
    theirs = build_wheel(unrelated, wheels, env)
    bin_dir = fresh_venv(work / "venv", env)
    proc = sh(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", ours, theirs, cwd=work, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    yield bin_dir, elsewhere, env


def test_the_wheel_installs_one_import_name_and_shadows_nothing(installed: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, elsewhere, env = installed
    python = bin_dir / "python"
    where = sh(python, "-c", "import contextful, storage; print(contextful.__file__); print(storage.WHO)",
               cwd=elsewhere, env=env)
    assert where.returncode == 0, where.stderr
    contextful_file, storage_who = where.stdout.splitlines()
    assert Path(contextful_file).is_relative_to(bin_dir.parent)  # the wheel's, not the repository's
    assert storage_who == "an unrelated package named storage"
    for internal in ("engine", "iceberg", "datasets"):
        proc = sh(python, "-c", f"import {internal}", cwd=elsewhere, env=env)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, (internal, proc.stderr)


def test_the_readme_main_job_runs_from_another_directory(installed: tuple[Path, Path, dict[str, str]]) -> None:
    bin_dir, elsewhere, env = installed
    python = bin_dir / "python"
    project = elsewhere / "example"  # the example project as a clone has it, its speech recordings beside it
    shutil.copytree(REPO / "datasets" / "example", project, ignore=shutil.ignore_patterns("raw", ".contextful"))
    shutil.copytree(REPO / "datasets" / "speech", elsewhere / "speech", ignore=shutil.ignore_patterns("__pycache__"))
    steps = [
        (python, "-m", "contextful.datasets.gharchive", "400", project / "raw", "--shards", "2", "--gzip"),
        (bin_dir / "contextful", "--project", project, "pipeline", "run"),
        (bin_dir / "contextful", "--project", project, "--json", "sql", "SELECT count(*) AS n FROM gh_events"),
    ]
    for step in steps:
        proc = sh(*step, cwd=elsewhere, env=env)
        assert proc.returncode == 0, (step, proc.stdout, proc.stderr)
    assert '"n": 400' in proc.stdout
    help_text = sh(python, "-m", "contextful", "--help", cwd=elsewhere, env=env)
    assert help_text.returncode == 0 and "pipeline" in help_text.stdout, help_text.stderr
    notebook = ("import contextful\n"
                "con = contextful.connect('example')\n"
                "print(con.sql('SELECT count(*) FROM gh_events').fetchall()[0][0])\n")
    proc = sh(python, "-c", notebook, cwd=elsewhere, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "400", proc.stderr


def test_the_wheel_serves_the_console_without_node(installed: tuple[Path, Path, dict[str, str]]) -> None:
    """The console's page, script and style sheet are package data: an installed wheel serves them."""
    bin_dir, elsewhere, env = installed
    listing = ("from contextful.engine.served.console_routes import ASSETS, load_assets\n"
               "print(ASSETS)\n"
               "print(' '.join(sorted(load_assets())))\n")
    proc = sh(bin_dir / "python", "-c", listing, cwd=elsewhere, env=env)
    assert proc.returncode == 0, proc.stderr
    folder, names = proc.stdout.splitlines()
    assert Path(folder).is_relative_to(bin_dir.parent)  # the wheel's files, not the repository's
    assert set(names.split()) == {p.name for p in (REPO / "engine" / "served" / "console").iterdir()
                                  if p.suffix in {".html", ".js", ".css", ".svg", ".png", ".txt"}}
