"""The ``files`` source: local or fsspec paths and globs, one input per file.

Config (``[pipeline.source.config]``)::

    paths = ["data/*.ndjson.gz", "s3://bucket/exports/2026-*.parquet"]   # required
    format = "ndjson"        # optional: ndjson | json | csv | parquet (default: by extension)

Relative paths resolve against the project directory. Each matching file is one input, pulled in
name order; an input's fingerprint (size and modification time, or the object's ETag) is what the
pipeline's cursor remembers, so a re-run pulls only inputs it has not landed in that form.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from storage.errors import ContextfulError, InputNotFound, ManifestKeyUnknown, ManifestValueInvalid

CONFIG_KEYS = ("paths", "format")
FORMATS = ("ndjson", "json", "csv", "parquet")


@dataclass(frozen=True)
class InputFile:
    path: str
    """The input's address (absolute local path or URL)."""
    size: int
    fingerprint: str
    """What identifies this version of the file: size and mtime, or ETag."""


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
    return problems


def _patterns(config: dict[str, Any], root: Path) -> list[str]:
    paths = config["paths"]
    paths = [paths] if isinstance(paths, str) else paths
    return [p if "://" in p or Path(p).is_absolute() else str(root / p) for p in paths]


def list_inputs(config: dict[str, Any], root: Path) -> list[InputFile]:
    """Every file the config names, in path order; a literal path that is missing raises."""
    found: dict[str, InputFile] = {}
    for pattern in _patterns(config, root):
        fs, _, _ = fsspec.get_fs_token_paths(pattern)
        protocol = pattern.split("://", 1)[0] if "://" in pattern else None
        if not any(ch in pattern for ch in "*?["):
            if not fs.exists(pattern):
                raise InputNotFound(pattern)
            matches = {pattern: fs.info(pattern)}
        else:
            matches = fs.glob(pattern, detail=True)
        for path, info in matches.items():
            if info.get("type") == "directory":
                continue
            address = f"{protocol}://{path}" if protocol and "://" not in path else path
            tag = info.get("ETag") or info.get("etag") or f"{info.get('mtime', info.get('LastModified', ''))}"
            found[address] = InputFile(address, int(info.get("size") or 0), f"{info.get('size')}:{tag}")
    return [found[k] for k in sorted(found)]
