"""Scratch control-plane projects for tests: a manifest, its applied versions, cycles and serves.

Everything runs as a user runs it: ``contextful`` in a child process (``tests.support.cli``), serve
as a real daemon whose children are real processes. Units that must stay in flight until a test
lets them go are ``http`` pipelines over :class:`Gates`, a loopback JSON API whose every route
holds its answer until the test opens that route's gate, and records the order the requests came in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.cli import contextful
from tests.support.http_api import JsonApi, Reply, Request


class Gates(JsonApi):
    """A loopback API whose route ``/<name>`` answers ``[{"id": 1, "name": name}]`` once its gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[str] = []
        self._arrival = threading.Condition()
        self._gates: dict[str, threading.Event] = {}
        self.holding = 0
        self.most_held = 0
        """The most requests ever held at once (units in flight together)."""

    def gate(self, name: str, *, open_: bool = False) -> str:
        """Declare the route ``/<name>`` (its gate shut unless ``open_``); the URL a pipeline pulls."""
        event = self._gates.setdefault(name, threading.Event())
        if open_:
            event.set()

        def answer(_request: Request) -> Reply:
            with self._arrival:
                self.arrived.append(name)
                self.holding += 1
                self.most_held = max(self.most_held, self.holding)
                self._arrival.notify_all()
            event.wait(120)
            with self._arrival:
                self.holding -= 1
            return Reply(200, [{"id": 1, "name": name}])

        self.route(f"/{name}", answer)
        return f"{self.url}/{name}"

    def open(self, *names: str) -> None:
        for name in names:
            self._gates[name].set()

    def wait_arrived(self, count: int, timeout: float = 120) -> list[str]:
        """Wait until ``count`` requests came in; the names in arrival order."""
        with self._arrival:
            if not self._arrival.wait_for(lambda: len(self.arrived) >= count, timeout):
                raise AssertionError(f"{count} request(s) expected, {self.arrived} came")
            return list(self.arrived)

    def in_flight(self) -> list[str]:
        """Routes requested whose gate is still shut."""
        with self._arrival:
            return [n for n in self.arrived if not self._gates[n].is_set()]


def http_pipeline(pipeline_id: str, url: str, *, schedule: str | None = "every 1h", priority: int | None = None,
                  after: str | None = None) -> str:
    lines = [f'id = "{pipeline_id}"', 'primary_key = ["id"]']
    if schedule is not None:
        lines.append(f'schedule = "{schedule}"')
    if priority is not None:
        lines.append(f"priority = {priority}")
    if after is not None:
        lines.append(f'after = ["{after}"]')
    lines += ["[pipeline.source]", 'kind = "http"', "[pipeline.source.config]", f'url = "{url}"',
              "timeout_s = 300"]  # a gate held shut is a slow answer, never a timeout
    return "\n[[pipeline]]\n" + "\n".join(lines) + "\n"


def files_pipeline(pipeline_id: str, *, schedule: str | None = "every 1h", paths: str | None = None,
                   after: str | None = None) -> str:
    lines = [f'id = "{pipeline_id}"', 'primary_key = ["id"]']
    if schedule is not None:
        lines.append(f'schedule = "{schedule}"')
    if after is not None:
        lines.append(f'after = ["{after}"]')
    lines += ["[pipeline.source]", 'kind = "files"', "[pipeline.source.config]",
              f'paths = ["{paths or pipeline_id + "/*.ndjson"}"]']
    return "\n[[pipeline]]\n" + "\n".join(lines) + "\n"


RECEIVE = '\n[[pipeline]]\nid = "clicks"\n[pipeline.source]\nkind = "receive"\n[pipeline.source.config]\nkey_retention_secs = 3600\n'
"""A ``receive`` pipeline ``clicks``: batches pushed to serve, or left spooled by a receiver that died."""


def spool_dead(project: ControlProject, key: str) -> None:
    """A receiver of ``clicks`` that spooled batch ``key`` (3 rows) and died before landing it."""
    from tests.engine.land.test_receive import SPOOL_AND_DIE, _env

    child = subprocess.run([sys.executable, "-c", SPOOL_AND_DIE, str(project.root / ".contextful" / "queue"), key],
                           env=_env(), capture_output=True, timeout=60, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr


def block_table(project: ControlProject, table: str) -> Path:
    """Put a file where ``table``'s directory belongs, so staging its parts fails (as a full or broken
    disk would) until the test unlinks the returned path."""
    blocked = project.root / ".contextful" / "store" / "tables" / table
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a directory: staging the table's parts fails")
    return blocked


class ControlProject:
    """A project directory: its manifest, applied through ``contextful pipeline import`` / ``apply``."""

    def __init__(self, root: Path, name: str = "ctl") -> None:
        self.root = root
        self.name = name
        root.mkdir(parents=True, exist_ok=True)

    def write(self, *blocks: str, control: str = "") -> None:
        text = f'[project]\nname = "{self.name}"\n' + (f"\n[control]\n{control}\n" if control else "")
        (self.root / "contextful.toml").write_text(text + "".join(blocks))

    def rows(self, name: str, n: int, *, file: str = "a") -> None:
        """Write ``n`` NDJSON rows as input ``<name>/<file>.ndjson`` of the files pipeline ``name``."""
        folder = self.root / name
        folder.mkdir(exist_ok=True)
        (folder / f"{file}.ndjson").write_text("".join(json.dumps({"id": i, "v": f"{file}{i}"}) + "\n"
                                                       for i in range(n)))

    def cli(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return contextful(self.root, *args, check=check)

    def imported(self) -> None:
        self.cli("pipeline", "import")

    def applied(self) -> None:
        self.cli("pipeline", "apply")

    def cycle(self, *, check: bool = False) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        """``contextful --json pipeline serve --cycle``: the process and its JSON answer."""
        proc = self.cli("--json", "pipeline", "serve", "--cycle", check=check)
        try:
            return proc, json.loads(proc.stdout)
        except ValueError as exc:
            raise AssertionError(f"cycle exit {proc.returncode}: no JSON answer: {proc.stdout!r} {proc.stderr}") from exc

    def count(self, table: str) -> int:
        from contextful.engine.project import open_project_store
        from contextful.engine.read import connect

        with open_project_store(self.root) as store:
            con = connect(store)
            try:
                return int(con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
            finally:
                con.close()


class Serve:
    """``contextful pipeline serve`` as a daemon: its stderr log read line by line as it comes."""

    def __init__(self, project: ControlProject, *args: str, env: dict[str, str] | None = None) -> None:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")} | (env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project.root),
                                      "pipeline", "serve", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=clean)
        self.lines: list[str] = []
        self.out: list[str] = []
        self._seen = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stderr, self.lines), (self.proc.stdout, self.out))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any, into: list[str]) -> None:
        for line in stream:
            with self._seen:
                into.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_line(self, needle: str, *, count: int = 1, timeout: float = 120, stdout: bool = False) -> list[str]:
        """Wait until ``count`` log lines contain ``needle`` (stdout's lines with ``stdout``)."""
        source = self.out if stdout else self.lines

        def found() -> list[str]:
            return [line for line in source if needle in line]

        with self._seen:
            if not self._seen.wait_for(lambda: len(found()) >= count or self.proc.poll() is not None, timeout):
                raise AssertionError(f"no {needle!r} in serve's log after {timeout} s: {self.lines}")
            if len(found()) < count:
                raise AssertionError(f"serve exited {self.proc.returncode} before {needle!r}: {self.lines}")
            return found()

    @property
    def url(self) -> str:
        return self.wait_line("listening on", stdout=True)[0].split()[2]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(10)
        return code


@contextmanager
def serving(project: ControlProject, *args: str, env: dict[str, str] | None = None) -> Iterator[Serve]:
    serve = Serve(project, *args, env=env)
    try:
        yield serve
    finally:
        if serve.proc.poll() is None:
            serve.stop(signal.SIGKILL)
