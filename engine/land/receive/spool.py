"""A receive pipeline's queue: spooled members, written synced, and the key index beside them.

Implements the spooling half of ``run.land.receive-spool`` (decision "received-batches-spooled"):
a batch that decoded and validated is spooled, synced, before its receiver waits for the land lock,
so a receiver that dies after spooling loses nothing — the next lock holder lands its member.

One directory per pipeline, ``<queue root>/<pipeline id>/`` (the project's
``.contextful/queue/<pipeline id>/``)::

    <member id>.<table>.arrow     the decoded, typed batch for one touched table (Arrow IPC file)
    <member id>.json              the sidecar: key, digest, received time, bytes, rows, holder id
    keys.sqlite                   the key index (WAL): first attempts, landed answers, attempts
    land.lock                     the land lock (an exclusive ``flock``)
    incoming/<writer>-<uuid>.body request bodies being decoded (``.gzip``/``.zstd`` as sent, then decoded)

A member id is ``<ns since the epoch, 20 digits>-<writer>-<hex>``, so names sort first-in
first-out and name the process that wrote them. ``<writer>`` is the writer's identity as
``storage.holders`` defines it, ``<pid>_<start ticks>_<PID-namespace inode>_<boot id>``; the
sidecar's ``holder`` is the writer's full holder id (its host too). Each file is written to a
``.tmp-`` name, fsync'ed and renamed; the Arrow files before the sidecar, then the directory is
fsync'ed. The sidecar is the member: a member exists once its sidecar is renamed. The directory and
``incoming/`` are ``0700`` and every file in them ``0600``: a batch's data is its sender's, readable
by the owner only. Removal goes the other way (Arrow files, then the sidecar), so a sidecar never
outlives a member that is not landed or failed.

:meth:`Queue.sweep` deletes what a killed writer left half-written (``.tmp-`` files, Arrow files
with no sidecar, bodies), and only when the writer its name carries is provably dead
(:meth:`Holder.provably_dead <contextful.storage.holders.Holder.provably_dead>`): of the sweeper's
boot and PID namespace, its pid gone or reused by a process started at another time. A pid alone
proves nothing when the queue is on a volume shared by containers with separate PID namespaces
(the other container's live writer has a pid missing here) or when the pid was reused (an
unrelated process keeps the dead writer's files). A name whose writer is another namespace's or
another boot's is kept for a sweeper there; a name in the older ``<pid>`` form (written before
names carried the identity, or by a writer that could not read ``/proc``) is never proven dead and
is kept, logged, for an operator to delete once no receiver of the queue is running.

Digests: a batch key's digest is the first 32 hex digits (128 bits) of the SHA-256 of
``<pipeline id> NUL <key>``. The pipeline id is part of it because two pipelines may land in one
table under the same key, and the digest names their runs and owner scopes.

The key index is a cache of what the store knows plus the one fact the store cannot know before a
batch lands: a key's first attempt. It records per key the first attempt's instant, whether the
key landed (the group, the member that landed it and the answer to replay), failed members, and
per run id stem the attempts taken. Rows are never pruned: a key past its retention keeps
answering ``ReceiveBatchKeyExpired`` rather than landing again (about 200 bytes a key).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
from contextful.engine.guard import mask_message
from contextful.storage.catalog.sqlite import BUSY_TIMEOUT_S, enable_wal
from contextful.storage.errors import ContextfulError
from contextful.storage.holders import Holder, default_holder
from pyarrow import ipc

log = logging.getLogger(__name__)

DIGEST_HEX = 32
QUEUE_DIR = (".contextful", "queue")
OPEN = "open"
LANDED = "landed"

_DDL = (
    """CREATE TABLE IF NOT EXISTS batch_keys (
        digest TEXT PRIMARY KEY, key TEXT NOT NULL, first_attempt_us INTEGER NOT NULL, state TEXT NOT NULL,
        member TEXT, grp TEXT, answer TEXT, landed_us INTEGER)""",
    "CREATE TABLE IF NOT EXISTS run_attempts (stem TEXT PRIMARY KEY, attempts INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS member_failures (
        member TEXT PRIMARY KEY, digest TEXT NOT NULL, error TEXT NOT NULL, failed_us INTEGER NOT NULL)""",
)


def queue_root(project_root: str | os.PathLike[str]) -> Path:
    """Where a project's receive queues live: ``<project>/.contextful/queue``."""
    return Path(project_root).joinpath(*QUEUE_DIR)


def key_digest(pipeline: str, key: str) -> str:
    """The digest naming a batch key's runs and owner scope (see the module docstring).

    >>> key_digest("clicks", "k1") == key_digest("clicks", "k1") != key_digest("views", "k1")
    True
    """
    return hashlib.sha256(f"{pipeline}\0{key}".encode()).hexdigest()[:DIGEST_HEX]


@dataclass(frozen=True)
class Member:
    """One spooled batch: its key and, per touched table, how many rows it holds there."""

    id: str
    pipeline: str
    key: str
    digest: str
    received_us: int
    """When its receiver spooled it (the receiver's clock)."""
    body_bytes: int
    """Bytes of the request body as it arrived."""
    body_sha256: str
    bytes: int
    """Bytes of its Arrow files: what the group's 64 MiB bound counts."""
    rows: dict[str, int]
    """Touched table -> rows the member lands there."""
    holder: str = ""
    """The holder id (``storage.holders``) of the receiver that spooled it: host, pid, boot,
    PID namespace and start time (``host:pid:`` in a sidecar an older version wrote)."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "pipeline": self.pipeline, "key": self.key, "digest": self.digest,
                "received_us": self.received_us, "body_bytes": self.body_bytes, "body_sha256": self.body_sha256,
                "bytes": self.bytes, "rows": self.rows, "holder": self.holder}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Member:
        return cls(doc["id"], doc["pipeline"], doc["key"], doc["digest"], int(doc["received_us"]),
                   int(doc["body_bytes"]), doc["body_sha256"], int(doc["bytes"]),
                   {str(k): int(v) for k, v in doc["rows"].items()}, _holder_text(doc.get("holder")))


def _holder_text(holder: Any) -> str:
    """A sidecar's holder as a holder id; an older sidecar's ``{"host", "pid"}`` as ``host:pid:``."""
    if isinstance(holder, dict):
        return f"{holder.get('host', '')}:{holder.get('pid', 0)}:"
    return str(holder or "")


@dataclass(frozen=True)
class KeyRecord:
    """What the index knows of one batch key."""

    digest: str
    key: str
    first_attempt_us: int
    state: str
    """``open`` (tried, not landed) or ``landed``."""
    member: str | None = None
    """The member whose landing landed the key."""
    group: str | None = None
    """The digest its run was keyed by: the group's, or its own when it landed alone."""
    tables: list[dict[str, Any]] = field(default_factory=list)
    """The answer to replay: per touched table its run id, commit_seq and the key's rows."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_WRITER = re.compile(r"(\d+)(?:_(\d+)_(\d+)_([0-9a-f-]+))?")
_MEMBER_NAME = re.compile(r"\d{20}-(.+)-[0-9a-f]+")
_BODY_NAME = re.compile(r"(.+)-[0-9a-f]+")
_this_writer: tuple[int, str, str] | None = None  # (pid, holder id, token): read from /proc once a process


def writer_token(holder: Holder) -> str:
    """The part of a queue file's name naming its writer: ``<pid>_<start>_<pidns>_<boot id>``, or
    ``<pid>`` alone for a holder without that identity (such a name is never provably dead).

    >>> writer_token(Holder("db-1", 4242, "0a1b2c3d", "8591c925-af75-48ba-b443-808ac9b6e891", 4026531836, 41055))
    '4242_41055_4026531836_8591c925-af75-48ba-b443-808ac9b6e891'
    >>> writer_token(Holder("db-1", 4242, "0a1b2c3d"))
    '4242'
    """
    if holder.boot_id is None or not holder.identified or not re.fullmatch(r"[0-9a-f-]+", holder.boot_id):
        return str(holder.pid)  # a boot id that is no lower-case UUID cannot be told apart in a name
    return f"{holder.pid}_{holder.start_ticks}_{holder.pid_ns}_{holder.boot_id}"


def file_writer(name: str, body: bool = False) -> Holder | None:
    """The writer a queue file's name carries (a member's file, or a body when ``body``), or None
    when the name is none a writer of ours chose. The name carries no host: a boot id names one
    machine's boot, which is all a proof of death needs.

    >>> file_writer(".tmp-00000001700000000000-4242_41055_4026531836_8591c925-af75-48ba-b443-808ac9b6e891-0a1b2c3d.json")
    Holder(host='', pid=4242, suffix='', boot_id='8591c925-af75-48ba-b443-808ac9b6e891', pid_ns=4026531836, start_ticks=41055)
    >>> file_writer("4242-0123abcd.body.gzip", body=True).identified, file_writer("notes.txt", body=True)
    (False, None)
    """
    stem = name.removeprefix(".tmp-").split(".", 1)[0]
    named = (_BODY_NAME if body else _MEMBER_NAME).fullmatch(stem)
    writer = _WRITER.fullmatch(named.group(1)) if named else None
    if writer is None or int(writer.group(1)) <= 0:
        return None
    pid, start, namespace, boot = writer.groups()
    if start is None:
        return Holder("", int(pid), "")
    return Holder("", int(pid), "", boot, int(namespace), int(start))


def _writer() -> tuple[str, str]:
    """This process's holder id and the token its queue files' names carry."""
    global _this_writer
    if _this_writer is None or _this_writer[0] != os.getpid():  # a forked child is another writer
        holder = default_holder()
        parsed = Holder.parse(holder)
        assert parsed is not None
        _this_writer = (os.getpid(), holder, writer_token(parsed))
    return _this_writer[1], _this_writer[2]


class KeyIndex:
    """The key index of one pipeline's queue: a SQLite file in WAL mode, every write synced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # SQLite gives its -wal and -shm files this mode
        self._conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                     check_same_thread=False)
        enable_wal(self._conn)
        self._conn.execute("PRAGMA synchronous=FULL")
        with self._write() as cur:
            for statement in _DDL:
                cur.execute(statement)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def _one(self, statement: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._lock:
            row = self._conn.execute(statement, params).fetchone()
        return tuple(row) if row is not None else None

    def touch(self, digest: str, key: str, now_us: int) -> KeyRecord:
        """The key's record, recording ``now_us`` as its first attempt when it has none."""
        with self._write() as cur:
            cur.execute("INSERT INTO batch_keys (digest, key, first_attempt_us, state) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (digest) DO NOTHING", (digest, key, now_us, OPEN))
        record = self.get(digest)
        assert record is not None
        return record

    def get(self, digest: str) -> KeyRecord | None:
        row = self._one("SELECT digest, key, first_attempt_us, state, member, grp, answer FROM batch_keys"
                        " WHERE digest = ?", (digest,))
        if row is None:
            return None
        return KeyRecord(row[0], row[1], int(row[2]), row[3], row[4], row[5], json.loads(row[6]) if row[6] else [])

    def mark_landed(self, landed: list[tuple[Member, str, list[dict[str, Any]]]], now_us: int) -> None:
        """Record keys as landed: (the member that landed it, the group digest, the answer)."""
        with self._write() as cur:
            for member, group, tables in landed:
                cur.execute("INSERT INTO batch_keys (digest, key, first_attempt_us, state) VALUES (?, ?, ?, ?)"
                            " ON CONFLICT (digest) DO NOTHING", (member.digest, member.key, member.received_us, OPEN))
                cur.execute("UPDATE batch_keys SET state = ?, member = ?, grp = ?, answer = ?, landed_us = ?"
                            " WHERE digest = ? AND state = ?",
                            (LANDED, member.id, group, json.dumps(tables), now_us, member.digest, OPEN))

    def next_attempt(self, stem: str) -> int:
        """Take the next attempt number of a run id stem (1 for its first), durably, before it is used."""
        with self._write() as cur:
            cur.execute("INSERT INTO run_attempts (stem, attempts) VALUES (?, 1)"
                        " ON CONFLICT (stem) DO UPDATE SET attempts = attempts + 1", (stem,))
            cur.execute("SELECT attempts FROM run_attempts WHERE stem = ?", (stem,))
            return int(cur.fetchone()[0])

    def record_failure(self, member: Member, error: ContextfulError, now_us: int) -> None:
        """Record why a member failed, its text masked by the secret guard (it is answered on replay)."""
        fields = {k: mask_message(v) if isinstance(v, str) else v for k, v in _jsonable(error.fields).items()}
        doc = {"name": error.name, "detail": mask_message(error.detail), "fields": fields}
        with self._write() as cur:
            cur.execute("INSERT INTO member_failures (member, digest, error, failed_us) VALUES (?, ?, ?, ?)"
                        " ON CONFLICT (member) DO NOTHING", (member.id, member.digest, json.dumps(doc), now_us))

    def failure(self, member_id: str) -> dict[str, Any] | None:
        """The failure a leader recorded for a member: ``{"name", "detail", "fields"}``."""
        row = self._one("SELECT error FROM member_failures WHERE member = ?", (member_id,))
        return json.loads(row[0]) if row else None

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def _jsonable(fields: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(json.dumps(fields, default=str))
    return result


class Queue:
    """One pipeline's queue directory: spool members into it, list them FIFO, remove them."""

    def __init__(self, root: str | os.PathLike[str], pipeline: str) -> None:
        self.pipeline = pipeline
        self.dir = Path(root) / pipeline
        self.incoming = self.dir / "incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)
        for folder in (self.dir, self.incoming):  # owner-only, a queue made before this rule included
            folder.chmod(0o700)
        self.index = KeyIndex(self.dir / "keys.sqlite")

    # --- members --------------------------------------------------------------------------------

    def body_path(self, suffix: str = "") -> Path:
        """A fresh path under ``incoming/`` for a request body (``suffix`` names its compression),
        named by this process as its writer."""
        return self.incoming / f"{_writer()[1]}-{uuid.uuid4().hex}.body{suffix}"

    @staticmethod
    def member_id() -> str:
        """A fresh member id, sorting after every id taken before it here and naming this process."""
        return f"{time.time_ns():020d}-{_writer()[1]}-{uuid.uuid4().hex[:8]}"

    def spool(self, key: str, digest: str, tables: dict[str, pa.Table], *, received_us: int, body_bytes: int,
              body_sha256: str) -> Member:
        """Write a member synced: each table's Arrow file, then the sidecar, then the directory."""
        member_id = self.member_id()
        written: list[Path] = []
        try:
            size = 0
            for table, data in tables.items():
                path = self.dir / f"{member_id}.{table}.arrow"
                written.append(path)
                size += self._write_synced(path, partial(_write_ipc, data=data))
            member = Member(member_id, self.pipeline, key, digest, received_us, body_bytes, body_sha256, size,
                            {t: d.num_rows for t, d in tables.items()}, _writer()[0])
            sidecar = self.dir / f"{member_id}.json"
            written.append(sidecar)
            payload = json.dumps(member.to_json()).encode()
            self._write_synced(sidecar, lambda f: f.write(payload))
            _fsync_dir(self.dir)
        except BaseException:
            for path in reversed(written):
                path.unlink(missing_ok=True)
            raise
        return member

    def _write_synced(self, path: Path, write: Callable[[BinaryIO], object]) -> int:
        tmp = path.with_name(f".tmp-{path.name}")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        os.replace(tmp, path)
        return size

    def members(self) -> list[Member]:
        """Every spooled member, first in first out."""
        found = []
        for path in self._sidecars():  # bounded by the queue's depth, not by rows
            try:
                found.append(Member.from_json(json.loads(path.read_bytes())))
            except FileNotFoundError:
                continue  # removed by a leader since the listing
            except (ValueError, KeyError) as exc:
                log.warning("queue %s: unreadable member sidecar %s skipped: %s", self.dir, path.name, exc)
        return found

    def _sidecars(self) -> list[Path]:
        """The members' sidecars in name (FIFO) order; a ``.tmp-`` file is no member yet."""
        return sorted(p for p in self.dir.glob("*.json") if not p.name.startswith("."))

    def read(self, member: Member, table: str) -> pa.Table:
        """The member's batch for ``table``, as it was spooled."""
        with pa.memory_map(str(self.dir / f"{member.id}.{table}.arrow")) as source:
            return ipc.open_file(source).read_all()

    def remove(self, members: list[Member]) -> None:
        """Delete members: Arrow files first, then the sidecar, so a sidecar never names missing data
        of a member that still has to land."""
        if not members:
            return
        for member in members:
            for table in member.rows:
                (self.dir / f"{member.id}.{table}.arrow").unlink(missing_ok=True)
            (self.dir / f"{member.id}.json").unlink(missing_ok=True)
        _fsync_dir(self.dir)

    def sweep(self) -> int:
        """Delete what killed writers left: temporary files, Arrow files without a sidecar and
        request bodies, each only when the writer its name carries is provably dead (see the module
        docstring). Returns how many. What a writer elsewhere (another boot or PID namespace) or
        an unidentified writer left is kept and logged, for an operator (docs/receive.md)."""
        members = {p.name.removesuffix(".json") for p in self._sidecars()}
        here = Holder.parse(_writer()[0])
        removed = 0
        unproven = []
        for path in [*self.dir.iterdir(), *self.incoming.iterdir()]:  # bounded by the queue's files
            name = path.name
            body = path.parent == self.incoming
            orphan = (name.startswith(".tmp-") or body
                      or (name.endswith(".arrow") and name.split(".", 1)[0] not in members))
            if not orphan or not path.is_file():
                continue
            writer = file_writer(name, body)
            if writer is not None and writer.provably_dead():
                path.unlink(missing_ok=True)
                removed += 1
            elif (writer is None or not writer.identified or here is None
                  or (writer.boot_id, writer.pid_ns) != (here.boot_id, here.pid_ns)):
                unproven.append(str(path.relative_to(self.dir)))  # a live writer here is no news
        if unproven:
            log.warning("queue %s: %d leftover file(s) kept whose writer cannot be proven dead here (of another"
                        " boot or PID namespace, or named by an older version): a sweeper in the writer's"
                        " container takes them, else delete them once no receiver of this queue runs on any"
                        " host that shares it (docs/receive.md, Files): %s",
                        self.dir, len(unproven), ", ".join(sorted(unproven)))
        return removed

    # --- the land lock --------------------------------------------------------------------------

    @contextmanager
    def land_lock(self) -> Iterator[None]:
        """Hold the pipeline's land lock (blocking): an exclusive ``flock`` on ``land.lock``. Each
        holding opens the file anew, so threads of one process exclude each other too."""
        fd = os.open(self.dir / "land.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the description releases the lock

    def close(self) -> None:
        self.index.close()


def _write_ipc(f: BinaryIO, data: pa.Table) -> None:
    with ipc.new_file(f, data.schema) as writer:
        writer.write_table(data)
