"""Who holds a lease: ``host:pid:suffix`` ids, and whether such a holder is provably dead.

Journal owners (``engine.run.execution``) and staging runs (``storage.transaction``) name their
holder this way, so a process of this host that died (SIGKILL, a crash) is recognised at once
instead of after its lease lapses.
"""

from __future__ import annotations

import os
import socket
import uuid


def default_holder() -> str:
    """A holder id unique to one handle: host, process and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_dead(holder: str | None) -> bool:
    """Whether ``holder`` (``host:pid:suffix``) names a process of this host that no longer runs.

    Only a provably dead holder counts: another host's, or a pid that answers, is alive; no holder
    at all is not a dead one.
    """
    if holder is None:
        return False
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
