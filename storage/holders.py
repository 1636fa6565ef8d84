"""Who holds a lease, and whether that holder is provably dead.

Journal owners (``engine.run.execution``) and staging runs (``storage.staging``) name their holder
with :func:`default_holder`, so a takeover (``open_execution(..., take_over_dead=True)``), a rewind
and collection can recognise a holder that died (SIGKILL, a crash) at once instead of after its
lease lapses. A receive queue's files name their writer with the same identity
(``engine.land.receive.spool``), so its sweep deletes only what a provably dead writer left.

A hostname and a pid do not identify a process: two containers with one hostname and separate PID
namespaces, sharing a catalog, each see the other's pid as missing. A holder id therefore names the
process by where its pid means something and when it started::

    host:pid:suffix;boot=<boot id>;pidns=<PID-namespace inode>;start=<start time in clock ticks>

The boot id (``/proc/sys/kernel/random/boot_id``) names one boot of one kernel, the PID namespace's
inode (``/proc/self/ns/pid``) one namespace during that boot, and the start time (field 22 of
``/proc/<pid>/stat``) one process of that pid. A holder is dead only when that is proven: same boot
and same PID namespace as the process asking, and its pid is gone or runs a process started at
another time (the pid was reused). Everything else is alive as far as anyone can tell — another
host, namespace or boot, ``/proc`` unreadable or of another namespace, an id in the older
``host:pid:suffix`` form (still stored in catalogs and journals: it is read, never proven dead) —
and its lease is waited out.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import uuid
from dataclasses import dataclass

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_NAMESPACE = re.compile(r"pid:\[(\d+)\]")


@dataclass(frozen=True)
class Holder:
    """A holder id's parts. ``boot_id``, ``pid_ns`` and ``start_ticks`` are None in an id of the
    older form, or of a process that could not read its own identity from ``/proc``."""

    host: str
    pid: int
    suffix: str
    boot_id: str | None = None
    """The kernel's boot id when the holder was made."""
    pid_ns: int | None = None
    """The inode of the holder's PID namespace (what its ``pid`` means)."""
    start_ticks: int | None = None
    """When the process started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``)."""

    @property
    def identified(self) -> bool:
        return self.boot_id is not None and self.pid_ns is not None and self.start_ticks is not None

    def __str__(self) -> str:
        text = f"{self.host}:{self.pid}:{self.suffix}"
        if self.identified:
            text += f";boot={self.boot_id};pidns={self.pid_ns};start={self.start_ticks}"
        return text

    def provably_dead(self) -> bool:
        """Whether this process is provably dead: of this boot and PID namespace, and its pid is gone
        or was reused by a process started at another time. A holder of another host, namespace or
        boot, one without that identity, or ``/proc`` unreadable: not dead."""
        if not self.identified or _namespace() != (self.boot_id, self.pid_ns):
            return False
        started = _start_ticks(self.pid)
        if started is not None:
            return started != self.start_ticks
        try:  # no stat entry: the pid is gone, or hidden from us (``hidepid``)
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The parts of ``text`` (either form), or None when it is no holder id of ours (a name a
        host or a test chose).

        >>> Holder.parse("db-1:4242:0a1b2c3d;boot=8591c925-af75-48ba-b443-808ac9b6e891;pidns=4026531836;start=41055")
        Holder(host='db-1', pid=4242, suffix='0a1b2c3d', boot_id='8591c925-af75-48ba-b443-808ac9b6e891', pid_ns=4026531836, start_ticks=41055)
        >>> Holder.parse("db-1:4242:0a1b2c3d").identified, Holder.parse("worker A")
        (False, None)
        """
        head, _, tail = text.partition(";")
        parts = head.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) <= 0:
            return None
        holder = cls(parts[0], int(parts[1]), parts[2])
        if not tail:
            return holder
        fields = dict(field.partition("=")[::2] for field in tail.split(";"))
        if set(fields) != {"boot", "pidns", "start"} or not (fields["pidns"].isdigit() and fields["start"].isdigit()):
            return None
        return dataclasses.replace(holder, boot_id=fields["boot"], pid_ns=int(fields["pidns"]),
                                   start_ticks=int(fields["start"]))


def default_holder() -> str:
    """A holder id unique to one handle: this host, process and namespace, and a random suffix
    (the older ``host:pid:suffix`` form where ``/proc`` cannot say more: never provably dead)."""
    pid = os.getpid()
    holder = Holder(socket.gethostname(), pid, uuid.uuid4().hex[:8])
    identity = _identity(pid)
    if identity is None:
        return str(holder)
    return str(dataclasses.replace(holder, boot_id=identity[0], pid_ns=identity[1], start_ticks=identity[2]))


_identities: dict[int, tuple[str, int, int]] = {}


def _identity(pid: int) -> tuple[str, int, int] | None:
    """This process's (boot id, PID-namespace inode, start ticks), read from ``/proc`` once per pid
    (a forked child has a pid of its own; none of the three changes while a process lives): every
    run's staging lease asks for it. An answer ``/proc`` could not give is asked again next time."""
    known = _identities.get(pid)
    if known is None:
        here, started = _namespace(), _start_ticks(pid)
        if here is None or started is None:
            return None
        known = _identities[pid] = (here[0], here[1], started)
    return known


def holder_is_dead(holder: str | None) -> bool:
    """Whether ``holder`` (a holder id) is provably dead; see :meth:`Holder.provably_dead`. No
    holder, or a text that is no holder id of ours: not dead (wait for the lease)."""
    parsed = Holder.parse(holder) if holder is not None else None
    return parsed is not None and parsed.provably_dead()


def _namespace() -> tuple[str, int] | None:
    """This process's (boot id, PID-namespace inode), or None when ``/proc`` cannot tell — absent,
    or mounted for another PID namespace (its ``self`` is not our pid), where its pids are not ours."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
        namespace = _NAMESPACE.fullmatch(os.readlink("/proc/self/ns/pid"))
        if not boot or namespace is None or os.readlink("/proc/self") != str(os.getpid()):
            return None
    except OSError:
        return None
    return boot, int(namespace.group(1))


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when ``/proc`` has no entry for it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces and parentheses itself
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22; the fields after the name start at field 3
    except (IndexError, ValueError):
        return None
