"""The D1 profile's recovery identity, its admission check and its backup capture.

Implements ``run.journal.d1-recovery``, ``run.journal.d1-backup`` and the D1 half of
``run.journal.execution-recovery`` (decision "run-substrate-storage"; the container profile's
counterpart is ``storage.container``). Under ``CONTEXTFUL_STORAGE_PROFILE=cloudflare-d1`` the
*execution database* is the binding's D1 namespace and the corpus is its R2 namespace
(``storage.d1.objects``: parts and manifests under ``corpus/``, blob content under ``blobs/``).

* **The recovery identity** binds one project (the store's uuid) and schema (the binding's
  namespace) to an R2 object frontier: the identity object ``corpus/recovery.json`` in R2 and
  its *generation*, a token minted with the identity. D1's ``cf_recovery`` holds the same. :func:`provision` (``contextful store provision``) creates the
  execution tables and records it, in D1 first and then in R2; normal start-up provisions none.
* **Admission** (:func:`admit`, before the store's journal or outbox is first opened): missing
  execution tables, no recorded identity, a missing identity object in R2, or one whose
  recovery id or generation is not D1's (the bucket was replaced or restored apart from the
  database) raise ``ExecutionRecoveryMismatch``. A corpus carrying an identity the database lacks
  is a corpus-only restore: :func:`provision` refuses it, so it admits no paid or effectful work.
* **Backup** (:func:`capture`, ``contextful store backup``): one JSON document holding every
  ``cf_…`` table of the execution database (rows and DDL: the journal, awakeables, blob
  references, export and guard rows, the catalog), the R2 frontier (every object under
  ``blobs/`` and ``corpus/`` with its size and etag), the recovery identity and the executable
  schema. It is taken between two reads of the execution database's write frontier and refused
  (``ExecutionRecoveryMismatch``) when a writer moved it meanwhile, so a capture never mixes two
  states: take it before writers resume.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.d1.catalog import D1Catalog
from contextful.storage.d1.client import D1Client
from contextful.storage.d1.objects import CORPUS_PREFIX
from contextful.storage.d1.profile import PROFILE
from contextful.storage.errors import ExecutionRecoveryMismatch, StorageCapabilityMissing

if TYPE_CHECKING:
    from contextful.storage.store import Store

IDENTITY_KEY = f"{CORPUS_PREFIX}/recovery.json"
"""The R2 key of the corpus's copy of the recovery identity (relative to the binding's namespace)."""
EXECUTION_TABLES = ("cf_journal_owners", "cf_journal_steps", "cf_blobs", "cf_awakeables", "cf_outbox_streams",
                    "cf_outbox_events", "cf_outbox_state", "cf_recovery")
_RECOVERY_DDL = "CREATE TABLE IF NOT EXISTS cf_recovery (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
FRONTIER_PREFIXES = ("blobs/", f"{CORPUS_PREFIX}/")
BACKUP_FORMAT = 1


@dataclass(frozen=True)
class D1RecoveryIdentity:
    """Binds the project's store and schema (namespace) to the R2 identity object's generation."""

    recovery_id: str
    store_uuid: str
    schema: str
    generation: str
    """The R2 object frontier's generation: a token minted with the identity, held by D1 and by
    ``corpus/recovery.json`` alike; a frontier written for another generation does not match."""

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _client(store: Store) -> D1Client:
    if not isinstance(store.catalog, D1Catalog):
        raise StorageCapabilityMissing(PROFILE, (f"a D1 catalog (this store's is {store.catalog.backend})",))
    return store.catalog.client


def _schema(client: D1Client) -> str:
    return client.namespace or "(the deployment's own)"


def _tables(client: D1Client) -> dict[str, str]:
    """The execution database's ``cf_…`` tables by their unplaced name, each with its DDL."""
    placed = client.sql("cf_")
    rows = client.query("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND substr(name, 1, ?) = ? "
                        "ORDER BY name", (len(placed), placed))
    return {"cf_" + str(name)[len(placed):]: str(sql) for name, sql in rows}


def _recorded(client: D1Client) -> D1RecoveryIdentity | None:
    rows = client.query("SELECT value FROM cf_recovery WHERE key = 'identity'")
    return None if not rows else D1RecoveryIdentity(**json.loads(rows[0][0]))


def _in_corpus(client: D1Client) -> D1RecoveryIdentity | None:
    """The identity object in R2; None: absent."""
    data = client.get(IDENTITY_KEY)
    return None if data is None else D1RecoveryIdentity(**json.loads(data))


def admit(store: Store) -> D1RecoveryIdentity:
    """Admit executions over ``store`` (opened under the D1 profile), or raise ``ExecutionRecoveryMismatch``."""
    client = _client(store)
    schema = _schema(client)
    absent = [t for t in EXECUTION_TABLES if t not in _tables(client)]
    if absent:
        raise ExecutionRecoveryMismatch(schema, f"the execution tables {', '.join(absent)} are missing")
    recorded = _recorded(client)
    if recorded is None:
        raise ExecutionRecoveryMismatch(schema, "no project recovery identity is recorded")
    held = _in_corpus(client)
    if held is None:
        raise ExecutionRecoveryMismatch(schema, f"the R2 object {IDENTITY_KEY} of recovery identity "
                                                f"{recorded.recovery_id} is missing")
    if (held.recovery_id, held.generation) != (recorded.recovery_id, recorded.generation):
        raise ExecutionRecoveryMismatch(schema, f"its recovery identity {recorded.recovery_id} at generation "
                                                f"{recorded.generation} is not the corpus's ({held.recovery_id} at "
                                                f"generation {held.generation})")
    if (recorded.store_uuid, recorded.schema) != (store.uuid, client.namespace):
        raise ExecutionRecoveryMismatch(schema, f"its recovery identity binds store {recorded.store_uuid} in schema "
                                                f"{recorded.schema!r}, not store {store.uuid} in {client.namespace!r}")
    return recorded


def provision(store: Store) -> D1RecoveryIdentity:
    """Create the execution tables and record the project recovery identity (idempotent).

    The identity goes to D1 first and to R2 second, so a crash in between leaves a D1 identity the
    next call copies to R2. An R2 identity D1 lacks (a corpus-only restore) or differs from is refused.
    """
    from contextful.storage.d1.awakeables import D1AwakeableStore
    from contextful.storage.d1.blobs import D1BlobStore
    from contextful.storage.d1.journal import D1JournalStore
    from contextful.storage.d1.outbox import D1OutboxStore

    client = _client(store)
    schema = _schema(client)
    in_corpus = _in_corpus(client)
    recorded = _recorded(client) if "cf_recovery" in _tables(client) else None
    if in_corpus is not None and recorded is None:
        raise ExecutionRecoveryMismatch(schema, f"the corpus carries recovery identity {in_corpus.recovery_id} and "
                                                "this execution database none: a corpus-only restore admits no paid "
                                                "or effectful work")
    D1JournalStore(client).close_store()  # each port makes its tables when it opens
    D1BlobStore(client).close()
    D1AwakeableStore(client).close_store()
    D1OutboxStore(client).close()
    minted = D1RecoveryIdentity(uuid.uuid4().hex, store.uuid, client.namespace, uuid.uuid4().hex)
    client.batch([(_RECOVERY_DDL, ()),
                  ("INSERT INTO cf_recovery (key, value) VALUES ('identity', ?) ON CONFLICT (key) DO NOTHING",
                   (minted.dumps(),))], rerun_unheard=True)
    recorded = _recorded(client)
    assert recorded is not None  # inserted above, or there already
    if in_corpus is None:
        client.put(IDENTITY_KEY, recorded.dumps().encode(), only_if="absent")
        in_corpus = _in_corpus(client)
    if in_corpus != recorded:
        raise ExecutionRecoveryMismatch(schema, f"its recovery identity {recorded.recovery_id} is not the corpus's "
                                                f"({in_corpus.recovery_id if in_corpus else 'none'})")
    return recorded


def _write_frontier(client: D1Client) -> list[tuple[Any, ...]]:
    """What moves with every write to the execution database: each catalog head and owner row."""
    rows = client.batch([("SELECT name, commit_seq FROM cf_tables ORDER BY name", ()),
                         ("SELECT * FROM cf_journal_owners ORDER BY scope", ()),
                         ("SELECT count(*), max(recorded_us) FROM cf_journal_steps", ())], write=False)
    return [tuple(r) for result in rows for r in result.rows]


def capture(store: Store, *, during: Callable[[], None] | None = None) -> dict[str, Any]:
    """The backup of ``store``'s execution database and R2 frontier, as one JSON-ready document (above).

    ``during`` runs once the write frontier is read and before the rows are (a seam: a test commits
    a writer's change there)."""
    client = _client(store)
    identity = admit(store)  # a backup of an unadmitted database would restore nothing runnable
    before = _write_frontier(client)
    if during is not None:
        during()
    tables = _tables(client)
    rows: dict[str, Any] = {}
    for name in tables:  # bounded by the profile's table count, not by data
        result = client.query(f"SELECT * FROM {name}")
        rows[name] = [[_cell(v) for v in row] for row in result]
    frontier = [{"key": o.key, "size": o.size, "etag": o.etag}
                for prefix in FRONTIER_PREFIXES for o in client.list(prefix)]
    if _write_frontier(client) != before:
        raise ExecutionRecoveryMismatch(_schema(client), "a writer committed while the backup was captured; stop "
                                                         "writers and capture again")
    ddl = {name: tables[name] for name in sorted(tables)}
    return {"format": BACKUP_FORMAT, "profile": PROFILE, "identity": asdict(identity),
            "schema": {"namespace": client.namespace, "tables": ddl,
                       "digest": hashlib.sha256(json.dumps(ddl, sort_keys=True).encode()).hexdigest()},
            "database": rows, "r2_frontier": frontier}


def _cell(value: Any) -> Any:
    return {"$b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value
