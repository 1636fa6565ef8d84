"""The blob store port's behaviour suite, run against every adapter.

Adapters: :class:`FileBlobStore` on a local root and on an S3 root (moto on loopback),
:class:`SqliteBlobStore`, :class:`PostgresBlobStore` (the session's real server, a fresh schema
per test) and :class:`D1BlobStore` (the D1 profile's Worker under miniflare, a fresh namespace per
test). Covers the round trip, SHA-256 addressing, presence, ``BlobNotFound``, ``BlobCorrupt``
on bytes tampered at rest, and ``run.journal.blob-write``: writers of one hash in separate OS
processes, started together, converge on one whole stored value and none errors.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import random
import re
import sqlite3
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from contextful.storage.blobs import BlobStore, digest_of
from contextful.storage.blobs.files import FileBlobStore
from contextful.storage.blobs.postgres import PostgresBlobStore
from contextful.storage.blobs.sqlite import SqliteBlobStore
from contextful.storage.d1.blobs import D1BlobStore
from contextful.storage.d1.client import D1Binding
from contextful.storage.errors import BlobCorrupt, BlobNotFound
from contextful.storage.objects import TMP_MARK, ObjectStore

KINDS = [
    "files-local",
    pytest.param("files-s3", marks=pytest.mark.s3),
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("d1", marks=pytest.mark.d1),
]


@dataclass(frozen=True)
class BlobSite:
    """Where one adapter keeps its blobs; picklable, so a child process opens the same store."""

    kind: str
    location: str
    """The object root (files-*), the SQLite file, or the PostgreSQL DSN."""
    schema: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    d1: D1Binding | None = None

    def objects(self) -> ObjectStore:
        return ObjectStore(self.location, self.options or None)

    def open(self) -> BlobStore:
        if self.kind.startswith("files"):
            return FileBlobStore(self.objects())
        if self.kind == "sqlite":
            return SqliteBlobStore(self.location)
        if self.d1 is not None:
            return D1BlobStore(self.d1.client())
        return PostgresBlobStore(self.location, self.schema)

    def stored(self) -> dict[str, bytes]:
        """Every object the adapter holds, by key (files) or digest (tables), temporaries included."""
        if self.kind.startswith("files"):
            objects = self.objects()
            return {info.key: objects.get_bytes(info.key) for info in objects.list("blobs")}
        if self.kind == "sqlite":
            with sqlite3.connect(self.location) as conn:
                return {d: bytes(c) for d, c in conn.execute("SELECT digest, content FROM cf_blobs")}
        if self.d1 is not None:  # every R2 object of the namespace, whatever its key
            client = self.d1.client()
            return {o.key: client.get(o.key) or b"" for o in client.list()}
        with psycopg.connect(self.location) as conn:
            rows = conn.execute(f'SELECT digest, content FROM "{self.schema}".cf_blobs').fetchall()
        return {d: bytes(c) for d, c in rows}

    def tamper(self, digest: str, data: bytes) -> None:
        """Overwrite the stored bytes of ``digest`` behind the adapter's back."""
        if self.kind == "files-local":
            path = self.objects().path(FileBlobStore.key(digest))
            assert os.path.exists(path)
            with open(path, "r+b") as fh:
                fh.write(data)
                fh.truncate()
        elif self.kind == "files-s3":
            objects = self.objects()
            assert objects.exists(FileBlobStore.key(digest))
            objects.fs.pipe_file(objects.path(FileBlobStore.key(digest)), data)
        elif self.kind == "sqlite":
            with sqlite3.connect(self.location) as conn:
                cur = conn.execute("UPDATE cf_blobs SET content = ? WHERE digest = ?", (data, digest))
                assert cur.rowcount == 1
        elif self.d1 is not None:
            client = self.d1.client()
            assert client.head(D1BlobStore.key(digest)) is not None
            client.put(D1BlobStore.key(digest), data)
        else:
            with psycopg.connect(self.location) as conn:
                cur = conn.execute(f'UPDATE "{self.schema}".cf_blobs SET content = %s WHERE digest = %s',
                                   (data, digest))
                assert cur.rowcount == 1


def _close(blobs: BlobStore) -> None:
    close = getattr(blobs, "close", None)
    if close is not None:
        close()


@pytest.fixture(params=KINDS)
def site(request: pytest.FixtureRequest, tmp_path: Path) -> BlobSite:
    kind = request.param
    if kind == "files-local":
        return BlobSite(kind, str(tmp_path / "root"))
    if kind == "files-s3":
        server = request.getfixturevalue("s3_server")
        return BlobSite(kind, f"s3://{server.new_bucket()}/root", options=server.storage_options)
    if kind == "sqlite":
        return BlobSite(kind, str(tmp_path / "blobs.sqlite"))
    if kind == "d1":
        return BlobSite(kind, "", d1=request.getfixturevalue("d1_binding"))
    return BlobSite(kind, request.getfixturevalue("pg_dsn"), schema=request.getfixturevalue("pg_schema"))


@pytest.fixture
def blobs(site: BlobSite) -> Iterator[BlobStore]:
    store = site.open()
    yield store
    _close(store)


def _key(site: BlobSite, digest: str) -> str:
    if site.kind == "d1":
        return D1BlobStore.key(digest)
    return FileBlobStore.key(digest) if site.kind.startswith("files") else digest


# --- the port ----------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"hello, blob", bytes(range(256)) * 4096],
                         ids=["empty", "small", "1MiB"])
def test_put_then_get_round_trips_under_the_sha256(site: BlobSite, blobs: BlobStore, data: bytes) -> None:
    digest = blobs.put(data)
    assert digest == hashlib.sha256(data).hexdigest() == digest_of(data)
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    assert blobs.get(digest) == data

    other = site.open()
    try:
        assert other.get(digest) == data
    finally:
        _close(other)
    assert site.stored() == {_key(site, digest): data}


def test_put_of_a_present_blob_is_idempotent(site: BlobSite, blobs: BlobStore) -> None:
    first = blobs.put(b"same bytes")
    other = site.open()
    try:
        assert other.put(b"same bytes") == first
    finally:
        _close(other)
    assert blobs.put(b"same bytes") == first
    second = blobs.put(b"other bytes")
    assert second != first
    assert site.stored() == {_key(site, first): b"same bytes", _key(site, second): b"other bytes"}


def test_exists(blobs: BlobStore) -> None:
    digest = digest_of(b"present later")
    assert not blobs.exists(digest)
    assert blobs.put(b"present later") == digest
    assert blobs.exists(digest)
    assert not blobs.exists(digest_of(b"never stored"))


def test_get_of_an_absent_blob_raises_blob_not_found(blobs: BlobStore) -> None:
    blobs.put(b"something else")
    digest = digest_of(b"never stored")
    with pytest.raises(BlobNotFound) as info:
        blobs.get(digest)
    assert info.value.digest == digest
    assert digest in str(info.value)


@pytest.mark.parametrize("how", ["flipped", "truncated"])
def test_get_of_tampered_bytes_raises_blob_corrupt(site: BlobSite, blobs: BlobStore, how: str) -> None:
    data = b"the original content of a blob" * 100
    digest = blobs.put(data)
    bad = data[:1] + bytes([data[1] ^ 0xFF]) + data[2:] if how == "flipped" else data[: len(data) // 2]
    site.tamper(digest, bad)

    for reader in (blobs, site.open()):
        with pytest.raises(BlobCorrupt) as info:
            reader.get(digest)
        assert info.value.digest == digest
        assert info.value.actual == hashlib.sha256(bad).hexdigest()
        assert digest in str(info.value)
        if reader is not blobs:
            _close(reader)
    assert blobs.exists(digest)


# --- run.journal.blob-write --------------------------------------------------------------------

WRITERS = 4
READERS = 2
BIG = 4 * 1024 * 1024
TIMEOUT_S = 120.0


def _payloads() -> list[bytes]:
    """The same bytes in every process: one large blob, whose writes overlap longest, and small ones."""
    rng = random.Random(20240607)
    return [rng.randbytes(BIG)] + [rng.randbytes(4096 + i) for i in range(15)]


def _read_all(blobs: BlobStore, payloads: list[bytes]) -> list[str]:
    """Read every payload's blob; raise unless each holds exactly the payload."""
    read_back = []
    for data in payloads:
        got = blobs.get(digest_of(data))
        if got != data:
            raise AssertionError(f"blob {digest_of(data)} read back {len(got)} other bytes")
        read_back.append(digest_of(got))
    return read_back


def _blob_process(site: BlobSite, role: str, start: Any, written: Any, done: Any, results: Any) -> None:
    """A writer puts every payload and reads it back at once, while the other writers of that hash
    may still be writing; a reader polls every payload until the writers are done, accepting
    absence but never other bytes. Once every writer is done, both read everything again."""
    try:
        payloads = _payloads()
        blobs = site.open()
        try:
            start.wait(TIMEOUT_S)
            digests: list[str] = []
            polled = 0
            if role == "writer":
                for data in payloads:
                    digests.append(blobs.put(data))
                    if blobs.get(digests[-1]) != data:
                        raise AssertionError(f"blob {digests[-1]} read back other bytes")
                with done.get_lock():
                    done.value += 1
                written.wait(TIMEOUT_S)
            else:
                while done.value < WRITERS and not written.broken:
                    for data in payloads:
                        try:
                            got = blobs.get(digest_of(data))
                        except BlobNotFound:
                            continue
                        if got != data:
                            raise AssertionError(f"blob {digest_of(data)} read back other bytes")
                        polled += 1
                if written.broken:
                    raise RuntimeError("a writer failed")
            read_back = _read_all(blobs, payloads)
        finally:
            _close(blobs)
        results.put((role, "ok", digests, read_back))
    except BaseException:  # noqa: BLE001 - a child reports every failure to the test
        start.abort()  # release the other processes at once
        written.abort()
        results.put((role, "error", traceback.format_exc(), None))


def _knock_on(report: str) -> bool:
    """Whether a process failed only because another one had (it found the barrier broken)."""
    return "BrokenBarrierError" in report or "a writer failed" in report


@pytest.mark.clause("run.journal.blob-write")
def test_concurrent_writers_of_one_hash_converge_on_one_whole_value(site: BlobSite) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WRITERS + READERS)
    written = ctx.Barrier(WRITERS)
    done = ctx.Value("i", 0)
    results = ctx.Queue()
    roles = ["writer"] * WRITERS + ["reader"] * READERS
    procs = [ctx.Process(target=_blob_process, args=(site, role, start, written, done, results))
             for role in roles]
    for proc in procs:
        proc.start()
    outcomes = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=300))
    except queue.Empty:
        pytest.fail("a blob process reported nothing in time")
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()

    errors = [f"{o[0]}: {o[2]}" for o in outcomes if o[1] != "ok"]
    errors.sort(key=_knock_on)  # the failure that broke the barriers first
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in procs] == [0] * len(procs)

    payloads = _payloads()
    expected = [digest_of(p) for p in payloads]
    assert sorted(o[0] for o in outcomes) == sorted(roles)
    for role, _status, digests, read_back in outcomes:
        assert digests == (expected if role == "writer" else [])
        assert read_back == expected

    blobs = site.open()
    try:
        assert _read_all(blobs, payloads) == expected
    finally:
        _close(blobs)

    # One whole object per digest and nothing beside it: no temporaries, no partial copies.
    stored = site.stored()
    assert sorted(stored) == sorted(_key(site, d) for d in expected)
    assert not [key for key in stored if TMP_MARK in key]
    for digest, data in zip(expected, payloads, strict=True):
        assert stored[_key(site, digest)] == data
    if site.kind == "files-local":
        leftovers = [name for _dir, _sub, files in os.walk(site.objects().path("blobs")) for name in files]
        assert sorted(leftovers) == sorted(expected)
