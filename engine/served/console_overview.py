"""What the operator console shows at a glance: one JSON document built by the functions the CLI prints.

Issue 31's console (docs/console.md): ``GET /console/api/overview`` answers :func:`overview`. Each
part comes from the function the matching command calls, so the page and the terminal never disagree:

- ``applied``: the applied version and when it was claimed (``contextful pipeline versions``:
  ``engine.control.apply.versions``) and its receipt, when a synced claim wrote ``receipt@v<N>.json``
  beside it (``engine.control.receipts.parse_receipt``; its digest as ``surface.apply.receipt-digest``
  names it);
- ``pipelines``: each pipeline of the applied version with its schedule, last and next fire, whether it
  is in flight and why it arms nothing (``contextful pipeline status``:
  ``engine.control.status.control_status``), and its last outcome (``contextful run history --table``:
  ``engine.run.records.run_history``);
- ``runs``: the newest runs with rows, bytes and downgrade events (``contextful run history``);
- ``derive``: each derive pipeline's outstanding units (``contextful pipeline run --dry-run``:
  ``engine.derive.run.dry_run``);
- ``models``: builds and staleness (``contextful build status``: ``engine.model.status.build_status``);
- ``exports``: exports and their snapshots (``contextful export status``: ``engine.export.run.export_status``);
- ``holder``: who the admitted credential names and whether it holds an Admin grant (``engine.control.admin``).

Reading never writes: the store is opened by an opener that never creates one; before anything has run
there is no store, and the parts that read one are empty. A part failing with a catalogue error holds
``{"error", "detail"}`` in its place (the detail masked by the secret guard) and the others still answer.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.guard import mask_message
from contextful.storage.errors import ContextfulError, StoreNotFound

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.control.credentials import Credential
    from contextful.storage import Store

RUNS_SHOWN = 50
"""How many of the newest runs the overview lists (and its rows-per-run chart draws)."""


def overview(working: Manifest, open_store: Callable[[], Store], credential: Credential) -> dict[str, Any]:
    """The console's overview of the project ``working`` belongs to (its applied version when one is
    applied, else ``working`` itself, as serve runs it), for the holder of ``credential``."""
    from contextful.engine.control.apply import load_applied
    from contextful.engine.control.fire import rfc3339
    from contextful.engine.project import MANIFEST

    # a manifest built in code (no contextful.toml at its root) has no applied versions: serve runs it
    applied = load_applied(working.root) if (working.root / MANIFEST).is_file() else None
    manifest = applied.manifest if applied is not None else working
    try:
        store: Store | None = open_store()
    except StoreNotFound:
        store = None
    with nullcontext() if store is None else store:
        now = store.clock.now_us() if store is not None else None
        return {
            "project": manifest.project.name,
            "now": rfc3339(now) if now is not None else None,
            "holder": holder(credential),
            "applied": _part(lambda: applied_version(manifest.root, applied.version if applied else None)),
            "pipelines": _part(lambda: pipelines(manifest, store)),
            "runs": _part(lambda: runs(store)),
            "derive": _part(lambda: derive_progress(manifest, store)),
            "models": _part(lambda: models(manifest, store)),
            "exports": _part(lambda: [s.to_json() for s in _export_status(manifest)]),
        }


def holder(credential: Credential) -> dict[str, Any]:
    """Who the credential names, whether it holds an Admin grant, and the console key it binds."""
    from contextful.engine.control.admin import console_key, is_admin
    from contextful.engine.control.fire import rfc3339

    return {"subject": credential.subject, "operator": credential.on_behalf_of, "admin": is_admin(credential),
            "console_key": console_key(credential), "expires_at": rfc3339(credential.expires_at * 1_000_000)}


def applied_version(root: Path, version: int | None) -> dict[str, Any]:
    """The applied version, when it was claimed, and its receipt (None: the claim wrote none)."""
    from contextful.engine.control.apply import snapshot_dir, versions

    if version is None:
        return {"version": None, "claimed_at": None, "receipt": None}
    claimed = next((v.claimed_at.isoformat() for v in versions(root) if v.version == version), None)
    return {"version": version, "claimed_at": claimed, "receipt": snapshot_dir(root).receipt_summary(version)}


def pipelines(manifest: Manifest, store: Store | None) -> list[dict[str, Any]]:
    """Each pipeline (and each job and connection the control plane arms, its source ``job`` or
    ``connection``) with its schedule, fires and last outcome."""
    from contextful.engine.control.fire import rfc3339
    from contextful.engine.control.status import control_status
    from contextful.engine.run.records import run_history

    status = control_status(manifest.root, store)
    unarmed = {u["pipeline"]: u["reason"] for u in status.unarmed}
    rows = []
    for spec in manifest.pipelines:
        entry = next((e for e in status.entries if spec.id in e.members), None)
        last = run_history(store, spec.table, 1) if store is not None else []
        rows.append({
            "id": spec.id, "table": spec.table, "source": spec.source.kind, "schedule": spec.schedule,
            "armed": entry is not None and entry.id == spec.id,
            "unit": entry.id if entry is not None and entry.id != spec.id else None,
            "last_fire": rfc3339(entry.last_fire_us) if entry else None,
            "next_fire": rfc3339(entry.next_fire_us) if entry else None,
            "in_flight": bool(entry and entry.in_flight), "unarmed": unarmed.get(spec.id),
            "last_outcome": _outcome(last[-1]) if last else None,
        })
    declared = {p.id for p in manifest.pipelines}
    rows += [{"id": e.id, "table": None, "source": e.id.split(":", 1)[0], "schedule": e.schedule, "armed": True, "unit": None,
              "last_fire": rfc3339(e.last_fire_us), "next_fire": rfc3339(e.next_fire_us), "in_flight": e.in_flight,
              "unarmed": None, "last_outcome": None} for e in status.entries if e.id not in declared]
    return rows


def _outcome(run: dict[str, Any]) -> dict[str, Any]:
    return {"status": run["status"], "at": run["recorded_at"], "run_id": run["run_id"], "rows": run["rows"],
            "failure": run["failure"]}


def runs(store: Store | None) -> list[dict[str, Any]]:
    """The newest runs, oldest first, each downgrade event also in the words ``run history`` prints."""
    from contextful.engine.cli.output import describe_event
    from contextful.engine.run.records import run_history

    if store is None:
        return []
    return [{**r, "events": [describe_event(e) for e in r["downgrade_events"]]}
            for r in run_history(store, None, RUNS_SHOWN)]


def derive_progress(manifest: Manifest, store: Store | None) -> list[dict[str, Any]]:
    """Each derive pipeline's eligible, derived and outstanding units (one selection, no engine called)."""
    from contextful.engine.derive.bind import load_machine
    from contextful.engine.derive.run import dry_run

    tiers = [p for p in manifest.pipelines if p.source.kind == "derive"]
    if not tiers:
        return []
    machine = load_machine(manifest.root)
    return [{"pipeline": spec.id, "table": spec.table, **dry_run(store, manifest, spec, machine).to_json()}
            for spec in tiers]


def models(manifest: Manifest, store: Store | None) -> list[dict[str, Any]]:
    """Each model's published build and why it is stale (``build status``)."""
    from contextful.engine.model.status import ModelStatus, build_status

    if store is None:
        return [ModelStatus(m.name, None).to_json() for m in manifest.models]
    return [s.to_json() for s in build_status(store, manifest)]


def _export_status(manifest: Manifest) -> list[Any]:
    from contextful.engine.export.run import export_status

    return export_status(manifest) if manifest.exports else []


def _part(compute: Callable[[], Any]) -> Any:
    """``compute()``, or the catalogue error it raised as ``{"error", "detail"}``."""
    try:
        return compute()
    except ContextfulError as exc:
        return {"error": exc.name, "detail": mask_message(exc.detail)}
