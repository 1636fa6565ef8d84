"""Passages and marker rows: what a unit lands in the derive output table(s).

Implements ``run.emit.unit-status``, ``run.emit.marker-row``, ``run.emit.host-rows``,
``run.emit.output-tables`` (a unit's part), ``run.emit.output-modality``,
``run.bind.confidence-range`` and, for rows, ``run.emit.derivation-key`` (decisions
"derive-work-set", "derivation-key-decides", "passage-s-modality", "host-registered-derive").

A unit's *answer* is what its engine (or host task) returned, parsed once and journaled as the
unit's step (``engine.derive.run``), so a resumed run lands the same rows without asking again::

    {"status": "ok" | "empty" | "unavailable" | "failed",
     "passages": [{"text", "start_s", "end_s", "confidence", "uri", "zone", "modality", ...}],
     "error": {"name", "detail", "retry"} | null, "warnings": [...]}

A built-in task's unit lands its passages (``kind = 'passage'``, ``cue_seq`` 0, 1, ...,
``unit_status = 'ok'``) or, yielding none, exactly one marker row (``cue_seq = -1``,
``kind = 'marker'``) carrying its status, attempts, last error and whether it retries. Each row's
``passage_id`` (:func:`passage_id`) is unique in its table: a chained derive pipeline names it as its
``parent_id_column`` and derives the parent's passages (never its markers). A host
task's unit lands its content rows (``kind = 'passage'``, ``unit_status = 'ok'``, its unit_ref,
derivation_key and task_version) and one marker row in the marker table, ``ok`` over content rows,
``empty`` over none. Every row carries the unit's ``derivation_key``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pyarrow as pa
from contextful.engine.derive.config import PASSAGE_FIELDS, RESERVED_COLUMNS
from contextful.storage.errors import (
    ContextfulError,
    DeriveConfidenceOutOfRange,
    DeriveReservedDiscriminator,
    DeriveUnitStatusUnknown,
    ModalityInvalid,
    TransientError,
)
from contextful.storage.reserved import MODALITIES, MODALITY_COLUMN

UNIT_STATUSES = ("ok", "empty", "unavailable", "failed")
PASSAGE, MARKER = "passage", "marker"
MARKER_SEQ = -1
ERROR_TEXT_BYTES = 1024
"""A marker's last_error is capped (the full text is in the run's log)."""
MARKER_MODALITY = "structured"
"""A marker row's ``_modality``: it carries the unit's state, not derived content."""
KEY_COLUMNS = ("unit_ref", "derivation_key", "cue_seq")
"""The output tables' primary key: a re-landed unit's rows collapse by key."""
ENGINE_COLUMNS = ("unit_ref", "derivation_key", "task_version", "cue_seq", "passage_id", "unit_status")
"""Columns the engine sets on every row; a host task's rows may not carry them."""


@dataclass
class Answer:
    status: str
    passages: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """A host task's content rows per table (built-in tasks use ``passages``)."""

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "passages": self.passages, "error": self.error, "warnings": self.warnings,
                "tables": self.tables}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Answer:
        return cls(value["status"], list(value.get("passages") or []), value.get("error"),
                   list(value.get("warnings") or []), dict(value.get("tables") or {}))


def failed(exc: BaseException, *, retry: bool | None = None) -> Answer:
    """A unit that failed on ``exc`` (its text masked); it retries when the error may pass."""
    from contextful.engine.guard import mask_message

    name = exc.name if isinstance(exc, ContextfulError) else type(exc).__name__
    detail = exc.detail if isinstance(exc, ContextfulError) else str(exc)
    if retry is None:
        retry = isinstance(exc, TransientError) or not isinstance(exc, ContextfulError)
    return Answer("failed", error={"name": name, "detail": mask_message(detail)[:ERROR_TEXT_BYTES], "retry": retry})


def parse_engine_output(engine: str, pipeline: str, unit: str, data: bytes, columns: Sequence[str] = ()) -> Answer:
    """An engine's NDJSON answer (docs/derive.md): passages, or one status line; nothing at all is
    ``unavailable`` (it returned nothing and stated no reason)."""
    passages: list[dict[str, Any]] = []
    warnings: list[str] = []
    status: str | None = None
    reason = None
    keep = set(PASSAGE_FIELDS) | set(columns) | {"modality"}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            return failed(ValueError(f"engine {engine!r} output line {number} is not JSON: {exc}"), retry=False)
        if not isinstance(item, dict):
            return failed(ValueError(f"engine {engine!r} output line {number} is not an object"), retry=False)
        if "status" in item:
            if item["status"] not in UNIT_STATUSES:
                return failed(DeriveUnitStatusUnknown(pipeline, unit, str(item["status"])), retry=False)
            status = item["status"]
            reason = item.get("reason")
            continue
        passage = {k: v for k, v in item.items() if k in keep}
        confidence = passage.get("confidence")
        if confidence is not None and (not isinstance(confidence, (int, float)) or isinstance(confidence, bool)
                                       or math.isnan(confidence) or not 0.0 <= confidence <= 1.0):
            warnings.append(str(DeriveConfidenceOutOfRange(engine, unit, confidence)))
            passage["confidence"] = None
        modality = passage.get("modality", "text")
        if modality not in MODALITIES:
            return failed(ModalityInvalid(pipeline, [str(modality)], MODALITIES), retry=False)
        passages.append(passage)
    if passages:
        return Answer("ok", passages, warnings=warnings)
    if status in ("empty", "unavailable", "failed"):
        error = None if status == "empty" else {"name": f"engine stated {status}",
                                                "detail": str(reason or "no reason given")[:ERROR_TEXT_BYTES],
                                                "retry": True}
        return Answer(status, error=error, warnings=warnings)
    if status == "ok":  # "ok" with no passage establishes nothing to derive
        return Answer("empty", warnings=warnings)
    return Answer("unavailable", warnings=warnings)


def host_answer(pipeline: str, task: str, content_tables: Sequence[str], unit: str,
                returned: Mapping[str, Sequence[Mapping[str, Any]]]) -> Answer:
    """A host task's return value, checked: rows for its content tables alone
    (``run.emit.output-tables``: another table fails that unit alone) and no ``kind`` column."""
    from contextful.storage.errors import DeriveOutputTablesMismatch

    if not isinstance(returned, Mapping):
        return failed(TypeError(f"host task {task!r} returned {type(returned).__name__}, not a mapping of "
                                f"content table -> rows"), retry=False)
    foreign = tuple(sorted(t for t in returned if t not in content_tables))
    if foreign:
        return failed(DeriveOutputTablesMismatch(pipeline, task, foreign, tuple(content_tables), unit=unit), retry=False)
    tables: dict[str, list[dict[str, Any]]] = {}
    for table in content_tables:
        rows = [dict(row) for row in returned.get(table, ())]
        for row in rows:
            reserved = [c for c in row if c.lower() in RESERVED_COLUMNS]
            if reserved:
                return failed(DeriveReservedDiscriminator(pipeline, table, reserved[0]), retry=False)
            engines = [c for c in row if c in ENGINE_COLUMNS]
            if engines:
                return failed(ValueError(f"host task {task!r} returned a {table} row with column {engines[0]!r}, "
                                         f"which the engine sets on every row ({', '.join(ENGINE_COLUMNS)})"),
                              retry=False)
        tables[table] = rows
    status = "ok" if any(tables.values()) else "empty"
    return Answer(status, tables=tables)


# --- rows ------------------------------------------------------------------------------------------


def marker_fields(answer: Answer, attempts: int, max_attempts: int) -> dict[str, Any]:
    """A marker's status, attempts, last error and whether a later run retries it."""
    error = answer.error or {}
    may_pass = answer.status == "unavailable" or (answer.status == "failed" and bool(error.get("retry")))
    retries = may_pass and attempts < max_attempts
    return {"unit_status": answer.status, "attempts": attempts,
            "last_error": f"{error['name']}: {error['detail']}" if error else None, "retry": retries}


def builtin_schema(unit_type: pa.DataType, columns: Sequence[str]) -> pa.Schema:
    """The built-in tasks' output table: key, discriminator, status, passage fields, marker fields."""
    return pa.schema([
        ("unit_ref", unit_type), ("derivation_key", pa.string()), ("task_version", pa.string()),
        ("cue_seq", pa.int64()), ("passage_id", pa.string()), ("kind", pa.string()), ("unit_status", pa.string()),
        ("media", pa.string()),
        ("text", pa.string()), ("start_s", pa.float64()), ("end_s", pa.float64()), ("confidence", pa.float64()),
        ("uri", pa.string()), ("zone", pa.string()), (MODALITY_COLUMN, pa.string()),
        ("attempts", pa.int64()), ("last_error", pa.string()), ("retry", pa.bool_()),
        *[(c, pa.string()) for c in columns if c not in PASSAGE_FIELDS],
    ])


def builtin_rows(unit_ref: Any, key: str, version: str, media: str | None, answer: Answer, attempts: int,
                 max_attempts: int, columns: Sequence[str], *, retained: bool = False) -> list[dict[str, Any]]:
    """A built-in unit's rows: its passages, or one marker row (``retained``: the table keeps each
    task version's rows, so the ids name the version)."""
    id_version = version if retained else None
    base = {"unit_ref": unit_ref, "derivation_key": key, "task_version": version, "media": media}
    if answer.status == "ok" and answer.passages:
        rows = []
        for seq, passage in enumerate(answer.passages):
            row = {**base, "cue_seq": seq, "passage_id": passage_id(unit_ref, seq, id_version), "kind": PASSAGE,
                   "unit_status": "ok", MODALITY_COLUMN: passage.get("modality", "text")}
            for name in (*PASSAGE_FIELDS, *columns):
                if name in passage:
                    value = passage[name]
                    row[name] = value if name in PASSAGE_FIELDS else _text(value)
            rows.append(row)
        return rows
    return [{**base, "cue_seq": MARKER_SEQ, "passage_id": passage_id(unit_ref, MARKER_SEQ, id_version),
             "kind": MARKER, MODALITY_COLUMN: MARKER_MODALITY, **marker_fields(answer, attempts, max_attempts)}]


def passage_id(unit_ref: Any, cue_seq: int, version: str | None = None) -> str:
    """A passage's id, unique in its table: what a chained derive pipeline names as its parent id.

    ``<unit_ref>:<cue_seq>``, and under ``retain_versions`` (``version`` given, the rows of several
    task versions answering beside each other) ``<unit_ref>:<cue_seq>@<version>`` with the version
    percent-encoded, so it holds no ``:`` or ``@``: an id reads back to one (unit, cue, version) from
    its right end, and an id of one form never equals one of the other.

    >>> passage_id("a", 0), passage_id("a:b", 1, "2"), passage_id("a", -1, "v:1@x")
    ('a:0', 'a:b:1@2', 'a:-1@v%3A1%40x')
    """
    plain = f"{unit_ref}:{cue_seq}"
    return plain if version is None else f"{plain}@{quote(version, safe='')}"


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def host_marker_schema(unit_type: pa.DataType) -> pa.Schema:
    return pa.schema([
        ("unit_ref", unit_type), ("derivation_key", pa.string()), ("task_version", pa.string()),
        ("cue_seq", pa.int64()), ("kind", pa.string()), ("unit_status", pa.string()), ("rows", pa.int64()),
        ("attempts", pa.int64()), ("last_error", pa.string()), ("retry", pa.bool_()),
    ])


def host_content_schema(rows: Sequence[Mapping[str, Any]], unit_type: pa.DataType) -> pa.Schema:
    """A host content table's schema for ``rows``: every row's columns, in order of first appearance
    (a unit's empty-marker row, first, holds none of the task's own), their types inferred."""
    names = list(dict.fromkeys(name for row in rows for name in row))
    inferred = pa.table({name: [row.get(name) for row in rows] for name in names}).schema
    fixed = {"unit_ref": unit_type, "cue_seq": pa.int64()}
    return pa.schema([pa.field(f.name, fixed.get(f.name, f.type)) for f in inferred])


def host_rows(unit_ref: Any, key: str, version: str, answer: Answer, attempts: int, max_attempts: int,
              marker_table: str, content_tables: Sequence[str], *,
              retained: bool = False) -> dict[str, list[dict[str, Any]]]:
    """A host unit's rows per table: content rows (and, for a content table the unit leaves empty, one
    ``empty`` marker row there, so the unit's older rows in it are superseded too), then its marker
    (``retained``: as :func:`builtin_rows`)."""
    id_version = version if retained else None
    base = {"unit_ref": unit_ref, "derivation_key": key, "task_version": version}
    out: dict[str, list[dict[str, Any]]] = {}
    if answer.status in ("ok", "empty"):
        for table in content_tables:
            rows = answer.tables.get(table, [])
            out[table] = ([{**base, "cue_seq": seq, "passage_id": passage_id(unit_ref, seq, id_version),
                            "kind": PASSAGE, "unit_status": "ok", **row}
                           for seq, row in enumerate(rows)]
                          or [{**base, "cue_seq": MARKER_SEQ, "passage_id": passage_id(unit_ref, MARKER_SEQ, id_version),
                               "kind": MARKER, "unit_status": "empty"}])
    marker = {**base, "cue_seq": MARKER_SEQ, "kind": MARKER, "rows": sum(len(r) for r in answer.tables.values()),
              **marker_fields(answer, attempts, max_attempts)}
    out[marker_table] = [marker]
    return out
