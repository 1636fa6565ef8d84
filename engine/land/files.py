"""The ``files`` source: local or fsspec paths and globs, one input per file, and its cursor.

Config (``[pipeline.source.config]``)::

    paths = ["data/*.ndjson.gz", "s3://bucket/exports/2026-*.parquet"]   # required
    format = "ndjson"        # optional: ndjson | json | csv | parquet (default: by extension)

Relative paths resolve against the project directory. Each matching file is one input, pulled in
name order. The pipeline's cursor remembers each landed input (the rule "positions skip and
repeat nothing"):

- **identity**: an input under the project directory is named by its path relative to it
  (``raw/a.ndjson``), so moving the project moves nothing; any other input by its address;
- **content**: a local file by an xxh3-128 hash of its bytes (size and mtime cannot be trusted: a
  rewrite may keep both); a remote object by its ETag (or Content-MD5 or Digest), an HTTP file
  without one by its Last-Modified. A landed local file is hashed again only when its ``stat``
  (size, mtime, ctime and inode, as the entry recorded them) changed: no program sets a ctime
  back, so an unchanged ``stat`` is unchanged content, and a run reads the bytes of new and
  touched files only, never the whole history of landed ones;
- **a renamed input** (no entry under its name, and its content hash or ETag is a landed input's
  whose name is gone) does not land again: its entry moves to the new name;
- **an appended input**: an uncompressed NDJSON file whose first bytes hash as the landed ones
  lands only the bytes after them;
- **any other change** fails that input alone with :class:`InputChanged` naming it and the ways
  out; nothing of it lands and its entry stays. A pipeline that re-lands changed inputs (``reland``:
  a ``merge`` or ``replace`` write disposition, ``engine.land.disposition``) pulls it whole instead;
- **a cursor of the old form** (absolute path to ``"size:mtime"``) carries forward: an input whose
  old entry names it (by its path, or a path ending in its project-relative name: a moved project)
  with the same size and mtime counts as landed and takes the new form; a different size or mtime
  fails the input with :class:`InputChanged` (what changed cannot be told).

The cursor value is ``{"kind": "files", "inputs": {name: {"size", "content", "stat"}}}`` (``stat``
for local regular files; entries written before it are hashed once and take it).
"""

from __future__ import annotations

import glob
import os
import re
import stat
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash
from contextful.engine.land.csv_options import CSV_KEYS, csv_options
from contextful.engine.land.decode import detect_format
from contextful.engine.land.decode_wire import local_path, split_compression
from contextful.storage.errors import (
    ContextfulError,
    InputChanged,
    InputNotFound,
    InputUnreadable,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import fsspec
else:
    fsspec = lazy_module("fsspec")

CONFIG_KEYS = ("paths", "format", *CSV_KEYS)
FORMATS = ("ndjson", "json", "csv", "parquet")
_READ = 1 << 20
_BLANK_LINE = re.compile(rb"^[ \t\r]*\n", re.MULTILINE)
_REMOTE_CONTENT = ("ETag", "etag", "Content-MD5", "Digest", "Last-Modified", "LastModified", "mtime")


@dataclass(frozen=True)
class InputFile:
    path: str
    """The input's address (absolute local path or URL)."""
    name: str
    """What the cursor names it by: its path relative to the project directory when it is under it."""
    size: int
    tag: str | None
    """A remote object's ``etag:``/``md5:``/``digest:``/``modified:`` tag, a pipe's ``stamp:``; None
    for a regular local file, hashed when its :attr:`content` is first asked for."""
    stamp: str
    """``size:mtime`` (or ``size:ETag``) as the cursors of the old form held it."""
    regular: bool = True
    """A regular local file or an object (not a pipe): it can be hashed and read from an offset."""
    offset: int = 0
    """Bytes already landed: a run reads from here (an appended NDJSON input)."""
    stat: str | None = None
    """A regular local file's ``size:mtime_ns:ctime_ns:inode``: equal to its entry's, the content is."""

    @cached_property
    def content(self) -> str:
        """What identifies its content: ``xxh3:<hash>`` of a local file's bytes, or :attr:`tag`."""
        if self.tag is not None:
            return self.tag
        local = local_path(self.path)
        assert local is not None
        head, whole = file_hash(local, self.size)  # the bytes listed: a run reads no further
        return f"xxh3:{head or whole}"

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"size": self.size, "content": self.content}
        if self.stat is not None:
            entry["stat"] = self.stat
        return entry

    def records_landed(self) -> int:
        """The NDJSON records (lines holding more than blanks) in the bytes already landed
        (:attr:`offset`, which ends a line): what a row counted in the bytes a run read adds to be
        counted in the file. Read again from the start, on a failure's path only."""
        local = local_path(self.path)
        assert local is not None and self.offset
        count, carry, left = 0, b"", self.offset
        with open(local, "rb") as f:
            while left > 0 and (block := f.read(min(_READ, left))):  # bounded blocks of the landed prefix
                left -= len(block)
                data = carry + block
                cut = data.rfind(b"\n") + 1
                whole, carry = data[:cut], data[cut:]
                count += whole.count(b"\n") - len(_BLANK_LINE.findall(whole))
        return count

    def window(self) -> tuple[int, int] | None:
        """The bytes a run reads of a regular uncompressed local file: from ``offset`` to the listed
        size, so bytes appended meanwhile wait for the next run (None: the whole input)."""
        if not self.regular or local_path(self.path) is None or split_compression(self.path)[1] is not None:
            return None
        return self.offset, self.size


@dataclass(frozen=True)
class InputPlan:
    pull: list[InputFile]
    """Inputs to land: new ones whole, appended ones from their offset."""
    skip: list[InputFile]
    """Inputs landed in this form (under this name or, renamed, another)."""
    changed: list[tuple[InputFile, InputChanged]]
    """Inputs whose landed form changed otherwise: each fails by name."""
    cursor: dict[str, Any]
    """The cursor's inputs with what this plan learned (renames, old entries carried forward)."""


def check_config(where: str, config: dict[str, Any]) -> list[ContextfulError]:
    problems: list[ContextfulError] = [ManifestKeyUnknown(where, k, CONFIG_KEYS) for k in config if k not in CONFIG_KEYS]
    paths = config.get("paths")
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        problems.append(ManifestValueInvalid(where, "paths", "must be a path or glob, or a non-empty list of them"))
    fmt = config.get("format")
    if fmt is not None and fmt not in FORMATS:
        problems.append(ManifestValueInvalid(where, "format", f"{fmt!r} is not one of {', '.join(FORMATS)}"))
    problems += csv_options(where, config)[1]
    if fmt not in (None, "csv") and (named := [k for k in CSV_KEYS if k in config]):
        problems.append(ManifestValueInvalid(where, named[0], f"is a CSV option; format is {fmt!r}"))
    return problems


def _patterns(config: dict[str, Any], root: Path) -> list[str]:
    paths = config["paths"]
    paths = [paths] if isinstance(paths, str) else paths
    return [p if "://" in p or Path(p).is_absolute() else str(root / p) for p in paths]


def unmatched_warnings(pipeline: str, config: dict[str, Any], root: Path) -> list[str]:
    """What validate says of each local ``paths`` entry matching no file (a glob: the run lands
    nothing from it; a literal path: the run fails InputNotFound). Remote entries are not listed:
    validate stays offline."""
    written = config.get("paths")
    written = [written] if isinstance(written, str) else list(written or [])
    warnings = []
    for entry, pattern in zip(written, _patterns(config, root)):
        local = local_path(pattern)
        if local is None:
            continue
        glob = any(ch in local for ch in "*?[")
        if glob and not any(info.get("type") != "directory" for info in _local_glob(local).values()):
            warnings.append(f"pipeline {pipeline!r}: paths entry {entry!r} matches no file under {root}; a run "
                            "lands nothing from it")
        elif not glob and not os.path.exists(local):
            warnings.append(f"pipeline {pipeline!r}: paths entry {entry!r} names no file under {root}; a run fails "
                            "with InputNotFound")
    return warnings


def list_inputs(config: dict[str, Any], root: Path) -> list[InputFile]:
    """Every file the config names, in path order, fingerprinted; a literal path that is missing raises."""
    found: dict[str, InputFile] = {}
    for pattern in _patterns(config, root):
        protocol = pattern.split("://", 1)[0] if "://" in pattern else None
        local = local_path(pattern)
        if local is not None:
            matches = _local_glob(local) if _is_glob(local) else _local_file(local, pattern)
        else:
            fs, _, _ = fsspec.get_fs_token_paths(pattern)
            if not _is_glob(pattern):
                if not fs.exists(pattern):
                    raise InputNotFound(pattern)
                matches = {pattern: fs.info(pattern)}
            else:
                matches = fs.glob(pattern, detail=True)
        for path, info in matches.items():
            if info.get("type") == "directory":
                continue
            address = f"{protocol}://{path}" if protocol and "://" not in path else path
            found[address] = _input(address, info, root)
    return [found[k] for k in sorted(found)]


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _local_info(path: str, listed: bool = False) -> dict[str, Any]:
    """What fsspec's local filesystem says of ``path`` that an input reads: size, mtime and type
    (symbolic links followed; a link a glob ``listed`` carries its own mtime, as fsspec's listing
    reports it, so a fingerprint read from it stays the same)."""
    status = os.stat(path)
    kind = "directory" if stat.S_ISDIR(status.st_mode) else "file" if stat.S_ISREG(status.st_mode) else "other"
    mtime = os.lstat(path).st_mtime if listed and os.path.islink(path) else status.st_mtime
    return {"name": path, "size": status.st_size, "mtime": mtime, "type": kind}


def _local_file(path: str, pattern: str) -> dict[str, dict[str, Any]]:
    try:
        return {path: _local_info(path)}
    except FileNotFoundError:
        raise InputNotFound(pattern) from None


def _local_glob(pattern: str) -> dict[str, dict[str, Any]]:
    """The local paths ``pattern`` matches, as fsspec's local glob matches them (hidden names
    included, ``**`` any number of directories), without importing fsspec (a no-op run's
    fixed cost)."""
    found = {}
    for path in glob.iglob(pattern, recursive=True, include_hidden=True):
        try:
            found[path.rstrip("/") or path] = _local_info(path, listed=True)
        except FileNotFoundError:  # removed since the listing saw it
            continue
    return found


def _input(address: str, info: dict[str, Any], root: Path) -> InputFile:
    size = int(info.get("size") or 0)
    tag = info.get("ETag") or info.get("etag") or info.get("mtime", info.get("LastModified", ""))
    stamp = f"{info.get('size')}:{tag}"  # the old form's fingerprint, read once to carry it forward
    local = local_path(address)
    if local is None:
        found = next(((k, info[k]) for k in _REMOTE_CONTENT if info.get(k)), None)
        kind = {"Content-MD5": "md5", "Digest": "digest", "Last-Modified": "modified",
                "LastModified": "modified", "mtime": "modified"}.get(found[0], "etag") if found else "size"
        return InputFile(address, address, size, f"{kind}:{found[1] if found else size}", stamp)
    status = os.stat(local)
    regular = stat.S_ISREG(status.st_mode)
    try:
        name = Path(local).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        name = address
    if not regular:  # a pipe is read once, never hashed
        return InputFile(address, name, size, f"stamp:{stamp}", stamp, regular)
    return InputFile(address, name, size, None, stamp, regular,
                     stat=f"{status.st_size}:{status.st_mtime_ns}:{status.st_ctime_ns}:{status.st_ino}")


def file_hash(path: str, prefix: int | None = None) -> tuple[str | None, str]:
    """xxh3-128 of the file's first ``prefix`` bytes (None when it is shorter) and of all of it."""
    hasher = xxhash.xxh3_128()
    head: str | None = None
    read = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_READ):
            if prefix is not None and read <= prefix < read + len(chunk):
                hasher.update(chunk[: prefix - read])
                head = hasher.copy().hexdigest()
                hasher.update(chunk[prefix - read:])
            else:
                hasher.update(chunk)
            read += len(chunk)
    if prefix is not None and prefix == read:
        head = hasher.hexdigest()
    return head, hasher.hexdigest()


def plan_inputs(inputs: list[InputFile], stored: dict[str, Any], fmt: str | None, *, reland: bool = False,
                pipeline: str | None = None) -> InputPlan:
    """What to pull, skip and refuse of ``inputs`` against the cursor's ``stored`` inputs of
    ``pipeline``; with ``reland`` a changed input is pulled whole, not refused."""
    cursor = dict(stored)
    names = {i.name for i in inputs}
    pull: list[InputFile] = []
    skip: list[InputFile] = []
    changed: list[tuple[InputFile, InputChanged]] = []
    # a landed entry whose name is gone, by its content: where a renamed input came from
    gone: dict[tuple[int, str], list[str]] = {}
    for n, e in stored.items():
        if isinstance(e, dict) and n not in names and not e["content"].startswith(("stamp:", "size:", "modified:")):
            gone.setdefault((e["size"], e["content"]), []).append(n)
    gone_sizes = {size for size, _ in gone}  # a new input of another size is hashed only when it lands
    old = {n: e for n, e in stored.items() if isinstance(e, str)}  # the old form: address -> "size:mtime"
    for item in inputs:
        entry = stored.get(item.name)
        legacy = _old_entry(item, old)
        if isinstance(entry, dict):
            outcome = _against(item, entry, fmt, pipeline)
        elif legacy is not None:
            address, stamp = legacy
            del cursor[address]
            if stamp == item.stamp:
                outcome = None  # the old cursor held it as it is: landed; it takes the new form
            else:
                if not reland:  # refused: its old entry stays; re-landed: its new entry replaces it
                    cursor[address] = stamp
                outcome = InputChanged(item.path, f"the cursor (written before content fingerprints) holds it as "
                                                  f"size:mtime {stamp}, it now reads {item.stamp}: whether it "
                                                  "changed cannot be told", pipeline)
        elif item.size in gone_sizes and gone.get((item.size, item.content)):
            del cursor[gone[(item.size, item.content)].pop()]  # renamed: landed under its old name
            outcome = None
        else:
            pull.append(item)
            continue
        if outcome is None:
            untouched = isinstance(entry, dict) and item.stat is not None and entry.get("stat") == item.stat
            cursor[item.name] = entry if untouched else item.entry()
            skip.append(item)
        elif isinstance(outcome, InputFile):
            pull.append(outcome)
        elif reland:  # read again whole: its rows merge by key, or the run replaces the table
            pull.append(item)
        else:
            changed.append((item, outcome))
    return InputPlan(pull, skip, changed, cursor)


def plan_replace(inputs: list[InputFile], plan: InputPlan, stored: dict[str, Any]) -> InputPlan:
    """``plan`` (made with ``reland``) under ``write_disposition = "replace"``: when any input is new,
    changed or gone, every input whole (their rows become the table, and the cursor holds them
    alone); else none. No input at all pulls none either: a source that lists nothing never
    empties the table (``engine.land.disposition``)."""
    if not inputs or (not plan.pull and set(stored) == {i.name for i in inputs}):
        return InputPlan([], list(inputs), [], plan.cursor)  # touched-but-same inputs keep their new stat
    return InputPlan([replace(i, offset=0) for i in inputs], [], [], {})


def _old_entry(item: InputFile, old: dict[str, str]) -> tuple[str, str] | None:
    """The old-form entry naming ``item``: its address, or one ending in its project-relative name."""
    if item.path in old:
        return item.path, old.pop(item.path)
    for address in old:  # entries of the old form only: gone once a run carries them forward
        if item.name != item.path and address.endswith("/" + item.name):
            return address, old.pop(address)
    return None


def _against(item: InputFile, entry: dict[str, Any], fmt: str | None,
             pipeline: str | None) -> InputFile | InputChanged | None:
    """``item`` against its landed entry: None (the same), the part to pull, or why it is refused."""
    if item.stat is not None and entry.get("stat") == item.stat:
        return None  # untouched since it landed: not read again
    if entry["size"] == item.size and entry["content"] == item.content:
        return None
    landed = int(entry["size"])
    local = local_path(item.path)
    if (item.size > landed and local is not None and item.regular and entry["content"].startswith("xxh3:")
            and _appendable(item.path, fmt)):
        head, _ = file_hash(local, landed)
        if head is not None and f"xxh3:{head}" == entry["content"]:
            return replace(item, offset=landed)
    what = ("its first bytes differ from the landed ones" if item.size > landed
            else f"it holds {item.size} byte(s) where {landed} landed" if item.size != landed
            else f"its content is {item.content}, the landed one {entry['content']}")
    return InputChanged(item.path, f"it changed since it landed ({what}); only bytes appended to an "
                                   "uncompressed NDJSON file land by themselves", pipeline)


def _appendable(path: str, fmt: str | None) -> bool:
    if split_compression(path)[1] is not None:
        return False
    try:
        return (fmt or detect_format(path)) == "ndjson"
    except InputUnreadable:
        return False
