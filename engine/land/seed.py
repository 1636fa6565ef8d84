"""Seeded tables: a one-time historical load bounded by a ceiling, landed in one commit.

Implements decision "incremental-position-bound" (a seed is bounded) and, for the seed, the
commit-once rule of ``run.own.checkpoint-scope``. A pipeline may declare ``[pipeline.seed]``::

    [pipeline.seed]
    paths = ["seed/*.ndjson.gz"]      # the files source's semantics: globs, fsspec, project-relative
    format = "ndjson"                 # optional: ndjson | json | csv | parquet (default: by extension)
    ceiling = "2026-01-01T00:00:00Z"  # seeded rows stamp strictly below it; live rows take over from it

- ``run.seed.declaration-missing``: seed rows merge with live rows by primary key ordered by
  ``order_by``, so a seed without ``primary_key`` or ``order_by`` raises
  :class:`PipelineSeedDeclarationMissing` (:func:`check_declaration`, called at plan and validate).
- ``run.seed.ceiling-breached``: a row whose ``order_by`` stamp reaches the ceiling (at or above it)
  raises :class:`PipelineSeedCeilingBreached` naming the value; the seed commit lands nothing, and
  the stamp is neither clamped nor dropped.
- ``run.seed.ceiling-unevaluable``: a batch without the ``order_by`` column, or a stamp that does
  not order against the ceiling, raises :class:`PipelineSeedCeilingUnevaluable`. A timestamp column
  compares as instants (a zoneless timestamp reads as UTC, as Arrow's JSON and CSV readers produce
  it from Z-suffixed text); a text column orders only when every stamp is ISO-8601 with a ``Z`` and
  the ceiling's fractional-second width, and then compares as text; any other type does not order.
- ``run.seed.source-changed``: the commit records ``seed:<pipeline id>`` = ``{"kind": "seed",
  "fingerprint", "ceiling"}``. A later run with the same fingerprint skips; a different one raises
  :class:`PipelineSeedSourceChanged` naming both; inputs that are gone skip with a warning. The
  fingerprint covers each input's project-relative name and content (``engine.land.files``), so
  moving the project changes nothing; a fingerprint of the old form (absolute paths, size and
  mtime) that still matches skips and is carried forward in the new form.

Example::

    >>> import pyarrow as pa
    >>> check_ceiling("events", "at", "2026-01-01T00:00:00Z", pa.table({"at": ["2025-12-31T23:59:59Z"]}))
    >>> check_ceiling("events", "at", "2026-01-01T00:00:00Z", pa.table({"at": ["2026-01-01T00:00:00Z"]}))
    Traceback (most recent call last):
    ...
    storage.errors.PipelineSeedCeilingBreached: PipelineSeedCeilingBreached: pipeline 'events': seeded row with at = 2026-01-01T00:00:00Z reaches the seed ceiling 2026-01-01T00:00:00Z
"""

from __future__ import annotations

import calendar
import hashlib
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.config.manifest import PipelineSpec, SourceSpec
from contextful.engine.guard import masked_failure
from contextful.engine.land.chunks import coalesce
from contextful.engine.land.csv_options import CSV_KEYS, CsvOptions, csv_options
from contextful.engine.land.declaration import table_declaration
from contextful.engine.land.decode import Decoder
from contextful.engine.land.files import InputFile, check_config, list_inputs
from contextful.engine.land.sink import LandingSink
from contextful.engine.land.typed import apply_types, read_types
from contextful.storage import Store
from contextful.storage.errors import (
    ContextfulError,
    InputNotFound,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    PipelineSeedCeilingBreached,
    PipelineSeedCeilingUnevaluable,
    PipelineSeedDeclarationMissing,
    PipelineSeedSourceChanged,
)
from contextful.storage.lazy import lazy_module
from contextful.storage.transaction import CommitResult

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

log = logging.getLogger(__name__)

SEED_KEYS = ("paths", "format", "ceiling", *CSV_KEYS)
_INSTANT = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z")
_TEXT_FRACTION = re.compile(r"T\d{2}:\d{2}:\d{2}(?:\.(\d*))?Z$")
_NS_PER = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


@dataclass(frozen=True)
class SeedSpec:
    paths: tuple[str, ...]
    """Seed files: paths, globs or fsspec URLs, relative paths against the project directory."""
    ceiling: str
    """ISO-8601 UTC instant ending in ``Z``; every seeded ``order_by`` stamp is strictly below it."""
    format: str | None = None
    """ndjson | json | csv | parquet; ``None`` tells each file's format by its name."""
    csv: CsvOptions = field(default_factory=CsvOptions)
    """How its CSV files are read (``engine.land.csv_options``), as a ``files`` source declares it."""


@dataclass(frozen=True)
class SeedOutcome:
    status: str
    """``landed``, ``skipped-equal`` (landed before from the same inputs) or ``skipped-unavailable``."""
    fingerprint: str | None
    """Fingerprint of the seed inputs; ``None`` when they are unavailable."""
    rows: int
    """Rows the seed commit landed (0 when skipped)."""
    commit: CommitResult | None
    """The seed's one commit, when it landed."""
    warning: str | None
    """Why the seed was skipped, when its inputs are unavailable."""

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "fingerprint": self.fingerprint, "rows": self.rows,
                "commit": self.commit.to_json() if self.commit else None, "warning": self.warning}


def seed_scope(pipeline_id: str) -> str:
    """The cursor scope the seed commit sets on the pipeline's table."""
    return f"seed:{pipeline_id}"


def parse_seed(where: str, block: object) -> tuple[SeedSpec | None, list[ContextfulError]]:
    """The ``[pipeline.seed]`` block of the pipeline block ``where``, and every problem it has."""
    if not isinstance(block, dict):
        return None, [ManifestValueInvalid(where, "seed", "must be a table with paths and a ceiling")]
    inner = f"{where} seed"
    problems: list[ContextfulError] = [ManifestKeyUnknown(inner, k, SEED_KEYS) for k in block if k not in SEED_KEYS]
    problems.extend(check_config(inner, {k: block[k] for k in ("paths", "format", *CSV_KEYS) if k in block}))
    ceiling = block.get("ceiling")
    if ceiling is None:
        problems.append(ManifestValueInvalid(inner, "ceiling", "is required (an ISO-8601 UTC instant ending in Z)"))
    elif not isinstance(ceiling, str):
        problems.append(ManifestValueInvalid(
            inner, "ceiling", f"must be a quoted ISO-8601 UTC instant ending in Z, not {ceiling!r}"))
    else:
        try:
            _ceiling_ns(ceiling)
        except ValueError as exc:
            problems.append(ManifestValueInvalid(inner, "ceiling", str(exc)))
    if problems:
        return None, problems
    paths = block["paths"]
    return SeedSpec(tuple([paths] if isinstance(paths, str) else paths), block["ceiling"], block.get("format"),
                    csv_options(inner, block)[0]), []


def check_declaration(pipeline_id: str, primary_key: tuple[str, ...], order_by: str | None) -> list[ContextfulError]:
    """What a seeded pipeline leaves undeclared: its rows merge by key in ``order_by`` order."""
    problems: list[ContextfulError] = []
    if not primary_key:
        problems.append(PipelineSeedDeclarationMissing(pipeline_id, "declares no primary_key"))
    if not order_by:
        problems.append(PipelineSeedDeclarationMissing(
            pipeline_id, "leaves order_by at the ingest stamp; declare the column ordering rows"))
    return problems


def check_ceiling(pipeline_id: str, column: str, ceiling: str, batch: pa.Table | pa.RecordBatch) -> None:
    """Raise unless every ``column`` stamp of ``batch`` orders strictly below ``ceiling``."""
    index = batch.schema.get_field_index(column)
    if index < 0:
        raise PipelineSeedCeilingUnevaluable(pipeline_id, column, "the batch has no such column")
    values = batch.column(index)
    kind = values.type
    try:
        ceiling_ns = _ceiling_ns(ceiling)
    except ValueError as exc:
        raise PipelineSeedCeilingUnevaluable(pipeline_id, column, str(exc)) from exc
    textual = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if not (textual or pa.types.is_timestamp(kind)):
        raise PipelineSeedCeilingUnevaluable(
            pipeline_id, column, f"a {kind} stamp does not order against the timestamp ceiling {ceiling}")
    if values.null_count:
        raise PipelineSeedCeilingUnevaluable(pipeline_id, column, "a stamp is null")
    if pa.types.is_timestamp(kind):
        # stamp >= ceiling  <=>  stamp >= the ceiling rounded up to the column's unit (exact, no overflow)
        bound = -(-ceiling_ns // _NS_PER[kind.unit])
        reached = pc.greater_equal(values, pa.scalar(bound, type=kind))
    else:
        width = _fraction_width(ceiling)
        fraction = rf"\.\d{{{width}}}" if width else ""
        shaped = pc.match_substring_regex(values, rf"^\d{{4}}-\d{{2}}-\d{{2}}T\d{{2}}:\d{{2}}:\d{{2}}{fraction}Z$")
        first = pc.index(shaped, False).as_py()
        if first >= 0:
            raise PipelineSeedCeilingUnevaluable(pipeline_id, column, _why_unordered(values[first].as_py(), ceiling))
        reached = pc.greater_equal(values, pa.scalar(ceiling, type=kind))  # same shape: text order is time order
    first = pc.index(reached, True).as_py()
    if first >= 0:
        raise PipelineSeedCeilingBreached(pipeline_id, column, _shown(values, first), ceiling)


def seed_fingerprint(inputs: Iterable[InputFile], *, old_form: bool = False) -> str:
    """sha256 over the sorted (name, content) pairs of the seed's inputs (``old_form``: the
    (absolute path, size:mtime) pairs fingerprints were computed from before)."""
    pairs = sorted((i.path, i.stamp) if old_form else (i.name, i.content) for i in inputs)
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode("utf-8")).hexdigest()


def land_seed(store: Store, root: Path, pipeline_id: str, table_name: str, primary_key: tuple[str, ...],
              order_by: str | None, seed: SeedSpec, decoder: Decoder, *,
              types: dict[str, str] | None = None, normalize: str = "nested") -> SeedOutcome:
    """Land the seed into ``table_name`` in one commit, unless it landed before from these inputs.

    Every chunk is typed and checked against the ceiling before it is staged; any failure aborts
    the transaction, so the seed lands whole or not at all.
    """
    problems = check_declaration(pipeline_id, primary_key, order_by)
    if problems or order_by is None:
        raise problems[0]
    declared = read_types(types or {})
    scope = seed_scope(pipeline_id)
    try:
        inputs = list_inputs({"paths": list(seed.paths)}, root)
    except (InputNotFound, OSError) as exc:  # a literal path that is gone, or a store we cannot reach
        return _unavailable(pipeline_id, str(exc))
    if not inputs:
        return _unavailable(pipeline_id, f"no file matches {', '.join(seed.paths)}")
    current = seed_fingerprint(inputs)
    committed = store.table(table_name).cursor(scope) if table_name in store.table_names() else None
    if committed is not None:
        landed = committed[0].get("fingerprint")
        if landed == current:
            return SeedOutcome("skipped-equal", current, 0, None, None)
        if landed == seed_fingerprint(inputs, old_form=True):  # carried forward: later moves keep it
            txn = store.table(table_name).transaction("append", meta={"pipeline": pipeline_id, "seed": True})
            try:
                txn.set_cursor(scope, {**committed[0], "fingerprint": current})
                txn.commit()
            except BaseException as exc:
                txn.abort(masked_failure(exc))
                raise
            return SeedOutcome("skipped-equal", current, 0, None, None)
        raise PipelineSeedSourceChanged(pipeline_id, str(landed), current)
    spec = PipelineSpec(pipeline_id, SourceSpec("files", {"paths": list(seed.paths)}), table_name, normalize=normalize,
                        primary_key=primary_key, order_by=order_by, types=dict(types or {}))
    # rows merge by order_by, live rows too
    store.create_table(table_name, primary_key, order_by, declared=table_declaration(spec))
    sink = LandingSink(store, spec, meta={"pipeline": pipeline_id, "seed": True})
    try:
        for item in inputs:
            for chunk in coalesce(decoder.decode(item.path, seed.format, declared=declared, csv=seed.csv)):
                typed = apply_types(table_name, chunk, declared)
                check_ceiling(pipeline_id, order_by, seed.ceiling, typed)  # before anything is staged
                sink.stage(typed, f"seed input {item.path}", typed=True)
        result = sink.commit(scope, {"kind": "seed", "fingerprint": current, "ceiling": seed.ceiling})
    except BaseException as exc:
        sink.abort(masked_failure(exc))
        raise
    finally:
        sink.abort()
    assert result is not None
    return SeedOutcome("landed", current, result.rows, result, None)


def _unavailable(pipeline_id: str, reason: str) -> SeedOutcome:
    warning = f"pipeline {pipeline_id!r}: the seed's inputs are unavailable ({reason}); skipping the seed"
    log.warning("%s", warning)
    return SeedOutcome("skipped-unavailable", None, 0, None, warning)


def _ceiling_ns(ceiling: str) -> int:
    """The ceiling as nanoseconds since the epoch; ValueError unless an ISO-8601 UTC instant with Z."""
    match = _INSTANT.fullmatch(ceiling)
    if match is None:
        raise ValueError(f"{ceiling!r} is not an ISO-8601 UTC instant ending in Z (like 2026-01-01T00:00:00Z)")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        instant = datetime(year, month, day, hour, minute, second)
    except ValueError as exc:
        raise ValueError(f"{ceiling!r} is not a valid instant ({exc})") from exc
    fraction = (match.group(7) or "").ljust(9, "0")
    return calendar.timegm(instant.timetuple()) * 1_000_000_000 + int(fraction)


def _fraction_width(ceiling: str) -> int:
    match = _INSTANT.fullmatch(ceiling)
    return len(match.group(7) or "") if match else 0


def _why_unordered(stamp: str, ceiling: str) -> str:
    """Why one text stamp does not order against the ceiling (the first one that does not)."""
    if not stamp.endswith("Z"):
        return f"text stamp {stamp!r} has no Z suffix"
    width = _fraction_width(ceiling)
    match = _TEXT_FRACTION.search(stamp)
    if match is not None and len(match.group(1) or "") != width:
        return (f"text stamp {stamp!r} has {len(match.group(1) or '')} fractional-second digits; "
                f"the ceiling {ceiling} has {width}")
    return f"text stamp {stamp!r} is not an ISO-8601 instant shaped like the ceiling {ceiling}"


def _shown(values: pa.Array | pa.ChunkedArray, index: int) -> str:
    """The stamp at ``index`` as written: text as it is, a timestamp as a UTC instant."""
    value = values[index : index + 1]
    if pa.types.is_timestamp(values.type):
        if values.type.tz is not None:
            value = value.cast(pa.timestamp(values.type.unit, tz="UTC"))
        value = pc.strftime(value, format="%Y-%m-%dT%H:%M:%SZ")
    return str(value[0].as_py())
