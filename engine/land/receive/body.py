"""A received batch's body on disk: written owner-only, decoded within a bound, removed after.

A request body is streamed (within ``max_body_bytes``, counted by the served face) to a file under
the queue's ``incoming/`` directory, created ``0600`` with :func:`private_file`. A body sent with
``Content-Encoding: gzip`` or ``zstd`` is then decoded by :func:`decode_body` into a second file
there, read in 1 MiB pieces and counted: past ``max_decoded_bytes`` the batch fails with
``RequestBodyTooLarge`` (413) having held at most one piece in memory and the bound on disk, so a
compression bomb costs neither memory nor disk. A damaged stream is ``InputMalformed``. The
receiver removes both files once the batch is spooled or has failed.

    >>> import gzip, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with private_file(folder / "b.gz") as f:
    ...     _ = f.write(gzip.compress(b'{"a": 1}\\n'))
    >>> decode_body(folder / "b.gz", "gzip", folder / "b", 100, "batch 'k'")
    9
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
from contextful.storage.errors import InputMalformed, RequestBodyTooLarge, first_line

CODECS = {"gzip": "gzip", "x-gzip": "gzip", "zstd": "zstd"}
"""``Content-Encoding`` value -> the Arrow codec that decodes it."""
_PIECE = 1 << 20


def private_file(path: Path) -> BinaryIO:
    """A new file at ``path``, readable and writable by its owner only."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb")


def decode_body(raw: Path, codec: str, out: Path, limit: int, what: str) -> int:
    """Decode ``raw`` (compressed with ``codec``) into ``out``; the decoded bytes, at most ``limit``."""
    written = 0
    with pa.OSFile(str(raw)) as source, pa.CompressedInputStream(source, codec) as stream, private_file(out) as sink:
        while True:
            try:
                piece = stream.read(_PIECE)
            except OSError as exc:
                if exc.errno is not None:
                    raise  # the system's error reading the file, not the codec's
                raise InputMalformed(what, None, f"the {codec} body is damaged: {first_line(exc)}") from exc
            if not piece:
                return written
            written += len(piece)
            if written > limit:
                raise RequestBodyTooLarge(what, limit, decoded=True)
            sink.write(piece)
