"""The CLI's one error boundary: whatever a command lets escape reaches the terminal as one line.

``error: <ErrorName>: <message>`` on stderr, masked by the secret guard (``engine.guard.mask_message``),
and an exit code from one scheme (docs/cli.md):

- a catalogue error (``storage.errors.ContextfulError``): its category's code, the message on one line;
- anything else: ``EXIT_INTERNAL`` (70, ``EX_SOFTWARE``), the first line of its message, and the full
  trace (masked too) in a log file the line names: ``<project>/.contextful/logs/`` inside a project,
  ``$XDG_STATE_HOME/contextful/logs/`` (default ``~/.local/state``) outside one;
- ``KeyboardInterrupt``: ``EXIT_INTERRUPTED`` (130).

``--debug`` prints the masked trace on stderr before the line instead of writing a log file.
Click's own exits (usage mistakes, ``ctx.exit``) pass through untouched.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.errors import ContextfulError

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, as a shell reports a pipeline stage whose reader left."""
LOG_DIR = (".contextful", "logs")


@contextmanager
def one_line_errors(options: Mapping[str, Any]) -> Iterator[None]:
    """Run a command's body; turn any error escaping it into one stderr line and an exit code.

    ``options`` (the command's ``ctx.obj``) is read when an error arrives, so ``--debug`` and
    ``--project`` count wherever on the command line they were given.
    """
    from contextful.storage.errors import ContextfulError

    try:
        yield
    except (click.exceptions.Exit, click.ClickException, click.Abort):
        raise
    except ContextfulError as exc:
        raise click.exceptions.Exit(_report(exc, exc.name, _one_line(exc.detail), None, bool(options.get("debug")),
                                            exc.exit_code)) from None
    except KeyboardInterrupt as exc:
        raise click.exceptions.Exit(_report(exc, "KeyboardInterrupt", "interrupted", None, bool(options.get("debug")),
                                            EXIT_INTERRUPTED)) from None
    except BrokenPipeError:
        # The reader of stdout went away (`contextful sql ... | head`): nothing to report to anyone.
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
    except Exception as exc:  # noqa: BLE001 - the boundary: whatever escapes a command is reported here
        from contextful.storage.errors import first_line

        raise click.exceptions.Exit(_report(exc, type(exc).__name__, first_line(exc), str(options.get("project") or "."),
                                            bool(options.get("debug")), EXIT_INTERNAL)) from None


def error_line(exc: ContextfulError) -> str:
    """The masked one-line report of a catalogue error a command goes on past (one of several failures)."""
    return _masked(f"error: {exc.name}: {_one_line(exc.detail)}")


def _report(exc: BaseException, name: str, message: str, log_project: str | None, debug: bool, code: int) -> int:
    """Print the one line (after the trace when ``debug``); write the log when ``log_project`` is given."""
    trace = "".join(traceback.format_exception(exc))
    line = f"error: {name}: {message}"
    if debug:
        click.echo(_masked(trace).rstrip("\n"), err=True)
    elif log_project is not None:
        line += f" ({_write_log(log_project, trace)})"
    click.echo(_masked(line), err=True)
    return code


def _one_line(text: str) -> str:
    """A catalogue message on one line: its line breaks (a quoted query's, say) become spaces."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _masked(text: str) -> str:
    from contextful.engine.guard import mask_message

    return mask_message(text)


def _write_log(project_dir: str, trace: str) -> str:
    """Write the masked trace to the first log directory that takes it; say where (or why nowhere)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    text = f"{stamp} contextful {' '.join(sys.argv[1:])}\n\n{_masked(trace)}"
    failure: OSError | None = None
    for directory in _log_dirs(project_dir):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"{stamp}-{os.getpid()}.log"
            path.write_text(text, encoding="utf-8")
            return f"full trace in {path}"
        except OSError as exc:
            failure = exc
    return f"no trace written: {failure}"


def _log_dirs(project_dir: str) -> list[Path]:
    """The project's log directory (inside a project), then the user's state directory, then the temp dir."""
    from contextful.engine.project import find_project

    found = find_project(project_dir) if Path(project_dir).is_dir() else None
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "contextful" / "logs"
    inside = [found.joinpath(*LOG_DIR)] if found is not None else []
    return [*inside, state, Path(tempfile.gettempdir()) / "contextful-logs"]


def report_problems(ctx: click.Context, problems: list[ContextfulError], exit_code: int) -> NoReturn:
    """A validation's problems, each on its own ``error:`` line (``--json``: ``{"ok": false,
    "problems": [...]}``), then exit with ``exit_code``."""
    from contextful.engine.cli.output import emit_json

    if ctx.obj["json"]:
        emit_json({"ok": False, "problems": [{"error": p.name, "detail": _masked(p.detail)} for p in problems]})
    else:
        for problem in problems:
            click.echo(error_line(problem), err=True)
    ctx.exit(exit_code)


def validated_or_reported(ctx: click.Context) -> Manifest:
    """The working manifest after every check ``pipeline validate`` runs (the engine's validation,
    then each pipeline's and job's schedule read by the grammar); with problems, every one is
    reported (:func:`report_problems`) and the command exits. ``pipeline validate`` and ``job
    validate`` both read it."""
    from contextful.engine.config.validate import validated_manifest
    from contextful.engine.control.arm import schedule_problems
    from contextful.engine.project import locate_project, read_manifest_document
    from contextful.storage.errors import ManifestInvalid

    root = locate_project(ctx.obj["project"])
    unreadable = schedule_problems(read_manifest_document(root))  # each a problem of its entry alone
    try:
        manifest = validated_manifest(root, store=ctx.obj["store"], machine=ctx.obj.get("machine"))
        if schedules := unreadable + schedule_problems({}, manifest):
            raise ManifestInvalid(str(root / "contextful.toml"), list(schedules))
    except ManifestInvalid as exc:
        report_problems(ctx, list(exc.problems) + [p for p in unreadable if p not in exc.problems], exc.exit_code)
    return manifest

