"""A lease's holder is dead only when that is proven, with real processes of this machine.

Holder ids of other namespaces and boots are forged from this process's own id: a pid that does not
exist here says nothing about a process in another PID namespace (two containers with one
hostname sharing a catalog), so such a holder is alive as far as anyone can tell. A holder of this
namespace is dead when its pid is gone, or when its pid now runs a process that started at another
time (the pid was reused).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

import pytest
from contextful.storage.holders import Holder, holder_is_dead

from tests.support.holders import gone_pid, here


def start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read here independently of the module under test."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def test_this_process_is_alive_and_its_id_names_host_pid_boot_namespace_and_start() -> None:
    holder = here()
    assert (holder.host, holder.pid, holder.start_ticks) == (socket.gethostname(), os.getpid(), start_ticks(os.getpid()))
    with open("/proc/sys/kernel/random/boot_id") as f:
        assert holder.boot_id == f.read().strip()
    assert f"pid:[{holder.pid_ns}]" == os.readlink("/proc/self/ns/pid")
    assert str(holder).startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert not holder_is_dead(str(holder))
    assert not holder_is_dead(None)


@pytest.mark.parametrize("elsewhere", [{"pid_ns": 1}, {"boot_id": "00000000-0000-0000-0000-000000000000"}],
                         ids=["another PID namespace", "another boot"])
def test_a_holder_of_another_namespace_or_boot_on_this_hostname_is_not_dead(elsewhere: dict[str, object]) -> None:
    # Its pid means nothing here: that no process of this namespace has it proves nothing.
    forged = dataclasses.replace(here(), pid=gone_pid(), **elsewhere)  # type: ignore[arg-type]
    assert forged.host == socket.gethostname()
    assert not holder_is_dead(str(forged))


def test_an_id_without_identity_is_read_and_never_proven_dead() -> None:
    old = f"{socket.gethostname()}:{gone_pid()}:0a1b2c3d"  # as ids were stored before they named a namespace
    parsed = Holder.parse(old)
    assert parsed is not None and not parsed.identified and str(parsed) == old
    assert not holder_is_dead(old)
    assert not holder_is_dead("worker A") and Holder.parse("worker A") is None


def test_a_holder_of_this_namespace_whose_pid_is_gone_is_dead() -> None:
    assert holder_is_dead(str(dataclasses.replace(here(), pid=gone_pid())))


def test_a_holder_whose_pid_now_runs_a_process_started_at_another_time_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = start_ticks(child.pid)
        running = dataclasses.replace(here(), pid=child.pid, start_ticks=started)
        assert not holder_is_dead(str(running))  # the process that holds it still runs
        reused = dataclasses.replace(running, start_ticks=started - 1)  # an earlier process of that pid
        assert holder_is_dead(str(reused))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
