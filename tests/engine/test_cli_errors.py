"""An error is one line, always: every ``contextful`` command, run as a real child process against a
project broken in ways the error catalogue does not name, prints exactly one ``error:`` line, no
traceback, exits with a documented code, and leaves its full trace in the log file the line names.

The commands are enumerated from click's command tree, so a new command cannot be left out: one
with required arguments fails here until ``ARGS`` says how to call it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import click
import pytest
from contextful.engine.cli import cli
from contextful.engine.cli.errors import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED
from contextful.storage import Store
from contextful.storage.errors import EXIT_CODES

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "broken"

[[pipeline]]
id = "events"
primary_key = ["id"]

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["events.csv"]

[[model]]
name = "by_kind"
sql = "SELECT kind, count(*) AS n FROM events GROUP BY kind"

[[export]]
name = "kinds"
source = "by_kind"
namespace = "bi"
credential = "analysts"
"""

TRACE = re.compile(r"\(full trace in (?P<path>[^)]+)\)$")


def commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every leaf command of the ``contextful`` tree, as the words that name it."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


COMMANDS = list(commands())
PROJECT_COMMANDS = [c for c in COMMANDS if c[0] != "key"]
"""Every command that reads the project (the ``key`` group works on the operator's key files alone)."""


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose every command works: a landed pipeline, a built model, an export, a reader key."""
    root = tmp_path_factory.mktemp("healthy")
    (root / "contextful.toml").write_text(MANIFEST)
    (root / "events.csv").write_text("id,kind\n1,click\n2,view\n3,click\n")
    for args in (("pipeline", "run"), ("build", "run"), ("export", "run"), ("export", "key", "issue", "analysts")):
        contextful(root, *args)
    return root


def args_for(words: tuple[str, ...], root: Path, port: int) -> list[str]:
    """The arguments each command is called with; a command needing arguments must be listed here."""
    known: dict[tuple[str, ...], list[str]] = {
        ("sql",): ["SELECT * FROM events"],
        ("table", "show"): ["events"],
        ("table", "load"): ["events", str(root / "events.csv")],
        ("table", "fold"): ["events"],
        ("table", "drop"): ["events", "--force"],
        ("run", "rewind"): ["0" * 32, "--reason", "test"],
        ("run", "show"): ["r0"],
        ("run", "cancel"): ["0" * 32],
        ("key", "public"): ["--key", str(root.parent / "issuer.pem")],
        ("key", "issue"): ["--subject", "ops", "--audience", "awake", "--key", str(root.parent / "issuer.pem")],
        ("pipeline", "serve"): ["--http", f"127.0.0.1:{port}"],
        ("worker", "serve"): ["--http", f"127.0.0.1:{port}"],
        ("pipeline", "reset"): ["events", "--yes"],
        ("build", "hold"): ["by_kind", "1"],
        ("build", "release"): ["by_kind", "1"],
        ("job", "fire"): ["nightly"],
        ("job", "history"): ["nightly"],
        ("connection", "show"): ["acme-drive"],
        ("export", "group"): ["nightly_pub"],
        ("export", "rebuild"): ["nightly_pub", "--namespace", "epoch2"],
        ("export", "checkpoint"): ["nightly_pub", "--to", str(root.parent / "checkpoint.json")],
        ("export", "restore"): ["nightly_pub", "--from", str(root.parent / "checkpoint.json")],
        ("store", "backup"): [str(root.parent / "backup.json")],
        ("store", "restore"): [str(root.parent / "backup.json")],
        ("storage", "reconcile-guard"): ["g0", "--evidence", "receipt r-1", "--operator", "ops"],
        ("export", "key", "issue"): ["analysts"],
        ("pipeline", "key", "issue"): ["events"],
        ("pipeline", "key", "revoke"): ["0" * 16],
        ("export", "key", "revoke"): [next((root / ".contextful" / "readers").glob("*.json")).stem],
    }
    if words in known:
        return known[words]
    command: click.Command = cli
    for word in words:
        assert isinstance(command, click.Group)
        command = command.commands[word]
    required = [p.name for p in command.params if p.required]
    assert not required, f"contextful {' '.join(words)} needs {required}: add how to call it to args_for"
    return []


def garbage(path: Path) -> None:
    for extra in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        extra.unlink(missing_ok=True)
    path.write_bytes(b"\x00garbage, not what this file should hold\xff" * 64)


def directory_instead(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "stray").write_text("x")


def manifests_garbled(catalog: Path) -> None:
    with closing(sqlite3.connect(catalog)) as con, con:
        assert con.execute("UPDATE cf_manifests SET doc = '{not json'").rowcount > 0


def truncate_parts(root: Path) -> None:
    for part in (root / ".contextful" / "store" / "tables").glob("[!_]*/parts/*.parquet"):
        part.write_bytes(part.read_bytes()[:64])


STORE_COMMANDS = [c for c in COMMANDS if c[0] in ("sql", "table", "store", "run")] + [
    ("pipeline", "plan"), ("pipeline", "run"), ("build", "run"), ("build", "hold"), ("build", "release"),
    ("build", "list"), ("build", "status"), ("export", "run")]

# breakage -> (how to break a copy of the healthy project, the commands it must make fail)
BREAKAGES: dict[str, tuple[Callable[[Path], object], list[tuple[str, ...]]]] = {
    "manifest-not-utf8": (lambda root: (root / "contextful.toml").write_bytes(b"\xff\xfe" + MANIFEST.encode()),
                          PROJECT_COMMANDS),
    "store-catalog-garbage": (lambda root: garbage(root / ".contextful" / "store" / "catalog.sqlite"),
                              STORE_COMMANDS),
    "store-json-invalid": (lambda root: (root / ".contextful" / "store" / "store.json").write_text("{not json"),
                           [("table", "list"), ("pipeline", "run"), ("build", "hold")]),
    "parts-truncated": (truncate_parts, [("sql",), ("build", "run")]),
    "run-manifest-garbage": (  # a small run's manifest rides in its commit's catalog row (docs/store.md)
        lambda root: manifests_garbled(root / ".contextful" / "store" / "catalog.sqlite"),
        [("run", "history")]),
    "reader-key-a-directory": (
        lambda root: directory_instead(next((root / ".contextful" / "readers").glob("*.json"))),
        [("export", "key", "list"), ("export", "key", "revoke")]),
    "issuer-key-garbage": (lambda root: (root.parent / "issuer.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key"),
                           [("key", "public"), ("key", "issue")]),
    "iceberg-catalog-garbage": (lambda root: garbage(root / ".contextful" / "iceberg" / "catalog.sqlite"),
                                [("export", "run"), ("export", "status")]),
}


def assert_one_line(words: tuple[str, ...], proc: subprocess.CompletedProcess[str]) -> str | None:
    """The failure of one command, or None when it failed the one-line way."""
    said = f"contextful {' '.join(words)}: exit {proc.returncode}, stderr:\n{proc.stderr}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if proc.returncode == 0:
        return f"{said}\n(it did not fail)"
    if "Traceback" in proc.stderr + proc.stdout or len(lines) != 1 or not lines[0].startswith("error: "):
        return said
    if proc.returncode not in (*EXIT_CODES.values(), EXIT_INTERNAL):
        return f"{said}\n(exit code outside the documented scheme)"
    trace = TRACE.search(lines[0])
    if proc.returncode == EXIT_INTERNAL:
        if trace is None:
            return f"{said}\n(an internal error names no log file)"
        log = Path(trace["path"])
        if not log.is_file() or "Traceback (most recent call last)" not in log.read_text():
            return f"{said}\n(the log file {log} holds no traceback)"
    return None


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def project(healthy: Path, tmp_path: Path) -> Path:
    """A copy of the healthy project, for one test to break."""
    return Path(shutil.copytree(healthy, tmp_path / "project"))


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_every_command_fails_in_one_line(project: Path, taken_port: int, breakage: str) -> None:
    root = project
    break_it, failing = BREAKAGES[breakage]
    calls = {words: args_for(words, root, taken_port) for words in failing}
    break_it(root)
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = dict(zip(calls, pool.map(lambda item: contextful(root, *item[0], *item[1], check=False),
                                         calls.items())))
    failures = [f for words, proc in procs.items() if (f := assert_one_line(words, proc)) is not None]
    assert not failures, "\n\n".join(failures)


def test_the_command_tree_is_walked_to_its_leaves(healthy: Path) -> None:
    assert {("sql",), ("table", "load"), ("pipeline", "serve"), ("export", "key", "revoke")} <= set(COMMANDS)
    for words in COMMANDS:  # every command can be called: one with arguments has them in args_for
        args_for(words, healthy, 0)


def test_serve_on_a_taken_port_fails_in_one_line(project: Path, taken_port: int) -> None:
    proc = contextful(project, "pipeline", "serve", "--http", f"127.0.0.1:{taken_port}", check=False)
    assert assert_one_line(("pipeline", "serve"), proc) is None
    assert proc.returncode == EXIT_CODES["transient"] and "error: AddressInUse: --http 127.0.0.1:" in proc.stderr
    assert "Address already in use" in proc.stderr


def test_an_internal_error_masks_its_line_and_its_log(project: Path) -> None:
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    root = project
    (root / ".contextful" / "store" / "store.json").write_text("{" + secret)
    proc = contextful(root, "table", "list", check=False)
    assert assert_one_line(("table", "list"), proc) is None
    trace = TRACE.search(proc.stderr.strip())
    assert trace is not None and Path(trace["path"]).parent == root / ".contextful" / "logs"
    assert secret not in proc.stderr and secret not in Path(trace["path"]).read_text()


def test_a_catalogue_error_with_a_multi_line_message_is_one_line(project: Path) -> None:
    proc = contextful(project, "sql", "SELECT kind,\n       nope\nFROM events", check=False)
    assert proc.returncode == EXIT_CODES["spec-invalid"] and assert_one_line(("sql",), proc) is None
    assert proc.stderr.strip().endswith("(in: SELECT kind, nope FROM events)")
    assert not (project / ".contextful" / "logs").exists()  # an expected error writes no log


def test_debug_prints_the_trace_instead_of_a_log(project: Path) -> None:
    root = project
    (root / ".contextful" / "store" / "store.json").write_text("{not json")
    proc = contextful(root, "--debug", "table", "list", check=False)
    assert proc.returncode == EXIT_INTERNAL
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("error: JSONDecodeError: ")
    assert not (root / ".contextful" / "logs").exists()


def test_outside_a_project_the_log_goes_to_the_state_dir(tmp_path: Path) -> None:
    store = tmp_path / "store"
    Store.open(str(store)).close()  # a store, then damaged: reading it fails outside the catalogue
    (store / "store.json").write_text("{not json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    proc = subprocess.run([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "--store", str(store),
                           "table", "list"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert assert_one_line(("table", "list"), proc) is None
    trace = TRACE.search(proc.stderr.strip())
    assert trace is not None and Path(trace["path"]).parent == tmp_path / "state" / "contextful" / "logs"


def test_an_interrupt_is_one_line_and_exit_130(project: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "slow.csv"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "table", "load",
                              "slow", str(fifo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        with open(fifo, "w") as writer:  # returns once the load has opened the file: it is mid-command
            writer.write("id\n1\n")
            writer.flush()
            child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=300)
    finally:
        child.kill()
    assert child.returncode == EXIT_INTERRUPTED, err
    assert [line for line in err.splitlines() if line.strip()] == ["error: KeyboardInterrupt: interrupted"]


def test_a_reader_that_leaves_the_pipe_is_no_error(project: Path) -> None:
    """``contextful sql … | head -1``: the reader closes stdout early; the command ends quietly with
    the shell's SIGPIPE status, no error line, no log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    # --json prints every row (megabytes): far more than a pipe buffer holds, so the command is
    # still writing when the reader leaves, however the two processes are scheduled.
    child = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "--json", "sql",
                              "SELECT range AS n, repeat('x', 200) AS pad FROM range(200000)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.readline()
    child.stdout.close()  # the reader leaves while the command still writes
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == EXIT_BROKEN_PIPE, err
    assert err == ""
    assert not (project / ".contextful" / "logs").exists() or not any((project / ".contextful" / "logs").iterdir())


def test_an_answer_that_cannot_be_written_whole_is_an_error(project: Path) -> None:
    """A large ``--json`` answer to a full device fails loudly; it never ends 0 with the answer cut."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    with open(os.devnull if not Path("/dev/full").exists() else "/dev/full", "w") as full:
        if full.name == os.devnull:
            pytest.skip("no /dev/full on this system")
        child = subprocess.run([sys.executable, "-m", "contextful.engine.cli", "--project", str(project), "--json", "sql",
                                "SELECT range AS n, repeat('x', 200) AS pad FROM range(20000)"],
                               stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=300, check=False)
    assert child.returncode != 0
    assert "No space left on device" in child.stderr
