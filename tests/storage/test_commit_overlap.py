"""A commit writes its manifest while its parts' fsyncs run, and still lands only durable parts.

(A small run's manifest rides in its commit, ``storage.manifest``; these runs write every
manifest as an object, as a large run's is, to watch that object's write.)

The manifest needs only each part's counts, known once the part's bytes are written; its own
write and fsync overlap the part's fsyncs on the writer pool. The catalog commit, the only thing
that makes a part reachable, waits for every part's fsync and rename. A part whose fsync fails
after its bytes were counted fails the run: nothing commits, and the part and the manifest go.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.compaction import CompactionPolicy, set_policy
from contextful.storage.errors import StagingFailed


def open_store(root: Path) -> Store:
    store = Store.open(str(root))
    set_policy(store, CompactionPolicy(enabled=False))  # only the run's own commits below
    store.inline_manifest_bytes = 0  # every manifest an object of its own
    return store


def test_the_manifest_is_written_during_the_part_fsync_and_the_commit_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path / "store")
    store.append("t", pa.table({"id": [0]}))
    events: list[str] = []
    lock = threading.Lock()
    manifest_in_place = threading.Event()
    table_dir = str(tmp_path / "store" / "tables" / "t")
    real_fsync, real_replace, real_open = os.fsync, os.replace, os.open
    fd_paths: dict[int, str] = {}

    def note(event: str) -> None:
        with lock:
            events.append(event)

    def recording_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        fd = real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]
        fd_paths[fd] = os.fspath(path)
        return fd

    def held_fsync(fd: int) -> None:
        path = fd_paths.get(fd, "")
        if path.startswith(f"{table_dir}/parts/") and path.endswith(".parquet"):
            # The part's bytes are counted by now: its manifest can be written before it is durable.
            assert manifest_in_place.wait(30), "the manifest waited for the part's fsync"
            real_fsync(fd)
            note("part fsync")
            return
        real_fsync(fd)

    def recording_replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        if os.fspath(dst).startswith(f"{table_dir}/runs/"):
            note("manifest in place")
            manifest_in_place.set()
        elif os.fspath(dst).startswith(f"{table_dir}/parts/"):
            note("part in place")

    real_commit = store.catalog.commit_many

    def recording_commit(*args: object, **kwargs: object) -> object:
        note("commit")
        return real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "fsync", held_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    monkeypatch.setattr(store.catalog, "commit_many", recording_commit)
    for run in range(10):
        events.clear()
        manifest_in_place.clear()
        store.append("t", pa.table({"id": [run + 1]}))
        assert events == ["manifest in place", "part fsync", "part in place", "commit"], events
    monkeypatch.undo()
    assert store.table("t").count() == 11


def test_a_run_of_many_parts_commits_after_every_part_is_in_place(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path / "store")
    store.create_table("t")
    events: list[str] = []
    lock = threading.Lock()
    real_replace = os.replace
    parts_dir = str(tmp_path / "store" / "tables" / "t" / "parts")

    def recording_replace(src: str, dst: str) -> None:
        real_replace(src, dst)
        if os.fspath(dst).startswith(parts_dir):
            with lock:
                events.append("part in place")

    real_commit = store.catalog.commit_many

    def recording_commit(*args: object, **kwargs: object) -> object:
        with lock:
            events.append("commit")
        return real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", recording_replace)
    monkeypatch.setattr(store.catalog, "commit_many", recording_commit)
    for run in range(5):
        events.clear()
        with store.table("t").transaction() as txn:
            for piece in range(6):
                txn.stage(pa.table({"id": [run * 10 + piece]}))
        assert events == ["part in place"] * 6 + ["commit"], events
    monkeypatch.undo()
    assert store.table("t").count() == 30
    store.close()


def test_a_part_fsync_failing_after_its_bytes_were_counted_lands_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(tmp_path / "store")
    store.append("t", pa.table({"id": [0]}))
    before = store.table("t").refresh().commit_seq
    parts_dir = tmp_path / "store" / "tables" / "t" / "parts"
    runs_dir = tmp_path / "store" / "tables" / "t" / "runs"
    on_disk_before = set(parts_dir.iterdir()) | set(runs_dir.iterdir())
    real_fsync, real_open = os.fsync, os.open
    fd_paths: dict[int, str] = {}

    def recording_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        fd = real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]
        fd_paths[fd] = os.fspath(path)
        return fd

    def failing_fsync(fd: int) -> None:
        path = fd_paths.get(fd, "")
        if path.startswith(str(parts_dir)) and path.endswith(".parquet"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StagingFailed, match="Input/output error"):
        store.append("t", pa.table({"id": [1, 2]}))
    monkeypatch.undo()
    assert store.table("t").refresh().commit_seq == before
    assert store.table("t").count() == 1
    assert set(parts_dir.iterdir()) | set(runs_dir.iterdir()) == on_disk_before
    store.append("t", pa.table({"id": [1, 2]}))  # the same rows land once the disk is well
    assert store.table("t").count() == 3
    store.close()
