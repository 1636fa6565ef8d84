"""What a pipeline run reports: per table landed, per input or pull failed, and its progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contextful.storage.reconcile import DowngradeEvent
from contextful.storage.transaction import CommitResult


@dataclass(frozen=True)
class InputFailure:
    input: str
    error: str
    detail: str
    exit_code: int

    def to_json(self) -> dict[str, str]:
        return {"input": self.input, "error": self.error, "detail": self.detail}


@dataclass
class TableLanding:
    """What one pipeline run landed in one table, across its checkpoint commits."""

    table: str
    run_ids: list[str] = field(default_factory=list)
    commit_seqs: list[int] = field(default_factory=list)
    rows: int = 0
    parts: int = 0
    bytes: int = 0
    downgrade_events: list[DowngradeEvent] = field(default_factory=list)
    masked_cells: dict[str, int] = field(default_factory=dict)
    """Cells the secret guard masked, per column path (``run.guard-secrets.mask-only``)."""

    def add(self, result: CommitResult) -> None:
        self.run_ids.append(result.run_id)
        self.commit_seqs.append(result.commit_seq)
        self.rows += result.rows
        self.parts += result.parts
        self.bytes += result.bytes
        self.downgrade_events.extend(result.downgrade_events)

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "run_ids": self.run_ids, "commit_seqs": self.commit_seqs, "rows": self.rows,
                "parts": self.parts, "bytes": self.bytes,
                "downgrade_events": [e.to_json() for e in self.downgrade_events],
                "masked_cells": dict(self.masked_cells)}


@dataclass
class PipelineResult:
    pipeline: str
    tables: list[TableLanding]
    inputs_landed: list[str] = field(default_factory=list)
    inputs_skipped: int = 0
    failures: list[InputFailure] = field(default_factory=list)
    failures_not_shown: int = 0
    """Failures beyond those in ``failures`` (a derive run's units: the first few are listed)."""
    seconds: float = 0.0
    pulls: int = 0
    """Requests a source walk issued (retries included)."""
    bound_hits: list[dict[str, Any]] = field(default_factory=list)
    """Every connector bound struck, recovered or not: {"step", "attempt", "bound"}."""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the run decided on its own that its reader should know, per input ("orders.csv: delimiter ';' sniffed")."""
    execution: str | None = None
    """The execution the run opened or resumed (position-addressed sources)."""
    seed: dict[str, Any] | None = None
    """What the pipeline's seed did this run (``engine.land.seed.SeedOutcome``)."""
    derive: dict[str, Any] | None = None
    """A derive run's unit counts (``engine.derive.run.DeriveStats``)."""

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "ok": self.ok, "tables": [t.to_json() for t in self.tables],
                "inputs_landed": self.inputs_landed, "inputs_skipped": self.inputs_skipped,
                "failures": [f.to_json() for f in self.failures], "failures_not_shown": self.failures_not_shown,
                "seconds": round(self.seconds, 3),
                "pulls": self.pulls, "bound_hits": self.bound_hits, "warnings": self.warnings, "notes": self.notes,
                "execution": self.execution, "seed": self.seed, "derive": self.derive}


@dataclass(frozen=True)
class Progress:
    """How far a pipeline run is: called after each input (files) or page (http) it staged, and
    within a files input as its decoder reads it (``closes`` False)."""

    pipeline: str
    done: int
    """Inputs (files) or pages (http) pulled so far."""
    total: int | None
    """Inputs the run pulls (files); None for pages, whose count a walk learns only at its end."""
    rows: int
    """Rows landed and staged so far."""
    bytes_read: int
    """Input bytes read (files); bytes landed and staged (http)."""
    tables: int
    seconds: float
    unit: str = "inputs"
    """What ``done`` counts: ``inputs``, ``pages`` or ``units`` (a derive run)."""
    failed: int = 0
    """A derive run: units that failed so far (each recorded as a marker row)."""
    bytes_total: int | None = None
    """Files: the bytes the run pulls (the inputs' sizes from where their cursors stand)."""
    closes: bool = True
    """Whether this report ends an input, page or unit; False for one from within an input (bytes read so far)."""
    scanning: bool = False
    """From within a large CSV input read a first time for its column types: ``bytes_read`` counts
    that reading's bytes (it is read again after)."""
