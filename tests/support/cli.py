"""Running the ``contextful`` command as a user does: a real child process, a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def contextful(project: Path, *args: str, check: bool = True, timeout: float = 300,
               preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """``contextful --project PROJECT ARGS…``; raises with its stderr when ``check`` and it fails."""
    return contextful_in(None, "--project", str(project), *args, check=check, timeout=timeout, preexec_fn=preexec_fn)


def contextful_in(cwd: Path | None, *args: str, env: dict[str, str] | None = None, check: bool = True,
                  timeout: float = 300,
                  preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """``contextful ARGS…`` run in directory ``cwd``, with no ``CONTEXTFUL_*`` variable but ``env``'s."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | (env or {})
    proc = subprocess.run([sys.executable, "-m", "contextful.engine.cli", *args], cwd=cwd, capture_output=True,
                          text=True, env=clean, timeout=timeout, preexec_fn=preexec_fn, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"contextful {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
    return proc
