"""A local store root and local inputs are listed through ``os``, not fsspec (issue 17: fsspec's
imports were a no-op run's largest cost after pyarrow's). What they list must be what fsspec's local
filesystem lists: the same keys, sizes and times, the same glob matches."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pytest
from contextful.engine.land.files import _local_glob
from contextful.storage.objects import ObjectStore

TREE = ["a.ndjson", "b.ndjson", ".hidden.ndjson", "c.csv", "sub/d.ndjson", "sub/.e.ndjson", "sub/deep/f.ndjson",
        "sub/deep/g.csv", "x1.json", "x22.json", ".tmp-abc-part.parquet"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for at, name in enumerate(TREE):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (at + 1))
    (root / "empty").mkdir()
    return root


def test_listing_a_local_root_answers_what_fsspec_answers(tree: Path) -> None:
    store = ObjectStore(str(tree))
    fs = fsspec.filesystem("file")
    for prefix in ("", "sub", "sub/deep", "empty", "missing", "a.ndjson"):
        found = {(o.key, o.size, o.modified) for o in store.list(prefix)}
        base = f"{store.root}/{prefix}"
        expected = set()
        if fs.exists(base):
            for path, info in fs.find(base, detail=True).items():
                if info["type"] != "directory":
                    expected.add((store.key_of(path), info["size"], datetime.fromtimestamp(info["mtime"], tz=UTC)))
        assert found == expected, prefix
        assert store.children(prefix) == (sorted(p.rsplit("/", 1)[-1] for p in fs.ls(base, detail=False))
                                          if fs.isdir(base) else [])
    assert store.exists("sub/deep/f.ndjson") and not store.exists("sub/nothing")
    assert store.get_bytes("c.csv") == (tree / "c.csv").read_bytes()
    store.delete(["c.csv", "c.csv", "never-there"])  # one already gone counts as deleted
    assert not (tree / "c.csv").exists()


@pytest.mark.parametrize("pattern", ["*.ndjson", "**/*.ndjson", "sub/**", "**", "x?.json", "x[0-9]*.json",
                                     "sub/*/*.csv", "*", "nothing*", "sub/*.ndjson"])
def test_a_local_glob_matches_what_fsspec_matches(tree: Path, pattern: str) -> None:
    os.symlink(tree / "a.ndjson", tree / "sub" / "link.ndjson")  # inputs may be links; a store holds none
    fs = fsspec.filesystem("file")
    expected = {p: info for p, info in fs.glob(f"{tree}/{pattern}", detail=True).items() if info["type"] != "directory"}
    found = {p: info for p, info in _local_glob(f"{tree}/{pattern}").items() if info["type"] != "directory"}
    assert sorted(found) == sorted(expected)
    for path, info in found.items():  # what an input's fingerprint reads
        assert (info["size"], info["mtime"]) == (expected[path]["size"], expected[path]["mtime"]), path
