"""Holders the liveness tests need: this process's identity, and the pid of a process that is gone."""

from __future__ import annotations

import os
import subprocess

from contextful.storage.holders import Holder, default_holder


def here() -> Holder:
    """This process as a holder, with its full identity (boot, PID namespace, start time)."""
    holder = Holder.parse(default_holder())
    assert holder is not None and holder.identified, "this machine's /proc names this process"
    return holder


def gone_pid() -> int:
    """The pid of a child that ran, exited and was reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    assert not os.path.exists(f"/proc/{child.pid}")
    return child.pid
