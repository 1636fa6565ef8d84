"""The snapshot directory: a node's applied versions of its manifest, one format, one module.

Layout (``surface.reconcile.url-layout``: the same names serve the directory over loopback HTTP
unchanged)::

    <snapshot_dir>/manifest@v<N>.toml   immutable: the document version N claimed, N from 1
    <snapshot_dir>/manifest@current     the applied pointer: the text "<N>\\n"
    <snapshot_dir>/receipt@v<N>.json    immutable: version N's signed receipt, when the project syncs
                                        (``engine.control.receipts``; written before the pointer names N)

Two primitives carry every change (``surface.apply.version-race``):

- :meth:`SnapshotDir.claim` creates ``manifest@v<N>.toml`` exclusively: a temp file written whole
  and fsynced, then hard-linked into place (``link`` fails when the name exists), so a reader never
  sees a partial file, and of two claimers of one N exactly one wins; the loser gets
  ``ManifestVersionConflict``. A claimed file is never rewritten or removed.
- :meth:`SnapshotDir.advance` compare-and-swaps the pointer: under an exclusive ``flock`` on
  ``manifest.lock`` it reads the pointer, compares it with the version the caller expects, and
  replaces it by ``os.replace`` of a fsynced temp file; a pointer that moved raises
  ``ManifestVersionConflict``.

``surface.apply.weak-conditional-backend``: a directory given as a URL (``s3://``, ``memory://``,
any fsspec URL) has neither primitive, so opening it raises ``ConditionalWriteUnsupported``; a
local filesystem that refuses the lock or the link (``ENOLCK``, ``EOPNOTSUPP``, ...) raises it on
the first try (:meth:`SnapshotDir.prepare` probes the lock before anything is written).

Reading never writes: :meth:`applied`, :meth:`versions` and :meth:`text` create nothing.
``surface.reconcile.pointer-malformed``: a pointer that is not wholly a version (digits, no sign,
no leading zero, one optional final newline) raises ``ControlPointerMalformed``; a pointer or
version that cannot be read, ``ControlSnapshotUnreadable``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contextful.storage.errors import (
    ConditionalWriteUnsupported,
    ControlPointerMalformed,
    ControlSnapshotUnreadable,
    ManifestVersionConflict,
)

POINTER = "manifest@current"
LOCK = "manifest.lock"
_VERSION = re.compile(r"manifest@v([1-9][0-9]*)\.toml")
_POINTER_BODY = re.compile(r"([1-9][0-9]*)\n?")
_UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EPERM}
"""What a filesystem answers a lock or a hard link it cannot do with."""


def version_name(version: int) -> str:
    """The file name of version ``version``: ``manifest@v<N>.toml``."""
    return f"manifest@v{version}.toml"


def receipt_name(version: int) -> str:
    """The file name of version ``version``'s receipt: ``receipt@v<N>.json``."""
    return f"receipt@v{version}.json"


def parse_pointer(body: bytes, location: str) -> int:
    """The version a pointer body names; ``ControlPointerMalformed`` naming ``location`` unless the
    body is wholly a version (``surface.reconcile.pointer-malformed``)."""
    text = body.decode("utf-8", errors="replace")
    if (match := _POINTER_BODY.fullmatch(text)) is None:
        raise ControlPointerMalformed(location, text)
    return int(match.group(1))


class SnapshotDir:
    """The snapshot directory at ``path`` of project ``project`` (named in conflicts)."""

    def __init__(self, path: str, project: str) -> None:
        if "://" in path:
            raise ConditionalWriteUnsupported(path, "a snapshot directory at a URL has no exclusive create and no "
                                                    "lock; name a local directory in [control] snapshot_dir")
        self.path = Path(path)
        self.project = project

    def applied(self) -> int | None:
        """The applied version, or None when no pointer exists."""
        try:
            body = (self.path / POINTER).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ControlSnapshotUnreadable(str(self.path / POINTER), f"the pointer cannot be read: {exc}") from exc
        return parse_pointer(body, str(self.path / POINTER))

    def versions(self) -> list[int]:
        """Every claimed version, ascending (empty when the directory does not exist)."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ControlSnapshotUnreadable(str(self.path), f"the directory cannot be listed: {exc}") from exc
        return sorted(int(m.group(1)) for name in names if (m := _VERSION.fullmatch(name)))

    def file(self, version: int) -> Path:
        return self.path / version_name(version)

    def text(self, version: int) -> str:
        """The document claimed as ``version``."""
        try:
            return self.file(version).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ControlSnapshotUnreadable(str(self.file(version)), f"version {version} cannot be read: "
                                                                     f"{exc}") from exc

    def receipt(self, version: int) -> bytes | None:
        """The bytes of ``receipt@v<version>.json`` (None: the version holds no receipt)."""
        path = self.path / receipt_name(version)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ControlSnapshotUnreadable(str(path), f"version {version}'s receipt cannot be read: {exc}") from exc

    def receipt_summary(self, version: int | None) -> dict[str, Any] | None:
        """Version ``version``'s receipt as JSON with its digest (``surface.apply.receipt-digest``), as the
        control routes and the console show it; None when the version holds none (a local claim)."""
        from contextful.engine.control.receipts import parse_receipt

        data = None if version is None else self.receipt(version)
        if version is None or data is None:
            return None
        receipt = parse_receipt(data, str(self.path / receipt_name(version)))
        return {**receipt.document(), "digest": receipt.digest()}

    def prepare(self) -> None:
        """Make the directory and probe the lock, before a writer claims anything."""
        self.path.mkdir(parents=True, exist_ok=True)
        with self._locked():
            pass

    def claim(self, version: int, text: str) -> Path:
        """Create ``manifest@v<version>.toml`` holding ``text``, exclusively; ``ManifestVersionConflict``
        when that version exists."""
        return self._create(self.file(version), text.encode("utf-8"), version)

    def claim_receipt(self, version: int, data: bytes) -> Path:
        """Create ``receipt@v<version>.json`` holding ``data``, exclusively (``surface.apply.receipt-file``);
        ``ManifestVersionConflict`` when it exists."""
        return self._create(self.path / receipt_name(version), data, version)

    def _create(self, final: Path, data: bytes, version: int) -> Path:
        temp = self._temp(data)
        try:
            os.link(temp, final)
        except FileExistsError:
            raise ManifestVersionConflict(self.project, version, self.applied() or 0) from None
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                raise ConditionalWriteUnsupported(str(self.path), f"no exclusive create (link: {exc})") from exc
            raise
        finally:
            temp.unlink()
        self._sync_directory()
        return final

    def advance(self, expected: int | None, version: int) -> None:
        """Point ``manifest@current`` at ``version`` if it names ``expected`` (None: no pointer yet);
        else ``ManifestVersionConflict`` naming the version it names."""
        with self._locked():
            current = self.applied()
            if current != expected:
                raise ManifestVersionConflict(self.project, version, current or 0)
            os.replace(self._temp(f"{version}\n".encode()), self.path / POINTER)
            self._sync_directory()

    def _temp(self, data: bytes) -> Path:
        """A new hidden file in the directory holding ``data``, on disk (fsynced)."""
        temp = self.path / f".tmp-{uuid.uuid4().hex}"
        with open(temp, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        return temp

    def _sync_directory(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno in _UNSUPPORTED:
                    raise ConditionalWriteUnsupported(str(self.path), f"no exclusive lock (flock: {exc})") from exc
                raise
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock
