"""The run manifest: one JSON document per committed run, written before its commit lands.

Implements "table-commit-owns" (``run.record.schema-diff-home``): the manifest holds the run's
parts with their row and byte counts, the schema that arrived and the schema it landed in, the
cursor it commits and its downgrade events. It is written atomically under
``tables/<table>/runs/<run id>.json`` before the catalog commit; a manifest whose commit never
landed is an orphan that collection removes. Schemas travel as base64 Arrow IPC (exact) beside a
readable column list.
"""

from __future__ import annotations

import base64
import builtins
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contextful.storage.commits import PartFile
from contextful.storage.lazy import lazy_module
from contextful.storage.reconcile import DowngradeEvent

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_module("pyarrow")

FORMAT_VERSION = 1


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def table_prefix(table: str) -> str:
    return f"tables/{table}"


def manifest_key(table: str, run_id: str) -> str:
    return f"{table_prefix(table)}/runs/{run_id}.json"


@dataclass(frozen=True)
class RunManifest:
    table: str
    table_uuid: str
    run_id: str
    kind: str
    """append, replace or fold."""
    parts: tuple[PartFile, ...]
    landed_schema: str
    arrived_schemas: tuple[str, ...] = ()
    cursor: dict[str, Any] | None = None
    """``{"scope": …, "value": …}`` when the run commits a position."""
    downgrade_events: tuple[DowngradeEvent, ...] = ()
    created_us: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        landed = schema_from_text(self.landed_schema)
        return {
            "format": FORMAT_VERSION,
            "table": self.table,
            "table_uuid": self.table_uuid,
            "run_id": self.run_id,
            "kind": self.kind,
            "created_us": self.created_us,
            "rows": self.rows,
            "bytes": self.bytes,
            "parts": [p.to_json() for p in self.parts],
            "columns": [{"name": f.name, "type": str(f.type)} for f in landed],
            "landed_schema": self.landed_schema,
            "arrived_schemas": list(self.arrived_schemas),
            "cursor": self.cursor,
            "downgrade_events": [e.to_json() for e in self.downgrade_events],
            "meta": self.meta,
        }

    def dumps(self) -> builtins.bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode("utf-8")

    @classmethod
    def loads(cls, data: builtins.bytes) -> RunManifest:
        doc = json.loads(data)
        return cls(
            table=doc["table"],
            table_uuid=doc["table_uuid"],
            run_id=doc["run_id"],
            kind=doc["kind"],
            parts=tuple(PartFile(p["path"], p["rows"], p["bytes"]) for p in doc["parts"]),
            landed_schema=doc["landed_schema"],
            arrived_schemas=tuple(doc.get("arrived_schemas", ())),
            cursor=doc.get("cursor"),
            downgrade_events=tuple(DowngradeEvent.from_json(e) for e in doc.get("downgrade_events", ())),
            created_us=doc.get("created_us", 0),
            meta=doc.get("meta", {}),
        )
