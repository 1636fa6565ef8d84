"""What an applied version holds beside its declarations: the ``[snapshot]`` table of its file.

An applied version (``engine.control.apply``) is the manifest document as applied plus one table
no working ``contextful.toml`` may declare, written by import and a full apply::

    [snapshot]
    format = 1

    [snapshot.models]              # each [[model]] declaring sql_file: that file's text, inlined
    daily = "SELECT day, count(*) AS n FROM events GROUP BY day"

    [snapshot.tables.scores]       # standalone table contracts (engine.control.contracts)
    authority = "job:score"

``surface.fire.model-snapshot``: a version read back runs the SQL it was applied with, whatever the
file holds now (the file's name stays the model's ``sql_file``, for errors). ``surface.fire.standalone-snapshot``:
the table contracts captured at import and full apply. A pipelines-only apply copies the applied
version's ``[snapshot]`` table as it is, absent included: it regenerates nothing from the working
project (docs/control.md, "What a version holds").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KEY = "snapshot"
"""The reserved top-level key of a version file."""
FORMAT = 1


@dataclass(frozen=True)
class AppliedSnapshot:
    """The metadata of the applied version a manifest was read from (``Manifest.applied``)."""

    version: int
    models: Mapping[str, str] = field(default_factory=dict)
    """Model name -> the SQL its ``sql_file`` held when the version was claimed."""
    tables: Mapping[str, Mapping[str, Any]] | None = None
    """Standalone table contracts by table name; None when the version holds none (claimed before
    contracts were captured, or a pipelines-only apply over such a version)."""
    present: bool = True
    """Whether the version file holds a ``[snapshot]`` table at all."""

    @classmethod
    def read(cls, version: int, meta: Any) -> AppliedSnapshot:
        """The metadata ``meta`` (the file's ``[snapshot]`` table, None when absent) of ``version``."""
        if not isinstance(meta, dict):
            return cls(version, present=False)
        models = meta.get("models")
        tables = meta.get("tables")
        return cls(version,
                   models={k: v for k, v in models.items() if isinstance(v, str)} if isinstance(models, dict) else {},
                   tables=tables if isinstance(tables, dict) else None)


def split(doc: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A version file's document as its declarations and its ``[snapshot]`` table (None: absent)."""
    declared = {k: v for k, v in doc.items() if k != KEY}
    meta = doc.get(KEY)
    return declared, meta if isinstance(meta, dict) else None


def metadata(models: Mapping[str, str], tables: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``[snapshot]`` table import and a full apply write."""
    meta: dict[str, Any] = {"format": FORMAT}
    if models:
        meta["models"] = dict(sorted(models.items()))
    if tables is not None:
        meta["tables"] = dict(sorted(tables.items()))
    return meta
