"""The run manifest: one JSON document per committed run, written before its commit lands.

Implements "table-commit-owns" (``run.record.schema-diff-home``): the manifest holds the run's
parts with their row and byte counts, the schema that arrived and the schema it landed in, the
cursor it commits and its downgrade events. Schemas travel as base64 Arrow IPC (exact) beside a
readable column list.

Where it is kept (docs/store.md, "Run manifests"): a manifest of at most
:data:`INLINE_MANIFEST_BYTES` rides in the catalog commit that lands its run (``cf_manifests``,
written in the same transaction as the commit row), so a small run makes one durable write besides
its parts instead of two; a larger one is written atomically and durably under
``tables/<table>/runs/<run id>.json`` before the catalog commit, and one whose commit never landed
is an orphan that collection removes. Either way the commit row names the manifest by its key, and
:func:`read_manifest` answers it from the catalog first, then from the object (every store written
before manifests were kept in the catalog has only objects).
"""

from __future__ import annotations

import base64
import builtins
import functools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contextful.storage.commits import PartFile
from contextful.storage.lazy import lazy_module
from contextful.storage.reconcile import DowngradeEvent

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.storage.catalog import Catalog
    from contextful.storage.objects import ObjectStore
else:
    pa = lazy_module("pyarrow")

FORMAT_VERSION = 1
INLINE_MANIFEST_BYTES = 64 * 1024
"""A manifest of at most this many bytes (its JSON) is kept in the catalog row of its commit."""


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


@functools.lru_cache(maxsize=64)
def schema_from_text(text: str) -> pa.Schema:
    """The schema ``text`` holds; kept for its next reader (a schema is immutable, and every run
    opening on a table reads its head's)."""
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


def place_manifest(objects: ObjectStore, manifest: RunManifest, durable: bool,
                   inline_bytes: int = INLINE_MANIFEST_BYTES) -> tuple[str, str | None]:
    """Where ``manifest`` is kept: its key, and its text when it rides in the commit (at most
    ``inline_bytes``); otherwise it is written under its key now, durably when ``durable``, and the
    text is None."""
    key = manifest_key(manifest.table, manifest.run_id)
    data = manifest.dumps()
    if len(data) <= inline_bytes:
        return key, data.decode("utf-8")
    objects.put_bytes(key, data, durable=durable)
    return key, None


def read_manifest(catalog: Catalog, objects: ObjectStore, table: str, run_id: str) -> RunManifest:
    """The manifest of run ``run_id`` on ``table``: the one its commit kept in the catalog, else its
    object (a large run's, or any run of a store written before manifests were kept in the catalog)."""
    doc = catalog.manifest_doc(table, run_id)
    if doc is not None:
        return RunManifest.loads(doc.encode("utf-8"))
    return RunManifest.loads(objects.get_bytes(manifest_key(table, run_id)))
