"""What the landing process and its decoder server (``engine.land.decode_child``) agree on.

The block size a decode reads, the tags of the stream a child writes back, and how an input's name
tells its compression and whether it is a local file. Kept apart from the server's module, which
imports pyarrow's readers and numpy at its top: listing inputs and starting a run import only this.
"""

from __future__ import annotations

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2"}
"""Compression suffixes a decode opens as a stream, and their codecs."""
READ_BYTES = 4 << 20
"""Bytes read per block (measured: 2-8 MiB parse fastest; larger blocks fall out of cache)."""
SEGMENT = b"S"
"""Tag of a stream frame that starts an Arrow IPC segment (a schema, then its batches)."""
READ = b"P"
"""Tag of a progress frame: 8 bytes of the input's bytes read so far, 1 byte of phase (1: a CSV's
first reading, for its types), written between IPC segments (``engine.land.decode_child``)."""
TRAILER = b"E"
"""Tag of the stream's last frame: the input's counts and errors."""


def split_compression(path: str) -> tuple[str, str | None]:
    """The input's name without its compression suffix, lower-cased, and the codec that suffix names."""
    name = path.lower().rstrip("/")
    for suffix, codec in COMPRESSIONS.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], codec
    return name, None


def local_path(path: str) -> str | None:
    """The filesystem path of a local input, None for a URL fsspec opens."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path
