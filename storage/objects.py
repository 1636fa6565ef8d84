"""Object access: the one place the store touches bytes at rest.

A store root is a local path or an fsspec URL (``s3://bucket/prefix`` through s3fs). A local root
is read and written through ``os`` (fsspec, 50-150 ms of imports, is loaded only for a remote root
or a caller asking for :attr:`ObjectStore.fs`). Keys are
``/``-separated and relative to the root. Writes that must never be seen half-done (manifests,
parts) go through :meth:`ObjectStore.atomic_writer`: on a local filesystem a temporary sibling is
fsynced and renamed into place; an object store's PUT (and a closed multipart upload) is atomic
already. Readers therefore see a whole object or none — the substrate of "no torn publication".

:meth:`ObjectStore.put_if_absent` is first-writer-wins on every root kind (``store.json``, the
container profile's recovery identity, journal steps and blobs rely on it): locally a whole temporary
is hard-linked into place, which fails when the name is taken; on an object store the PUT carries
``If-None-Match: *`` and the server refuses every writer but the first. A remote backend that cannot
refuse the second writer is refused with ``ConditionalWriteUnsupported`` (:meth:`ObjectStore.
require_conditional_create`) before it is asked to write. A local write makes every directory it
creates durable in its parent, so a file whose own directory is fsynced cannot vanish with a
directory entry that never reached the disk.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from contextful.storage.errors import ConditionalWriteUnsupported

if TYPE_CHECKING:
    import fsspec

TMP_MARK = ".tmp-"
LOCAL_PROTOCOLS = ("file", "local")
CONDITIONAL_CREATE_PROTOCOLS = ("s3", "s3a")
"""Filesystems whose ``pipe_file(..., mode="create")`` is a conditional PUT decided by the server
(s3fs sends ``If-None-Match: *``). fsspec's default for the others checks existence and then
writes, which two racing writers pass together: those roots get no first-writer-wins write."""

_conditional_create: dict[tuple[str, str, str], str | None] = {}
"""Per backend (protocol, endpoint, bucket): None when the server refused a second create in this
process's probe, else why it cannot be trusted to."""
_conditional_create_lock = threading.Lock()


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: datetime | None


def _storage_options_from_env(protocol: str) -> dict[str, Any]:
    """s3fs options from the environment: an endpoint URL for S3-compatible servers."""
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get("CONTEXTFUL_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            return {"client_kwargs": {"endpoint_url": endpoint}}
    return {}


class ObjectStore:
    """Bytes under one root, local or remote."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None, *, create: bool = True,
                 fsync: Callable[[int], None] | None = None) -> None:
        """Bind ``root``; a local root's directory is made (durably) unless ``create`` is False (a
        reader's). ``fsync`` flushes a descriptor (a seam: tests record what is made durable; None:
        ``os.fsync``, looked up at each call)."""
        protocol, path = split_protocol(str(root))
        protocol = protocol or "file"
        self._options = storage_options if storage_options is not None else _storage_options_from_env(protocol)
        self.protocol = protocol
        self.is_local = protocol in LOCAL_PROTOCOLS
        self._fsync_seam = fsync
        if self.is_local:
            path = os.path.abspath(path)
            if create:
                self._make_dirs(path, durable=True)
        self.root = path.rstrip("/")
        self.url = self.root if self.is_local else f"{protocol}://{self.root}"

    @property
    def options(self) -> dict[str, Any]:
        """The storage options the root was bound with: another process opens the same root with
        ``ObjectStore(self.url, self.options)``."""
        return dict(self._options)

    @functools.cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem of the root (built on first use)."""
        import fsspec

        return fsspec.filesystem(self.protocol, **self._options)

    # --- naming -------------------------------------------------------------------------------

    def path(self, key: str) -> str:
        """The filesystem path of ``key`` (no protocol)."""
        return f"{self.root}/{key}"

    def uri(self, key: str) -> str:
        """The address a reader outside fsspec (DuckDB, pyarrow) uses for ``key``."""
        return self.path(key) if self.is_local else f"{self.protocol}://{self.path(key)}"

    def key_of(self, path: str) -> str:
        _, bare = split_protocol(path)
        return bare[len(self.root) + 1 :]

    # --- writing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def atomic_writer(self, key: str, durable: bool = True) -> Iterator[IO[bytes]]:
        """A binary file handle whose contents appear at ``key`` whole, or not at all."""
        if not self.is_local:
            # fsspec's ``with`` closes — and so publishes — a file the body failed to finish; an
            # object store must get all of it or nothing: abort the upload instead of completing it.
            fh = self.fs.open(self.path(key), "wb")
            try:
                yield fh
            except BaseException:
                _discard(fh)
                raise
            fh.close()
            return
        with self.atomic_local_path(key, durable=durable) as tmp, open(tmp, "wb") as fh:
            yield fh

    @contextlib.contextmanager
    def atomic_local_path(self, key: str, durable: bool = True) -> Iterator[str]:
        """A temporary local path to write; on success it is fsynced and renamed to ``key``.

        For native writers (pyarrow) that write faster to a path than to a Python file object.
        """
        if not self.is_local:
            raise ValueError("atomic_local_path needs a local store root")
        target = self.path(key)
        directory = os.path.dirname(target)
        self._make_dirs(directory, durable)
        tmp = os.path.join(directory, f"{TMP_MARK}{uuid.uuid4().hex}-{os.path.basename(target)}")
        try:
            yield tmp
            if durable:
                self._fsync_path(tmp)  # fsync through any descriptor flushes the file
            os.replace(tmp, target)
            if durable:
                self._fsync_path(directory)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put_bytes(self, key: str, data: bytes, durable: bool = True) -> None:
        with self.atomic_writer(key, durable=durable) as fh:
            fh.write(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``data`` at ``key`` unless an object is there; True when this call wrote it.

        The first writer wins on every root kind, whatever bytes the others hold: a caller that lost
        reads the winner's object. Locally a whole, fsynced temporary is hard-linked into place (the
        link fails when the name is taken); remotely the PUT is conditional (``If-None-Match: *``) and
        the server refuses all but the first. A remote backend that cannot refuse raises
        ``ConditionalWriteUnsupported`` (:meth:`require_conditional_create`).
        """
        target = self.path(key)
        if not self.is_local:
            if self.fs.exists(target):  # an open of an existing store (a reader's too) writes nothing
                return False
            self.require_conditional_create()
            try:
                self.fs.pipe_file(target, data, mode="create")
            except FileExistsError:  # the server refused: another writer's object is there
                return False
            return True
        directory = os.path.dirname(target)
        self._make_dirs(directory, durable=True)
        tmp = os.path.join(directory, f"{TMP_MARK}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                self._fsync(fh.fileno())
            try:
                os.link(tmp, target)  # fails if present: first whole writer wins
            except FileExistsError:
                return False
            self._fsync_path(directory)
            return True
        finally:
            os.unlink(tmp)

    def require_conditional_create(self) -> None:
        """Raise ``ConditionalWriteUnsupported`` unless a create at this remote root refuses every
        writer but the first.

        Two things must hold, and both are checked once per process for each backend (protocol,
        endpoint, bucket): the client sends the condition to the server (the filesystem is one of
        :data:`CONDITIONAL_CREATE_PROTOCOLS`; fsspec's fallback is check-then-put), and the server
        honours it (an S3-compatible server that ignores ``If-None-Match`` accepts both writers): a
        probe object is created twice under the root, the second create must be refused, and the
        probe is deleted. Only a writer about to create probes: a reader never writes.
        """
        backend = (self.protocol, str(self._options.get("client_kwargs", {}).get("endpoint_url", "")),
                   self.root.split("/", 1)[0])
        with _conditional_create_lock:
            if backend not in _conditional_create:
                _conditional_create[backend] = self._probe_conditional_create()
            reason = _conditional_create[backend]
        if reason is not None:
            raise ConditionalWriteUnsupported(self.url, reason)

    def _probe_conditional_create(self) -> str | None:
        """None when this root's server refused a second create of one key; else why not."""
        if self.protocol not in CONDITIONAL_CREATE_PROTOCOLS:
            return f"{self.protocol}:// has no create-if-absent its server decides"
        probe = self.path(f"{TMP_MARK}{uuid.uuid4().hex}-conditional-create-probe")
        self.fs.pipe_file(probe, b"first", mode="create")
        try:
            try:
                self.fs.pipe_file(probe, b"second", mode="create")
            except FileExistsError:
                return None
            return "the server accepted a second create of one key (it ignores If-None-Match)"
        finally:
            self.fs.rm(probe)

    def _make_dirs(self, directory: str, durable: bool) -> None:
        """Make ``directory`` and its missing ancestors; when ``durable``, fsync the parent of every
        level that was missing, so the new directories survive a power loss with what is put in
        them. A level a concurrent writer made counts too: its entry may not be durable yet."""
        missing = []
        while not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for level in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(level)
        if durable:
            for level in missing:
                self._fsync_path(os.path.dirname(level))

    def _fsync(self, fd: int) -> None:
        (self._fsync_seam or os.fsync)(fd)

    def _fsync_path(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    # --- reading ------------------------------------------------------------------------------

    def get_bytes(self, key: str) -> bytes:
        if self.is_local:
            with open(self.path(key), "rb") as fh:
                return fh.read()
        # One GET answers one whole version of the object. fsspec's file reads instead range the
        # object under the ETag its (possibly cached) metadata holds, and fail FileExpired when
        # another writer replaced the object meanwhile: the reader must see the newer version.
        return bytes(self.fs.cat_file(self.path(key), max_concurrency=1))

    def exists(self, key: str) -> bool:
        if self.is_local:
            return os.path.exists(self.path(key))
        return self.fs.exists(self.path(key))

    def list(self, prefix: str) -> builtins.list[ObjectInfo]:
        """Every object under ``prefix`` (recursively), temporaries included."""
        base = self.path(prefix)
        if self.is_local:
            return _local_files(base, len(self.root) + 1)
        if not self.fs.exists(base):
            return []
        found = self.fs.find(base, detail=True)
        out = []
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            out.append(ObjectInfo(self.key_of(path), int(info.get("size") or 0), _modified(info)))
        return out

    def children(self, prefix: str) -> builtins.list[str]:
        """The names directly under ``prefix`` (its directories, or common prefixes on an object store)."""
        base = self.path(prefix)
        if self.is_local:
            return sorted(os.listdir(base)) if os.path.isdir(base) else []
        if not self.fs.exists(base):
            return []
        return sorted(self.key_of(p).rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False))

    def delete(self, keys: builtins.list[str]) -> None:
        """Delete ``keys``; one already gone (a temporary renamed or removed since it was listed)
        counts as deleted, so collection racing a writer never fails on it."""
        if keys and self.is_local:
            for key in keys:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(key))
        elif keys:
            try:
                self.fs.rm([self.path(k) for k in keys])
            except FileNotFoundError:
                for key in keys:
                    try:
                        self.fs.rm(self.path(key))
                    except FileNotFoundError:
                        continue
            self.fs.invalidate_cache()


def split_protocol(url: str) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``(None, path)`` for a plain path."""
    protocol, sep, rest = url.partition("://")
    return (protocol, rest) if sep and protocol.isidentifier() else (None, url)


def _local_files(base: str, strip: int) -> builtins.list[ObjectInfo]:
    """The files under the local directory ``base`` (recursively), keyed by path after ``strip`` characters."""
    if os.path.isfile(base):
        st = os.stat(base)
        return [ObjectInfo(base[strip:], st.st_size, datetime.fromtimestamp(st.st_mtime, tz=UTC))]
    out = []
    for directory, _dirs, files in os.walk(base):
        for name in files:
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # renamed or removed since the walk saw it
                continue
            out.append(ObjectInfo(path[strip:], st.st_size, datetime.fromtimestamp(st.st_mtime, tz=UTC)))
    return out


def _discard(fh: Any) -> None:
    """Abandon a remote file being written: abort its multipart upload, never publish it."""
    discard = getattr(fh, "discard", None)
    try:
        if discard is not None:
            discard()
    finally:
        fh.closed = True  # close() would complete the upload with what was buffered


def _modified(info: dict[str, Any]) -> datetime | None:
    for field in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(field)
        if value is None:
            continue
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        return datetime.fromtimestamp(float(value), tz=UTC)
    return None

