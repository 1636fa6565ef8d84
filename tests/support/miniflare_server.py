"""The D1 profile's Worker under miniflare on loopback, with local D1 and R2 persisted to a directory.

``storage/d1/worker/miniflare.mjs`` runs ``storage/d1/worker/worker.js`` (the private Worker the D1 adapters talk to) with the
bindings ``storage/d1/worker/wrangler.toml`` gives it on a real account; this starts it as a child process in its
own process group, reads the ``URL=`` line it prints once it answers (a pipe read with a deadline,
not a guess), and stops the whole group. miniflare comes from the repository's package-lock.json
(``npm ci``); :func:`unavailable` says why it cannot start when node or the install is missing.
Set ``CONTEXTFUL_TEST_D1_URL`` and ``CONTEXTFUL_TEST_D1_TOKEN`` to use a Worker already running.
"""

from __future__ import annotations

import os
import queue
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "storage" / "d1" / "worker" / "miniflare.mjs"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def unavailable() -> str | None:
    """Why miniflare cannot start here (None: it can)."""
    if shutil.which("node") is None:
        return "node is not installed: the D1 profile's tests need Node 20 and `npm ci` (package.json)"
    if not (ROOT / "node_modules" / "miniflare" / "package.json").exists():
        return f"miniflare is not installed: run `npm ci` in {ROOT} (package-lock.json pins it)"
    return None


class MiniflareServer:
    """One miniflare process serving the Worker; ``url`` and ``token`` are what the adapters bind."""

    def __init__(self, base: str | None = None) -> None:
        self.base = base or tempfile.mkdtemp(prefix="contextful-d1-")
        self.token = secrets.token_hex(16)
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> MiniflareServer:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        log = open(os.path.join(self.base, "log"), "ab")  # noqa: SIM115 - the child owns it from here
        env = {**os.environ, "CONTEXTFUL_D1_TOKEN": self.token}
        self._proc = subprocess.Popen(["node", str(LAUNCHER), os.path.join(self.base, "persist")], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        log.close()
        with open(os.path.join(self.base, "pid"), "w") as fh:
            fh.write(str(self._proc.pid))
        self.url = self._await_url(self._proc)
        return self

    def _await_url(self, proc: subprocess.Popen[bytes]) -> str:
        lines: queue.Queue[bytes] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=START_TIMEOUT_S).decode().strip()
        except queue.Empty:
            line = ""
        if not line.startswith("URL="):
            self.stop()
            raise RuntimeError(f"miniflare did not start (see {self.base}/log): {line!r}")
        return line.removeprefix("URL=")

    def stop(self) -> None:
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGTERM)  # node disposes miniflare, which stops workerd
            try:
                self._proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None
        self.stop_at(self.base)

    @staticmethod
    def stop_at(base: str) -> None:
        """Stop what is left of the server whose directory is ``base`` (its whole process group: a
        workerd outliving node too) and remove the directory."""
        try:
            with open(os.path.join(base, "pid")) as fh:
                _signal_group(int(fh.read()), signal.SIGKILL)
        except FileNotFoundError:
            pass
        shutil.rmtree(base, ignore_errors=True)

    @staticmethod
    def new_namespace() -> str:
        """A fresh namespace for the D1 adapters, so tests sharing the server share nothing else."""
        return f"t{uuid.uuid4().hex[:12]}"


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
