"""An export's state file, ``<project>/.contextful/exports/<name>.json``: what it last published and
what its Iceberg table looked like afterwards (issue 6, issue 28; docs/exports.md).

``export_table`` takes table properties, not snapshot summary properties, and a table property
would go stale at the next export, so what an export read (its ``source``) and the snapshot it
committed (``snapshot_id``) are recorded here. Beside them, :class:`TableView` records the table as
the run left it — its ``metadata_location``, current snapshot, the snapshots retention weighs and
the current snapshot's totals — so that while the catalog still points at that metadata file,
``export status`` and an ``export run`` whose source did not change answer from this file alone,
without loading pyiceberg (``engine.export.pointer`` reads the pointer).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.table import Table

STATE_DIR = Path(".contextful") / "exports"


@dataclass(frozen=True)
class TableView:
    """An export's Iceberg table at one metadata file."""

    metadata_location: str
    """The metadata file the catalog pointed at: every commit writes a new one."""
    snapshot_id: int | None
    """The current snapshot of ``main`` (None before any)."""
    snapshots: list[tuple[int, float]]
    """Every snapshot as ``(snapshot_id, timestamp_ms)``, in commit order (what retention weighs)."""
    protected: list[int]
    """The snapshots a branch or tag points at (retention never expires them)."""
    rows: int | None
    """``total-records`` of the current snapshot."""
    files: int | None
    """``total-data-files`` of the current snapshot."""

    @classmethod
    def of(cls, table: Table) -> TableView:
        metadata = table.metadata
        current = table.current_snapshot()
        totals = current.summary.additional_properties if current is not None and current.summary else {}
        return cls(table.metadata_location, current.snapshot_id if current is not None else None,
                   [(s.snapshot_id, s.timestamp_ms) for s in metadata.snapshots],
                   sorted({ref.snapshot_id for ref in metadata.refs.values()}),
                   int(totals["total-records"]) if "total-records" in totals else None,
                   int(totals["total-data-files"]) if "total-data-files" in totals else None)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TableView:
        return cls(doc["metadata_location"], doc["snapshot_id"], [(int(i), t) for i, t in doc["snapshots"]],
                   list(doc["protected"]), doc["rows"], doc["files"])


def state_path(root: Path, export: str) -> Path:
    return root / STATE_DIR / f"{export}.json"


def read_state(path: Path) -> dict[str, Any] | None:
    """The state file's document, None when the export never ran here."""
    if not path.is_file():
        return None
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
    tmp.replace(path)


def with_view(state: dict[str, Any], view: TableView) -> dict[str, Any]:
    return {**state, "table": asdict(view)}


def recorded_view(state: dict[str, Any] | None, location: str | None) -> TableView | None:
    """The state file's table view when the catalog still points at its metadata file, else None."""
    if state is None or location is None or not isinstance(state.get("table"), dict):
        return None
    view = TableView.from_json(state["table"])
    return view if view.metadata_location == location else None
