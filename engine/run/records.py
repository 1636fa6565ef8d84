"""Run records read back: every run's latest state (``contextful run history``) and one run whole
(``contextful run show``).

A run writes a plan row when it opens, then a commit row when it lands or a fail row when it is
given up on an error (``storage.run_record``). Its state is its latest row by that order:
``committed``, ``failed`` (with the error's name and its masked one-line message), ``canceled``
(given up on ``contextful run cancel``: a terminal status apart from failed, with the same error
fields), or ``planned`` (still running, or its process ended before it finished). What a committed run landed — its
inputs, its downgrade events, the cells the secret guard masked, the runs it landed together
with on other tables — is read from its manifest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextful.storage.errors import RunNotFound

if TYPE_CHECKING:
    from contextful.storage import Store

PHASE_ORDER = {"plan": 0, "fail": 1, "commit": 2}
"""A later phase wins: a run that committed or failed is no longer planned."""


def _latest(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The latest row of each run (by phase), in the order the runs were recorded."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:  # one row per run phase: bounded by the run count
        held = latest.get(row["run_id"])
        if held is None or PHASE_ORDER.get(row["phase"], 0) >= PHASE_ORDER.get(held["phase"], 0):
            latest[row["run_id"]] = row
    return latest


def _failure(row: dict[str, Any]) -> dict[str, str] | None:
    return {"error": row["error"], "detail": row["detail"] or ""} if row["phase"] == "fail" else None


def run_history(store: Store, table: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` runs (of ``table``), oldest first: state, rows, downgrade events, failure."""
    rows = [r for r in store.runs.history().to_pylist() if table is None or r["table_name"] == table]
    runs = sorted(_latest(rows).values(), key=lambda r: r["recorded_at"])[-limit:]
    out = []
    tables = set(store.table_names(include_reserved=True))  # a dropped table's runs keep no manifest
    for row in runs:
        events: list[dict[str, Any]] = []
        if row["phase"] == "commit" and row["table_name"] in tables:
            events = [e.to_json() for e in store.table(row["table_name"]).manifest(row["run_id"]).downgrade_events]
        out.append({"run_id": row["run_id"], "table": row["table_name"], "kind": row["kind"],
                    "status": row["status"], "recorded_at": row["recorded_at"], "commit_seq": row["commit_seq"],
                    "rows": row["rows"], "downgrade_events": events, "failure": _failure(row)})
    return out


def _origin(meta: dict[str, Any]) -> str | None:
    """What made the run, in words, from its manifest's meta."""
    if "model" in meta:
        return f"model {meta['model']}"
    if "pipeline" in meta:
        what = " (its seed)" if meta.get("seed") else " (received batches)" if "receive_group" in meta else ""
        return f"pipeline {meta['pipeline']}{what}"
    if "source" in meta:
        return f"table load {meta['source']}"
    return None


def run_detail(store: Store, run_id: str) -> dict[str, Any]:
    """One run whole; :class:`RunNotFound` when no record holds ``run_id``."""
    history = store.runs.history().to_pylist()
    mine = [r for r in history if r["run_id"] == run_id]
    if not mine:
        raise RunNotFound(run_id)
    row = _latest(mine)[run_id]
    planned = next((r["recorded_at"] for r in mine if r["phase"] == "plan"), None)
    detail: dict[str, Any] = {
        "run_id": run_id, "table": row["table_name"], "kind": row["kind"], "status": row["status"],
        "planned_at": planned, "finished_at": row["recorded_at"] if row["phase"] != "plan" else None,
        "commit_seq": row["commit_seq"], "rows": row["rows"], "parts": row["parts"], "bytes": row["bytes"],
        "origin": None, "inputs": [], "tables": [], "downgrade_events": [], "masked_cells": {},
        "bound_hits": row["bound_hits"] or [], "failure": _failure(row),
    }
    if row["phase"] != "commit" or row["table_name"] not in store.table_names(include_reserved=True):
        return detail  # a dropped table's runs keep their record, not their manifest
    manifest = store.table(row["table_name"]).manifest(run_id)
    meta = manifest.meta
    committed = {r["run_id"]: r for r in history if r["phase"] == "commit"}
    together = meta.get("tables") or {row["table_name"]: run_id}
    detail.update(
        origin=_origin(meta),
        inputs=list(meta.get("inputs") or ([meta["source"]] if "source" in meta else [])),
        tables=[{"table": name, "run_id": rid, "rows": committed[rid]["rows"], "parts": committed[rid]["parts"],
                 "bytes": committed[rid]["bytes"]} for name, rid in together.items() if rid in committed],
        downgrade_events=[e.to_json() for e in manifest.downgrade_events],
        masked_cells=dict(meta.get("masked_cells") or {}),
    )
    return detail
