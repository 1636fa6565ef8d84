"""Engine children: one unit's chain of steps, each an argv child under bounds.

Implements decision "derive-engine-machine" (a derive engine is a machine-bound argv child with a
cleared environment; row data never becomes syntax): clauses ``run.exec.no-shell``,
``run.exec.non-zero-exit``, ``run.exec.deadline-elapsed``, ``run.exec.output-cap``,
``run.exec.silent-step``, ``run.bind.remote-url-unsupported`` and ``run.bind.media-unreadable``.

A unit's chain (:func:`run_chain`) is its binding's preprocess steps that apply to the media
(``always`` steps; ``media_is_url`` steps too when the media is an http(s) address), then the
engine step (driver ``exec``). Each step:

- runs its argument array, never a shell: ``{input}``, ``{output}`` and ``{media}`` are replaced
  inside each element in one pass, so a media value holding ``;``, ``$(...)`` or ``{output}`` is
  one argument's text, verbatim;
- runs in a process group of its own (``start_new_session``), stdin ``/dev/null``, in the unit's
  work directory, under exactly the binding's ``env`` (nothing inherited). A program named without
  a ``/`` is looked up on the binding's ``PATH`` when its env gives one, else on this process's
  ``PATH``; the child's environment gets no ``PATH`` the binding does not give;
- is watched through one ``poll`` over its stdout, its stderr and its pidfd (the exit), waking on
  output and exit, with the chain's one deadline as the poll's timeout (the cancel event, which
  has no file descriptor, is looked at every ``CANCEL_CHECK_S`` when one is given).

Bounds. stdout is read in chunks and counted; only the engine step's first ``output_cap_bytes``
are kept. Past the cap the step's group is killed and its pipes drained, discarding, until it
exits: ``DeriveOutputCap`` with the count (driver ``none``: the last step's file is held to the
same cap). stderr keeps its last ``STDERR_TAIL`` bytes, the text ``DeriveStepExit`` carries. Past the chain's deadline the running step's group is killed:
``DeriveStepTimeout`` naming it. When a step's leader exits its group is killed (the leader not
yet reaped, so the group id cannot have been reused): no grandchild outlives its step, and the
pipes are read until empty rather than until EOF, so a grandchild that left the group holding a
pipe never holds the chain up.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from contextful.engine.derive.bind import PLACEHOLDER, Binding, Step
from contextful.storage.errors import (
    DeriveMediaUnreadable,
    DeriveOutputCap,
    DeriveRemoteUrlUnsupported,
    DeriveStepExit,
    DeriveStepProducedNothing,
    DeriveStepTimeout,
)

STDERR_TAIL = 4096
"""Bytes of a step's stderr kept for ``DeriveStepExit``: the last ones, where the error usually is."""
CANCEL_CHECK_S = 0.05
"""How often a running step looks at the cancel event (it has no file descriptor to poll)."""
CHUNK = 65536
_POLL_MAX_MS = 2**31 - 1
_FINAL_DRAIN = 1 << 20
"""Bytes read from a pipe after its step's leader exited: the most a pipe buffers (Linux's default
pipe-max-size), so what the leader left is all read and a leaked writer's stream is not followed."""


@dataclass(frozen=True)
class ChainOutput:
    """What a unit's chain produced."""

    output: bytes
    """Driver ``exec``: the engine step's stdout; driver ``none``: the last step's output file."""
    steps: tuple[str, ...]
    """The steps that ran, in order."""


def run_chain(binding: Binding, unit: str, media: str, workdir: Path,
              cancel: threading.Event | None = None, project: Path | None = None) -> ChainOutput:
    """Run ``unit``'s chain over ``media`` (an http(s) address or an absolute local path) in
    ``workdir``; ``InterruptedError`` once ``cancel`` is set (the running step killed).
    ``project`` is what ``{project}`` names (default: the working directory)."""
    if binding.driver not in ("exec", "none"):
        raise ValueError(f"engine {binding.engine!r}: driver {binding.driver!r} runs no child processes")
    is_url = media[:8].lower().startswith(("http://", "https://"))
    steps = [s for s in binding.preprocess if s.when == "always" or (is_url and s.when == "media_is_url")]
    if is_url and not binding.remote and not any(s.when == "media_is_url" for s in steps):
        raise DeriveRemoteUrlUnsupported(binding.engine, media)
    if not is_url:
        _check_readable(unit, media)
    if binding.driver == "exec":
        steps.append(Step("engine", binding.command))
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + binding.deadline_s
    current = media
    output = b""
    for step in steps:
        target = str(workdir / step.output) if step.output is not None else ""
        argv = substitute(step.argv, {"input": current, "output": target, "media": media, "python": sys.executable,
                                      "project": str(project or Path.cwd())})
        if step.output is None:
            output = _run_step(binding, step.name, argv, workdir, deadline, cancel, keep=True)
            continue
        Path(target).unlink(missing_ok=True)  # a resumed unit's leftover is not this step's output
        _run_step(binding, step.name, argv, workdir, deadline, cancel, keep=False)
        try:
            produced = os.stat(target).st_size > 0
        except FileNotFoundError:
            produced = False
        if not produced:
            raise DeriveStepProducedNothing(step.name, target)
        current = target
    if binding.driver == "none":
        output = _read_output(steps[-1].name, Path(current), binding.output_cap_bytes)
    return ChainOutput(output, tuple(s.name for s in steps))


def substitute(argv: tuple[str, ...], values: Mapping[str, str]) -> list[str]:
    """``argv`` with each placeholder replaced by its value in one pass: a value is text, never
    searched again, so a media path holding ``{output}`` or ``$(...)`` arrives verbatim.

    >>> substitute(("tool", "--in={input}", "{output}"), {"input": "a {output} b", "output": "/w/o", "media": "",
    ...                                                 "python": "/usr/bin/python3", "project": "/p"})
    ['tool', '--in=a {output} b', '/w/o']
    """
    return [PLACEHOLDER.sub(lambda m: values[m.group(1)], arg) for arg in argv]


def _read_output(step: str, path: Path, cap: int) -> bytes:
    """Driver ``none``: the last step's file is the output, under the same bound as an engine's stdout."""
    with path.open("rb") as fh:
        data = fh.read(cap + 1)
        if len(data) > cap:
            raise DeriveOutputCap(step, os.fstat(fh.fileno()).st_size, cap)
    return data


def _check_readable(unit: str, media: str) -> None:
    """``run.bind.media-unreadable``: a local media value must be an absolute path to a readable file."""
    if not os.path.isabs(media):
        raise DeriveMediaUnreadable(unit, media, "not an http(s) address and not an absolute path")
    try:
        fd = os.open(media, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DeriveMediaUnreadable(unit, media, exc.strerror or type(exc).__name__) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DeriveMediaUnreadable(unit, media, "not a regular file")
    finally:
        os.close(fd)


def _program(argv0: str, env: Mapping[str, str]) -> str | None:
    """The file ``argv0`` names: itself when it holds a ``/``, else found on the binding's ``PATH``
    (or, when the binding gives none, on this process's)."""
    if "/" in argv0:
        return argv0
    return shutil.which(argv0, path=env.get("PATH", os.environ.get("PATH", os.defpath)))


def _run_step(binding: Binding, step: str, argv: list[str], workdir: Path, deadline: float,
              cancel: threading.Event | None, keep: bool) -> bytes:
    """One step to its end: its stdout (kept only when ``keep``, up to the cap) or the step's error."""
    program = _program(argv[0], binding.env)
    if program is None:
        where = "the binding's env" if "PATH" in binding.env else "this machine's"
        raise DeriveStepExit(step, 127, f"{argv[0]}: no such program on the PATH of {where}")
    try:
        child = subprocess.Popen(argv, executable=program, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, cwd=workdir, env=dict(binding.env), start_new_session=True)
    except OSError as exc:
        raise DeriveStepExit(step, 126 if exc.errno == errno.EACCES else 127, f"{argv[0]}: {exc.strerror}") from exc
    watch = _Watch(child, binding.output_cap_bytes, keep)
    try:
        ended = watch.until_exit(deadline, cancel)
    finally:
        watch.close()
    if ended == "deadline":
        raise DeriveStepTimeout(step, binding.deadline_s)
    if ended == "cancel":
        raise InterruptedError(f"derive step {step} was canceled")
    if watch.count > binding.output_cap_bytes:
        raise DeriveOutputCap(step, watch.count, binding.output_cap_bytes)
    code = child.returncode
    if code != 0:
        raise DeriveStepExit(step, code, bytes(watch.stderr).decode("utf-8", "replace").strip())
    return bytes(watch.stdout)


class _Watch:
    """One running step's pipes and exit, read through one ``poll``."""

    def __init__(self, child: subprocess.Popen[bytes], cap: int, keep: bool) -> None:
        assert child.stdout is not None and child.stderr is not None
        self.child = child
        self.cap = cap
        self.keep = keep
        self.count = 0
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.out = child.stdout.fileno()
        self.err = child.stderr.fileno()
        self.pidfd = os.pidfd_open(child.pid)
        self.killed = False
        for fd in (self.out, self.err):
            os.set_blocking(fd, False)

    def until_exit(self, deadline: float, cancel: threading.Event | None) -> str:
        """Read until the leader exits (``"exit"``), the deadline passes (``"deadline"``) or
        ``cancel`` is set (``"cancel"``); the group is killed and the leader reaped in every case."""
        poller = select.poll()
        open_fds = {self.out, self.err}
        for fd in (self.out, self.err, self.pidfd):
            poller.register(fd, select.POLLIN)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return self._stop("deadline")
            if cancel is not None and cancel.is_set():
                return self._stop("cancel")
            wait = min(left, CANCEL_CHECK_S) if cancel is not None else left
            for fd, _event in poller.poll(min(wait * 1000, _POLL_MAX_MS)):
                if fd == self.pidfd:
                    self._stop("exit")
                    for pipe in sorted(open_fds):  # what the leader left behind; a leaked writer is not waited on
                        self._drain(pipe)
                    return "exit"
                if self._read(fd) == 0:
                    poller.unregister(fd)
                    open_fds.discard(fd)

    def _read(self, fd: int) -> int:
        """One chunk from ``fd``: its length, 0 at EOF, -1 when the pipe is empty for now."""
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return -1
        if fd == self.out:
            if self.keep and self.count < self.cap:
                self.stdout += chunk[:self.cap - self.count]
            self.count += len(chunk)
            if self.count > self.cap and not self.killed:
                self._kill()  # the leader is not reaped yet: the group id is still its own
        else:
            self.stderr += chunk
            del self.stderr[:-STDERR_TAIL]
        return len(chunk)

    def _drain(self, fd: int) -> None:
        """Read what the exited leader left in ``fd``: until it is empty or at EOF, at most
        ``_FINAL_DRAIN`` bytes (a pipe holds no more), stdout no further than past its cap."""
        taken = 0
        while taken < _FINAL_DRAIN and not (fd == self.out and self.count > self.cap):
            n = self._read(fd)
            if n <= 0:
                return
            taken += n

    def _kill(self) -> None:
        self.killed = True
        try:
            os.killpg(self.child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _stop(self, why: str) -> str:
        """Kill the step's group (the leader, exited or not, still holds its id) and reap the leader."""
        self._kill()
        self.child.wait()
        return why

    def close(self) -> None:
        if self.child.returncode is None:  # left by an exception (an interrupt): the group goes with it
            self._stop("abandoned")
        os.close(self.pidfd)
        assert self.child.stdout is not None and self.child.stderr is not None
        self.child.stdout.close()
        self.child.stderr.close()
