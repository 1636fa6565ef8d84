"""Commits as data: typed requirements checked at the table head, and typed updates applied.

A commit is a list of updates plus the requirements that must hold at the head when it lands.
The catalog checks every requirement and applies every update inside one transaction whose last
step advances the table head's ``commit_seq`` by one (the compare-and-swap). The shapes follow
pyiceberg's ``AssertTableUUID``/``AddSnapshotUpdate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contextful.storage.fence import WriterFence
from contextful.storage.follows import Follows

# --- requirements ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AssertTableUUID:
    """The table is the incarnation the commit was staged against."""

    uuid: str


@dataclass(frozen=True)
class AssertHeadSeq:
    """The head is still at ``commit_seq`` (replacing commits and folds)."""

    commit_seq: int


@dataclass(frozen=True)
class AssertSchemaId:
    """The head schema is still the one the staged parts were reconciled against."""

    schema_id: int


@dataclass(frozen=True)
class AssertPartsLive:
    """Every named part is still live at the head (folds replacing them)."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class AssertRecordsPending:
    """Every named run record is still unflushed (flushing the run-record cache)."""

    keys: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class AssertStaging:
    """The run still holds its staging lease (``storage.staging``): collection has not taken it for
    abandoned, so every part and the manifest it staged are still there. A run that stalled past its
    lease (a stopped process, a paused host) would otherwise publish parts collection deleted."""

    run_id: str


@dataclass(frozen=True)
class AssertWriter:
    """The execution attempt the commit is made for still owns its execution (``storage.fence``):
    its owner row is pending, held by the fence's holder at the fence's attempt. Checked in the
    commit transaction; a failure is ExecutionWriterFenced and nothing of the commit is visible."""

    fence: WriterFence


Requirement = (AssertTableUUID | AssertHeadSeq | AssertSchemaId | AssertPartsLive | AssertRecordsPending
               | AssertStaging | AssertWriter)

# --- updates -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartFile:
    """One immutable Parquet part as it is staged and as the catalog indexes it."""

    path: str
    """Key of the part under the store root."""
    rows: int
    bytes: int
    ord_seq: int | None = None
    """Merge order: the commit whose rows the part holds (a fold keeps the newest it absorbed)."""
    ord_idx: int = 0
    """Merge order within ``ord_seq``: the part's position in its run."""
    exact_schema: bool = True
    """Whether the part was written in exactly the schema its commit lands (else a reader casts)."""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "bytes": self.bytes}


@dataclass(frozen=True)
class AddParts:
    """Parts joining the live set; apply after any SetSchema of the same commit."""

    parts: tuple[PartFile, ...]


@dataclass(frozen=True)
class RemoveParts:
    paths: tuple[str, ...]


@dataclass(frozen=True)
class RemoveAllParts:
    """Every part live at the head stops being live (a replacing run)."""


@dataclass(frozen=True)
class SetSchema:
    schema: str
    """The Arrow schema, serialized by :func:`storage.manifest.schema_to_text`."""


@dataclass(frozen=True)
class SetCursor:
    scope: str
    value: Any


@dataclass(frozen=True)
class RecordRun:
    """A run-record row for the catalog's cache in front of ``_runs``."""

    run_id: str
    phase: str
    table: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MarkRecordsFlushed:
    """The cached run records ``keys``, appended to ``_runs`` by this commit, leave the cache."""

    keys: tuple[tuple[str, str], ...]
    payloads: tuple[str, ...] = ()
    """The payload text each row was flushed with, in ``keys`` order (empty: whatever is cached): a
    row re-recorded since the flush read it stays in the cache, pending, so a later flush lands its
    newer payload and ``_runs`` always answers the latest payload of every key the cache lacks."""


@dataclass(frozen=True)
class DeclareOrderBy:
    """The table, keyed on ``primary_key`` and merging by commit order until now, merges by
    ``order_by`` from this commit on (a conflict when a declaration landed first)."""

    primary_key: tuple[str, ...]
    order_by: str


@dataclass(frozen=True)
class DeclareFollows:
    """The table's rows follow the row versions of the root table ``follows.root`` from this commit on
    (``storage.follows``; a conflict when a declaration landed first)."""

    follows: Follows


Update = (AddParts | RemoveParts | RemoveAllParts | SetSchema | SetCursor | RecordRun | MarkRecordsFlushed
          | DeclareOrderBy | DeclareFollows)


@dataclass(frozen=True)
class CommitRequest:
    """Everything one commit lands on one table."""

    table: str
    run_id: str
    kind: str
    """append, replace, fold or declare."""
    manifest: str | None
    """Key of the run manifest (None for a commit without one): written before the commit, or kept
    in the catalog with it when ``manifest_doc`` is given."""
    requirements: tuple[Requirement, ...]
    updates: tuple[Update, ...]
    rows: int = 0
    manifest_doc: str | None = None
    """The manifest's JSON, kept in the catalog by this commit (a small run's; ``storage.manifest``)."""
