"""Restoring the D1 profile's execution database from a ``contextful store backup`` document.

The counterpart of :func:`storage.d1.recovery.capture` (``run.journal.d1-backup``): when the binding's
D1 database is lost and its R2 namespace survives, ``contextful store restore FILE`` puts the captured
execution database back, so the project recovery identity again binds it to the R2 frontier
(``run.journal.d1-recovery``) and executions are admitted where they stopped. It restores nothing
else: R2 is the corpus and is never written by a restore.

A restore checks everything before it writes a row:

* the document is a backup of this profile and format, its schema digest matches its DDL, and it was
  captured for this binding's namespace (the identity binds a schema: another namespace's objects are
  not this one's);
* the R2 frontier still holds every captured object with its captured etag — the identity object
  ``corpus/recovery.json`` among them, so its generation is the backup's. A missing or changed object
  (a blob deleted after its last reference went, a corpus rewritten) refuses it as
  ``ExecutionRecoveryMismatch`` naming the object: the restored rows would reference what R2 no
  longer holds. Objects written after the capture are left alone; the restored catalog names none;
* the database records no project recovery identity: a restore replaces a lost database, never a
  living one (an intact database with another state is ``contextful store provision``'s or an
  operator's business, not an overwrite's).

Then each captured table is dropped and created from its DDL and its rows inserted, a bounded batch
at a time; the recovery identity row goes in last, in its own batch. D1 ends a transaction with each
request, so a restore interrupted midway leaves a database with no identity: admission refuses it
(``ExecutionRecoveryMismatch``: no project recovery identity) and running the restore again replaces
every table once more. Indexes and triggers come back as each port opens (they are ``IF NOT
EXISTS``), exactly as on ``store provision``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.d1.client import D1Client, Statement
from contextful.storage.d1.profile import PROFILE
from contextful.storage.d1.recovery import BACKUP_FORMAT, D1RecoveryIdentity, _client, _schema, _tables, admit
from contextful.storage.errors import ExecutionRecoveryMismatch

if TYPE_CHECKING:
    from contextful.storage.store import Store

ROWS_PER_BATCH = 50
"""Row inserts per D1 batch: one row per statement keeps each under D1's bound-parameter limit."""
IDENTITY_TABLE = "cf_recovery"


@dataclass(frozen=True)
class Restored:
    """What a restore put back."""

    identity: D1RecoveryIdentity
    tables: int
    rows: int
    objects_checked: int

    def to_json(self) -> dict[str, Any]:
        return {"recovery_id": self.identity.recovery_id, "store_uuid": self.identity.store_uuid,
                "tables": self.tables, "rows": self.rows, "objects_checked": self.objects_checked}


def restore(store: Store, document: dict[str, Any], *,
            progress: Callable[[str], None] | None = None) -> Restored:
    """Restore ``store``'s lost D1 execution database from ``document`` (see the module docstring)."""
    client = _client(store)
    schema = _schema(client)
    identity, ddl = _checked_document(schema, client, document)
    checked = _check_frontier(schema, client, document["r2_frontier"])
    if IDENTITY_TABLE in _tables(client):
        recorded = client.query("SELECT value FROM cf_recovery WHERE key = 'identity'")
        if recorded:
            held = json.loads(recorded[0][0])["recovery_id"]
            raise ExecutionRecoveryMismatch(schema, f"the execution database records recovery identity {held}: a "
                                                    "restore replaces a lost database, never a living one")
    rows = 0
    tables = [name for name in sorted(ddl) if name != IDENTITY_TABLE] + [IDENTITY_TABLE]
    for name in tables:  # bounded by the profile's table count
        captured = document["database"].get(name, [])
        client.batch([(f"DROP TABLE IF EXISTS {name}", ()), (ddl[name], ())])
        for chunk in _chunks(captured):
            client.batch([_insert(name, row) for row in chunk])
        rows += len(captured)
        if progress is not None:
            progress(f"restored {name}: {len(captured)} rows")
    _open_ports(client)
    admitted = admit(store)
    if admitted != identity:  # the identity row restored is the backup's; anything else is a defect
        raise ExecutionRecoveryMismatch(schema, f"the restored identity {admitted.recovery_id} is not the backup's "
                                                f"{identity.recovery_id}")
    return Restored(identity, len(tables), rows, checked)


def _checked_document(schema: str, client: D1Client,
                      document: dict[str, Any]) -> tuple[D1RecoveryIdentity, dict[str, str]]:
    """The backup's identity and its DDL, unplaced (each ``cf_…`` name as the client places it)."""
    if document.get("format") != BACKUP_FORMAT or document.get("profile") != PROFILE:
        raise ExecutionRecoveryMismatch(schema, f"the document is not a {PROFILE} backup of format {BACKUP_FORMAT} "
                                                f"(format {document.get('format')!r}, profile "
                                                f"{document.get('profile')!r})")
    try:
        captured, rows, frontier = document["schema"], document["database"], document["r2_frontier"]
        identity = D1RecoveryIdentity(**document["identity"])
        tables, namespace, digest = captured["tables"], captured["namespace"], captured["digest"]
        shaped = isinstance(rows, dict) and isinstance(tables, dict) and isinstance(frontier, list)
    except (KeyError, TypeError) as exc:
        raise ExecutionRecoveryMismatch(schema, f"the document lacks a part of a backup ({exc})") from exc
    if not shaped:
        raise ExecutionRecoveryMismatch(schema, "the document's database, schema tables or frontier is misshapen")
    if hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest() != digest:
        raise ExecutionRecoveryMismatch(schema, "the backup's schema does not match its digest: the document was "
                                                "changed after its capture")
    if namespace != client.namespace or identity.schema != client.namespace:
        raise ExecutionRecoveryMismatch(schema, f"the backup was captured in namespace {namespace!r}; "
                                                f"this binding's is {client.namespace!r}, whose R2 objects are not "
                                                "the backup's")
    if IDENTITY_TABLE not in tables or set(rows) - set(tables):
        raise ExecutionRecoveryMismatch(schema, "the backup holds no recovery identity table, or rows of a table "
                                                "its schema lacks")
    placed = f"{namespace}__cf_" if namespace else "cf_"
    return identity, {name: sql.replace(placed, "cf_") for name, sql in tables.items()}


def _check_frontier(schema: str, client: D1Client, frontier: Sequence[dict[str, Any]]) -> int:
    """Every captured R2 object still there with its captured etag (R2 is never written here)."""
    for captured in frontier:  # one HEAD each: bounded by the captured frontier
        etag = client.head(captured["key"])
        if etag != captured["etag"]:
            state = "is missing" if etag is None else f"changed (etag {etag}, captured {captured['etag']})"
            raise ExecutionRecoveryMismatch(schema, f"the R2 object {captured['key']} of the backup's frontier "
                                                    f"{state}: the restored database would reference what R2 no "
                                                    "longer holds")
    return len(frontier)


def _chunks(rows: list[list[Any]]) -> list[list[list[Any]]]:
    return [rows[at:at + ROWS_PER_BATCH] for at in range(0, len(rows), ROWS_PER_BATCH)]


def _insert(table: str, row: list[Any]) -> Statement:
    return (f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", tuple(_value(v) for v in row))


def _value(cell: Any) -> Any:
    return base64.b64decode(cell["$b64"]) if isinstance(cell, dict) and "$b64" in cell else cell


def _open_ports(client: D1Client) -> None:
    """Each execution port opened once: its indexes and triggers are made again (``IF NOT EXISTS``)."""
    from contextful.storage.d1.awakeables import D1AwakeableStore
    from contextful.storage.d1.blobs import D1BlobStore
    from contextful.storage.d1.journal import D1JournalStore
    from contextful.storage.d1.outbox import D1OutboxStore

    D1JournalStore(client).close_store()
    D1BlobStore(client).close()
    D1AwakeableStore(client).close_store()
    D1OutboxStore(client).close()
