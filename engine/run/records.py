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
from contextful.storage.run_record import HISTORY

if TYPE_CHECKING:
    from contextful.storage import Store

PHASE_ORDER = {"plan": 0, "fail": 1, "commit": 2}
"""A later phase wins: a run that committed or failed is no longer planned."""

_RANK = "CASE phase " + " ".join(f"WHEN '{p}' THEN {n}" for p, n in PHASE_ORDER.items()) + " ELSE 0 END"


def _select(store: Store, where: str, params: list[Any], limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``_runs`` matching ``where`` (``?`` placeholders bound to ``params``), selected in
    DuckDB: the history can hold a row per run phase for every run ever made, and only the newest
    ``limit`` runs (each its latest row by phase; None: every matching row) reach Python, oldest first
    (runs recorded at the same instant by run id)."""
    rows = f"SELECT * FROM {HISTORY} WHERE {where}"
    if limit is None:
        sql, bind = f"{rows} ORDER BY recorded_at, run_id, phase", params
    else:
        latest = f"SELECT * FROM ({rows}) QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY {_RANK} DESC) = 1"
        newest = f"SELECT * FROM ({latest}) ORDER BY recorded_at DESC, run_id DESC LIMIT ?"
        sql, bind = f"SELECT * FROM ({newest}) ORDER BY recorded_at, run_id", [*params, limit]
    return store.runs.select(sql, bind).to_pylist()


def _latest_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The latest of one run's rows, by phase (a run has one row per phase)."""
    return max(rows, key=lambda r: PHASE_ORDER.get(r["phase"], 0))


def _failure(row: dict[str, Any]) -> dict[str, str] | None:
    return {"error": row["error"], "detail": row["detail"] or ""} if row["phase"] == "fail" else None


def run_history(store: Store, table: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """The newest ``limit`` runs (of ``table``), oldest first: state, rows, bytes, downgrade events, failure."""
    runs = _select(store, "table_name = ?" if table is not None else "true", [table] if table is not None else [],
                   limit)
    out = []
    tables = set(store.table_names(include_reserved=True))  # a dropped table's runs keep no manifest
    for row in runs:
        events: list[dict[str, Any]] = []
        if row["phase"] == "commit" and row["table_name"] in tables:
            events = [e.to_json() for e in store.table(row["table_name"]).manifest(row["run_id"]).downgrade_events]
        out.append({"run_id": row["run_id"], "table": row["table_name"], "kind": row["kind"],
                    "status": row["status"], "recorded_at": row["recorded_at"], "commit_seq": row["commit_seq"],
                    "rows": row["rows"], "bytes": row["bytes"], "downgrade_events": events, "failure": _failure(row)})
    return out


def _origin(meta: dict[str, Any]) -> str | None:
    """What made the run, in words, from its manifest's meta."""
    if "model" in meta:
        return f"model {meta['model']}"
    if "pipeline" in meta:
        what = (" (its seed)" if meta.get("seed") else " (received batches)" if "receive_group" in meta
                else " (reset: cursor forgotten)" if meta.get("reset") else "")
        return f"pipeline {meta['pipeline']}{what}"
    if "source" in meta:
        return f"table load {meta['source']}"
    return None


def run_detail(store: Store, run_id: str) -> dict[str, Any]:
    """One run whole; :class:`RunNotFound` when no record holds ``run_id``."""
    mine = _select(store, "run_id = ?", [run_id])
    if not mine:
        raise RunNotFound(run_id)
    row = _latest_row(mine)
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
    together = meta.get("tables") or {row["table_name"]: run_id}
    ids = sorted(set(together.values()))
    committed = {r["run_id"]: r for r in _select(
        store, f"phase = 'commit' AND run_id IN ({', '.join('?' for _ in ids)})", ids)}
    detail.update(
        origin=_origin(meta),
        inputs=list(meta.get("inputs") or ([meta["source"]] if "source" in meta else [])),
        tables=[{"table": name, "run_id": rid, "rows": committed[rid]["rows"], "parts": committed[rid]["parts"],
                 "bytes": committed[rid]["bytes"]} for name, rid in together.items() if rid in committed],
        downgrade_events=[e.to_json() for e in manifest.downgrade_events],
        masked_cells=dict(meta.get("masked_cells") or {}),
    )
    return detail
