"""The reference delegate (datasets/enrich_delegate.py) as a real child process on loopback, shared
by the delegate and isolated-item tests (``delegate_of`` lives in this package's conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from contextful.engine.control.worker_key import KEY_VARIABLE

KEY = "k" * 40
"""The worker key the tests' engine and delegate share."""


class Delegate:
    """The reference delegate as a child process: its url and the requests it logged."""

    def __init__(self, root: Path, script: dict[str, list[str]]) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.log = root / "requests.ndjson"
        (root / "script.json").write_text(json.dumps(script))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "contextful.datasets.enrich_delegate", "--log", str(self.log),
             "--script", str(root / "script.json")],
            stdout=subprocess.PIPE, text=True, env={**os.environ, KEY_VARIABLE: KEY})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # printed once it accepts requests
        assert line.startswith("listening "), line
        self.url = line.removeprefix("listening ")

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []

    def sent_keys(self) -> list[str]:
        return [r["envelope"]["entity"]["key"] for r in self.requests()]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


Start = Callable[..., Delegate]
"""Start a reference delegate with a script of behaviours."""
