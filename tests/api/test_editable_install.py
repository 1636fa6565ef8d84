"""The editable install of a clone named ``contextful``, used from the directory above it (a notebook
beside the clone): README.md's set-up names the hazard and the install that is immune to it.

With setuptools' default editable install, ``contextful`` is found by a finder that Python consults
after its path-based one, and a directory named ``contextful`` in the working directory (the clone
itself, which has no ``__init__.py``) is an importable namespace package to the path-based finder:
it wins, empty. The strict editable mode links the package into a directory on ``sys.path``, where
a regular package beats any namespace portion. The test builds that layout in a temporary directory
and installs into a fresh environment (tests/support/install.py), never into the test's own.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.install import REPO, copy_sources, fresh_venv, sh, user_env

STRICT = "pip install -e . --config-settings editable_mode=strict"
PROBE = "import contextful, contextful.engine.cli; print(contextful.open_project.__module__)"


def test_a_clone_named_contextful_imports_from_the_directory_above_it_with_the_readme_install(tmp_path: Path) -> None:
    env = user_env()
    clone = copy_sources(tmp_path / "contextful")
    bin_dir = fresh_venv(tmp_path / "venv", env)
    python = bin_dir / "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def install(*mode: str) -> None:
        proc = sh(python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ".", *mode,
                  cwd=clone, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    install()  # the default editable install: fine elsewhere, an empty namespace from the parent
    assert sh(python, "-c", PROBE, cwd=elsewhere, env=env).stdout.strip() == "contextful.api"
    shadowed = sh(python, "-c", PROBE, cwd=tmp_path, env=env)
    assert shadowed.returncode != 0 and "has no attribute 'open_project'" in shadowed.stderr, shadowed.stderr

    install("--config-settings", "editable_mode=strict")  # README.md's immune install
    for cwd in (tmp_path, elsewhere):
        proc = sh(python, "-c", PROBE, cwd=cwd, env=env)
        assert (proc.returncode, proc.stdout.strip()) == (0, "contextful.api"), (cwd, proc.stderr)
    internal = sh(python, "-c", "import engine", cwd=elsewhere, env=env)
    assert internal.returncode != 0 and "ModuleNotFoundError" in internal.stderr  # still one import name
    # An edit to a module shows without reinstalling (the link tree links the clone's files).
    api = clone / "contextful" / "api.py"
    api.write_text(api.read_text() + "\nEDITED = True\n")
    edited = sh(python, "-c", "import contextful.api; print(contextful.api.EDITED)", cwd=tmp_path, env=env)
    assert edited.stdout.strip() == "True", edited.stderr

    setup = (REPO / "README.md").read_text(encoding="utf-8").split("## A five-minute tour")[0]
    assert STRICT in setup and "has no attribute 'open_project'" in setup
