"""A local write makes every directory it creates durable in its parent.

A file is durable after a power loss only if its own directory entry is (the directory fsynced) and
every directory on its path is too: a directory the write created (an execution's first journal
step makes ``journal/<execution_id>/``) must be fsynced into its parent, or the recorded step can
vanish with it and its effect be redone. ``os.fsync`` cannot be observed from outside a process
without tracing, so the object store takes the flush function as a seam, and these tests record the
directories it flushed, by path, while calling through to the real ``os.fsync``.
"""

from __future__ import annotations

import os
from pathlib import Path

from contextful.storage.journal.files import FileJournalStore
from contextful.storage.objects import ObjectStore


class FlushLog:
    """``os.fsync`` that records which directories it flushed."""

    def __init__(self) -> None:
        self.directories: list[str] = []

    def __call__(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            self.directories.append(path)
        os.fsync(fd)


def test_a_first_journal_step_makes_its_execution_directory_durable(tmp_path: Path) -> None:
    flushed = FlushLog()
    journal = FileJournalStore(ObjectStore(str(tmp_path / "store"), fsync=flushed))
    owner = journal.claim("orders", "plan", "h1", 0, 60_000_000)
    flushed.directories.clear()
    journal.record(owner.execution_id, 0, "step 0", b"value", 1)
    step_dir = tmp_path / "store" / "journal" / owner.execution_id
    assert (step_dir / "00000000.json").is_file()
    assert str(step_dir) in flushed.directories  # the step's entry in its new directory
    assert str(step_dir.parent) in flushed.directories  # the new directory's entry in journal/
    flushed.directories.clear()
    journal.record(owner.execution_id, 1, "step 1", b"value", 2)
    assert flushed.directories == [str(step_dir)]  # a directory already there is not flushed again


def test_every_level_a_write_creates_is_flushed_into_its_parent(tmp_path: Path) -> None:
    flushed = FlushLog()
    objects = ObjectStore(str(tmp_path / "a" / "store"), fsync=flushed)
    assert flushed.directories == [str(tmp_path / "a"), str(tmp_path)]  # the root made, level by level
    flushed.directories.clear()
    objects.put_bytes("tables/t/runs/r1.json", b"{}")
    root = tmp_path / "a" / "store"
    assert set(flushed.directories) == {str(root / "tables" / "t" / "runs"), str(root / "tables" / "t"),
                                         str(root / "tables"), str(root)}
    flushed.directories.clear()
    assert objects.put_if_absent("blobs/ab/abcdef", b"blob")
    assert set(flushed.directories) == {str(root / "blobs" / "ab"), str(root / "blobs"), str(root)}


def test_a_cache_write_flushes_nothing(tmp_path: Path) -> None:
    """``durable=False`` (a working copy's cache of the bucket) pays no fsync, directories included."""
    flushed = FlushLog()
    objects = ObjectStore(str(tmp_path / "store"), fsync=flushed)
    flushed.directories.clear()
    objects.put_bytes("tables/t/parts/p.parquet", b"x", durable=False)
    assert flushed.directories == []
    assert (tmp_path / "store" / "tables" / "t" / "parts" / "p.parquet").read_bytes() == b"x"
