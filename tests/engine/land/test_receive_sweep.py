"""A receive queue's sweep deletes only what a provably dead writer left, with real processes.

The queue may sit on a volume shared by containers with one hostname and separate PID namespaces:
a pid that does not exist here says nothing about a writer there, and a pid that exists here may
belong to an unrelated process that reused it. Leftover names (a member's Arrow file with no
sidecar, a ``.tmp-`` sidecar, a request body) are written here in the on-disk format docs/receive.md
documents, for writers forged from this process's own identity; real writers are child processes
that write through the queue's own naming and exit when their stdin closes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.land.receive.spool import Member, Queue, key_digest
from contextful.storage.holders import Holder

from tests.engine.land.test_receive import PIPELINE, _env
from tests.support.holders import gone_pid, here

# A writer that leaves one unfinished member (its Arrow file, no sidecar), a half-renamed sidecar and
# a request body, prints its holder id and the names, then waits until its stdin closes.
LEAVE_AND_WAIT = """
import json, sys
from contextful.engine.land.receive.spool import Queue
from contextful.storage.holders import default_holder
queue = Queue(sys.argv[1], sys.argv[2])
arrow = queue.dir / f"{queue.member_id()}.clicks.arrow"
tmp = queue.dir / f".tmp-{queue.member_id()}.json"
body = queue.body_path(".gzip")
for path in (arrow, tmp, body):
    path.write_bytes(b"half")
print(json.dumps({"holder": default_holder(), "files": [str(arrow), str(tmp), str(body)]}), flush=True)
sys.stdin.read()
"""


def token(writer: Holder) -> str:
    """A writer as queue file names carry it (docs/receive.md): the older form is the pid alone."""
    if not writer.identified:
        return str(writer.pid)
    return f"{writer.pid}_{writer.start_ticks}_{writer.pid_ns}_{writer.boot_id}"


def leave(queue: Queue, writer: Holder) -> list[Path]:
    """What ``writer`` left when it was killed mid-batch: an Arrow file of a member with no sidecar,
    a sidecar not yet renamed, a request body."""
    def member() -> str:
        return f"{time.time_ns():020d}-{token(writer)}-{uuid.uuid4().hex[:8]}"
    files = [queue.dir / f"{member()}.clicks.arrow", queue.dir / f".tmp-{member()}.json",
             queue.incoming / f"{token(writer)}-{uuid.uuid4().hex}.body"]
    for path in files:
        path.write_bytes(b"half")
    return files


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    queue = Queue(tmp_path / "queue", PIPELINE)
    yield queue
    queue.close()


class Writer:
    """A real writer process of this namespace, alive until :meth:`exit`."""

    def __init__(self, queue: Queue) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LEAVE_AND_WAIT, str(queue.dir.parent), queue.pipeline],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(), text=True)
        assert self.proc.stdout is not None
        said = json.loads(self.proc.stdout.readline())  # waits on the pipe for the files to be written
        holder = Holder.parse(said["holder"])
        assert holder is not None and holder.identified and holder.pid == self.proc.pid
        self.holder: Holder = holder
        self.files = [Path(p) for p in said["files"]]

    def exit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


@pytest.mark.parametrize("elsewhere", [{"pid_ns": 1}, {"boot_id": "00000000-0000-0000-0000-000000000000"}],
                         ids=["another PID namespace", "another boot"])
def test_leftovers_of_a_writer_of_another_namespace_or_boot_on_this_hostname_are_kept(
        queue: Queue, elsewhere: dict[str, object], caplog: pytest.LogCaptureFixture) -> None:
    # Another container sharing the volume: its live receiver's pid does not exist here.
    forged = dataclasses.replace(here(), pid=gone_pid(), **elsewhere)  # type: ignore[arg-type]
    assert forged.host == socket.gethostname()
    files = leave(queue, forged)
    with caplog.at_level(logging.WARNING, logger="contextful.engine.land.receive.spool"):
        assert queue.sweep() == 0
    assert all(path.exists() for path in files)
    [record] = caplog.records  # kept, and told: an operator learns what the sweep could not decide
    assert "3 leftover file(s) kept" in record.getMessage()


def test_leftovers_in_the_older_pid_only_form_are_kept_and_logged(queue: Queue,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # Written before names carried the identity: a pid that is gone here proves nothing either.
    files = leave(queue, Holder(socket.gethostname(), gone_pid(), ""))
    with caplog.at_level(logging.WARNING, logger="contextful.engine.land.receive.spool"):
        assert queue.sweep() == 0
    assert all(path.exists() for path in files)
    [record] = caplog.records
    assert "3 leftover file(s) kept" in record.getMessage()
    assert all(str(path.relative_to(queue.dir)) in record.getMessage() for path in files)


def test_a_live_writers_files_are_kept_and_swept_once_it_exited(queue: Queue, caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer(queue)
    try:
        own = leave(queue, here())  # the sweeper's own files, mid-batch, are a live writer's too
        with caplog.at_level(logging.WARNING, logger="contextful.engine.land.receive.spool"):
            assert queue.sweep() == 0
        assert caplog.records == []  # live writers of this namespace are no news
        assert all(path.exists() for path in [*writer.files, *own])
    finally:
        writer.exit()
    assert queue.sweep() == 3
    assert not any(path.exists() for path in writer.files)
    assert all(path.exists() for path in own)


def test_leftovers_of_a_pid_reused_by_a_live_process_are_swept(queue: Queue) -> None:
    live = Writer(queue)
    try:
        # The writer that had this pid before started at another time: it is dead, the pid is not.
        earlier = dataclasses.replace(live.holder, start_ticks=live.holder.start_ticks - 1)  # type: ignore[operator]
        files = leave(queue, earlier)
        assert queue.sweep() == 3
        assert not any(path.exists() for path in files)
        assert all(path.exists() for path in live.files)  # the live process's own files stay
    finally:
        live.exit()


def test_a_members_sidecar_names_its_writers_full_identity(queue: Queue) -> None:
    member = queue.spool("k1", key_digest(PIPELINE, "k1"), {PIPELINE: pa.table({"i": [1]})}, received_us=1,
                         body_bytes=0, body_sha256="")
    holder = Holder.parse(member.holder)
    assert holder is not None and dataclasses.replace(holder, suffix="") == dataclasses.replace(here(), suffix="")
    [read] = queue.members()
    assert read.holder == member.holder
    # a sidecar an older version wrote (host and pid) still reads, as an id never proven dead
    doc = {**member.to_json(), "holder": {"host": "db-1", "pid": 4242}}
    older = Member.from_json(doc)
    assert older.holder == "db-1:4242:" and Holder.parse(older.holder) == Holder("db-1", 4242, "")
