"""A receive pipeline's queue: spooled members, written synced, and the key index beside them.

Implements the spooling half of ``run.land.receive-spool`` (decision "received-batches-spooled"):
a batch that decoded and validated is spooled, synced, before its receiver waits for the land lock,
so a receiver that dies after spooling loses nothing — the next lock holder lands its member.

One directory per pipeline, ``<queue root>/<pipeline id>/`` (the project's
``.contextful/queue/<pipeline id>/``)::

    <member id>.<table>.arrow     the decoded, typed batch for one touched table (Arrow IPC file)
    <member id>.json              the sidecar: key, digest, received time, bytes, rows, holder
    keys.sqlite                   the key index (WAL): first attempts, landed answers, attempts
    land.lock                     the land lock (an exclusive ``flock``)
    incoming/<pid>-<uuid>.body    request bodies being decoded (``.gzip``/``.zstd`` as sent, then decoded)

A member id is ``<ns since the epoch, 20 digits>-<pid>-<hex>``, so names sort first-in first-out
and name the process that wrote them. Each file is written to a ``.tmp-`` name, fsync'ed and
renamed; the Arrow files before the sidecar, then the directory is fsync'ed. The sidecar is the
member: a member exists once its sidecar is renamed. The directory and ``incoming/`` are ``0700``
and every file in them ``0600``: a batch's data is its sender's, readable by the owner only. Removal goes the other way (Arrow files,
then the sidecar), so a sidecar never outlives a member that is not landed or failed.
:meth:`Queue.sweep` deletes what a killed writer left half-written (files of a dead pid with no
sidecar).

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
import socket
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
    holder: dict[str, Any] = field(default_factory=dict)
    """The receiver that spooled it: host and pid."""

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "pipeline": self.pipeline, "key": self.key, "digest": self.digest,
                "received_us": self.received_us, "body_bytes": self.body_bytes, "body_sha256": self.body_sha256,
                "bytes": self.bytes, "rows": self.rows, "holder": self.holder}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Member:
        return cls(doc["id"], doc["pipeline"], doc["key"], doc["digest"], int(doc["received_us"]),
                   int(doc["body_bytes"]), doc["body_sha256"], int(doc["bytes"]),
                   {str(k): int(v) for k, v in doc["rows"].items()}, dict(doc.get("holder", {})))

    @property
    def pid(self) -> int:
        return int(self.holder.get("pid", 0))


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


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_pid(name: str) -> int:
    """The pid a queue file's name carries (member ids and bodies name their writer), else 0."""
    stem = name.removeprefix(".tmp-")
    parts = stem.split("-")
    for candidate in (parts[1] if len(parts) > 2 else "", parts[0]):
        if candidate.isdigit() and len(candidate) < 20:
            return int(candidate)
    return 0


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
        self._holder = {"host": socket.gethostname(), "pid": os.getpid()}

    # --- members --------------------------------------------------------------------------------

    def body_path(self, suffix: str = "") -> Path:
        """A fresh path under ``incoming/`` for a request body (``suffix`` names its compression)."""
        return self.incoming / f"{os.getpid()}-{uuid.uuid4().hex}.body{suffix}"

    def spool(self, key: str, digest: str, tables: dict[str, pa.Table], *, received_us: int, body_bytes: int,
              body_sha256: str) -> Member:
        """Write a member synced: each table's Arrow file, then the sidecar, then the directory."""
        member_id = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        written: list[Path] = []
        try:
            size = 0
            for table, data in tables.items():
                path = self.dir / f"{member_id}.{table}.arrow"
                written.append(path)
                size += self._write_synced(path, partial(_write_ipc, data=data))
            member = Member(member_id, self.pipeline, key, digest, received_us, body_bytes, body_sha256, size,
                            {t: d.num_rows for t, d in tables.items()}, dict(self._holder))
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
        request bodies, each only when the pid its name carries is dead. Returns how many."""
        members = {p.name.removesuffix(".json") for p in self._sidecars()}
        removed = 0
        for path in [*self.dir.iterdir(), *self.incoming.iterdir()]:
            name = path.name
            orphan = (name.startswith(".tmp-") or path.parent == self.incoming
                      or (name.endswith(".arrow") and name.split(".", 1)[0] not in members))
            if orphan and path.is_file() and not _pid_alive(_writer_pid(name)):
                path.unlink(missing_ok=True)
                removed += 1
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
