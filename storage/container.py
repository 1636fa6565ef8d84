"""The container profile (``CONTEXTFUL_STORAGE_PROFILE=postgres``): bindings, admission, recovery identity.

Implements ``run.journal.container-profile``, ``run.journal.postgres-stores``,
``run.journal.storage-incomplete`` and ``run.journal.execution-recovery`` (decisions
"run-substrate-storage" and "disposable-execution-state": every recorded value lives in one remote
execution database, so a machine can be thrown away mid-run). Under the profile the catalog,
journal, blobs, awakeables and outboxes share one PostgreSQL schema, the *execution database*, and
the store's objects live in an S3-compatible bucket the machine's working directory only caches
(``storage.corpus``).

Before an execution is admitted (the store's journal or outbox is first opened) :func:`admit`
checks, in order:

1. the bindings: a DSN, a corpus bucket (or a store root that is itself a bucket), the corpus
   state (the bucket's ``store.json``), strict execution guards (the session acknowledges a
   commit only once it is durable: ``synchronous_commit`` not off) and a supported outbox —
   anything missing is one ``StorageCapabilityMissing`` naming all of it;
2. the execution tables and the project recovery identity — missing tables, a missing identity,
   or one that differs from the corpus's (``recovery.json`` in the bucket) is
   ``ExecutionRecoveryMismatch``.

Normal start-up provisions no recovery identity: only :func:`provision` (``contextful store
provision``) creates the execution tables and records one, in the database first and then in the
bucket. It refuses a corpus that already carries an identity the database lacks: that is a
corpus-only restore (the execution database, with its paid-call records and pending exports, is
gone), and it admits no paid or effectful work until the execution database is restored.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import ExecutionRecoveryMismatch, StorageCapabilityMissing

if TYPE_CHECKING:
    from contextful.storage.catalog import Catalog
    from contextful.storage.catalog.postgres import PostgresCatalog
    from contextful.storage.objects import ObjectStore
    from contextful.storage.store import Store

PROFILE = "postgres"
RECOVERY_KEY = "recovery.json"
"""The corpus's copy of the recovery identity, at the bucket's store root."""

EXECUTION_TABLES = ("cf_journal_owners", "cf_journal_steps", "cf_blobs", "cf_awakeables", "cf_outbox_streams",
                    "cf_outbox_events", "cf_outbox_state", "cf_recovery")
_RECOVERY_DDL = "CREATE TABLE IF NOT EXISTS cf_recovery (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


@dataclass(frozen=True)
class ContainerBindings:
    """What the profile is bound to, read from the environment when the store opens."""

    dsn: str
    """``CONTEXTFUL_POSTGRES_DSN``: the execution database."""
    schema: str
    """``CONTEXTFUL_POSTGRES_SCHEMA`` (default ``contextful``)."""
    bucket: str | None
    """``CONTEXTFUL_CORPUS_BUCKET`` (``s3://bucket/prefix``), else the store root when it is remote."""


def container_bindings(root_is_local: bool, root_url: str) -> ContainerBindings:
    bucket = os.environ.get("CONTEXTFUL_CORPUS_BUCKET") or (None if root_is_local else root_url)
    return ContainerBindings(os.environ.get("CONTEXTFUL_POSTGRES_DSN", ""),
                             os.environ.get("CONTEXTFUL_POSTGRES_SCHEMA") or "contextful", bucket)


@dataclass(frozen=True)
class RecoveryIdentity:
    """Binds the project's corpus (its store uuid and bucket) and schema to one execution database."""

    recovery_id: str
    store_uuid: str
    schema: str
    corpus: str

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _connect(catalog: PostgresCatalog) -> Any:
    from contextful.storage.dbapi import postgres_connection, postgres_error

    try:
        return postgres_connection(catalog.dsn, catalog.schema)
    except Exception as exc:
        mapped = postgres_error(catalog.schema, exc, catalog.dsn)
        if mapped is None:
            raise
        raise mapped from exc


def _corpus(store: Store) -> ObjectStore:
    """Where the corpus's own objects are read: the bucket behind a working copy, else the root."""
    from contextful.storage.corpus import CorpusMirror

    return store.objects.remote if isinstance(store.objects, CorpusMirror) else store.objects


def _catalog(store: Store) -> PostgresCatalog:
    from contextful.storage.catalog.postgres import PostgresCatalog

    if not isinstance(store.catalog, PostgresCatalog):
        raise StorageCapabilityMissing(PROFILE, (f"a PostgreSQL catalog (this store's is {store.catalog.backend})",))
    return store.catalog


def require_corpus_state(corpus: ObjectStore, catalog: Catalog) -> None:
    """Refuse to open a corpus that lost its ``store.json`` while the catalog serves a store: a new
    one minted there would bind the corpus to another store for good.

    A catalog is bound only after its ``store.json`` is in the bucket, so when the catalog turns out
    bound the bucket is asked again: a machine that opened the new store between the first look and
    the catalog's answer is joined, not taken for a lost corpus."""
    from contextful.storage.catalog.postgres import PostgresCatalog

    if corpus.exists("store.json") or not isinstance(catalog, PostgresCatalog):
        return
    conn = _connect(catalog)
    try:
        present = conn.execute("SELECT to_regclass('cf_meta') IS NOT NULL").fetchone()[0]
        bound = present and conn.execute("SELECT value FROM cf_meta WHERE key = 'store_uuid'").fetchone()
    finally:
        conn.close()
    if bound and not corpus.exists("store.json"):
        raise StorageCapabilityMissing(PROFILE, ((f"the corpus state: {corpus.url} holds no store.json, and the "
                                                 f"catalog serves store {bound[0]}"),))


def check_bindings(store: Store) -> None:
    """``StorageCapabilityMissing`` naming every binding or capability the store lacks."""
    bindings = store.container
    if bindings is None:
        raise StorageCapabilityMissing(store.catalog.profile, ((f"the container profile (CONTEXTFUL_STORAGE_PROFILE="
                                                               f"{PROFILE}): this store did not open under it"),))
    missing = []
    if not bindings.dsn:
        missing.append("CONTEXTFUL_POSTGRES_DSN (the execution database)")
    if bindings.bucket is None:
        missing.append("CONTEXTFUL_CORPUS_BUCKET (the corpus's S3-compatible bucket, s3://bucket/prefix)")
    elif not _corpus(store).exists("store.json"):
        missing.append(f"the corpus state: {bindings.bucket} holds no store.json")
    catalog = _catalog(store)
    conn = _connect(catalog)
    try:
        # A session may turn synchronous_commit off (a DSN's options, a role's default): then a
        # recorded step could be acknowledged and lost. The server's own fsync is its operator's.
        if conn.execute("SHOW synchronous_commit").fetchone()[0] == "off":
            missing.append("strict execution guards: the session's synchronous_commit is off, so a journal write "
                           "it acknowledges may not survive")
    finally:
        conn.close()
    if missing:
        raise StorageCapabilityMissing(PROFILE, tuple(missing))


def _has_recovery_table(conn: Any) -> bool:
    return bool(conn.execute("SELECT to_regclass('cf_recovery') IS NOT NULL").fetchone()[0])


def _recorded(conn: Any) -> RecoveryIdentity | None:
    row = conn.execute("SELECT value FROM cf_recovery WHERE key = 'identity'").fetchone()
    return None if row is None else RecoveryIdentity(**json.loads(row[0]))


def _in_corpus(corpus: ObjectStore) -> RecoveryIdentity | None:
    try:
        return RecoveryIdentity(**json.loads(corpus.get_bytes(RECOVERY_KEY)))
    except FileNotFoundError:
        return None


def admit(store: Store) -> RecoveryIdentity:
    """Admit executions over ``store`` (opened under the container profile), or refuse: see above."""
    check_bindings(store)
    catalog = _catalog(store)
    conn = _connect(catalog)
    try:
        present = {row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (catalog.schema,))}
        absent = [t for t in EXECUTION_TABLES if t not in present]
        if absent:
            raise ExecutionRecoveryMismatch(catalog.schema, f"the execution tables {', '.join(absent)} are missing")
        recorded = _recorded(conn)
    finally:
        conn.close()
    corpus = _in_corpus(_corpus(store))
    if recorded is None:
        raise ExecutionRecoveryMismatch(catalog.schema, "no project recovery identity is recorded")
    if corpus is None or corpus.recovery_id != recorded.recovery_id:
        held = "none" if corpus is None else corpus.recovery_id
        raise ExecutionRecoveryMismatch(catalog.schema, f"its recovery identity {recorded.recovery_id} is not the "
                                                        f"corpus's ({held})")
    if (recorded.store_uuid, recorded.schema) != (store.uuid, catalog.schema):
        raise ExecutionRecoveryMismatch(catalog.schema, f"its recovery identity binds store {recorded.store_uuid} in "
                                                        f"schema {recorded.schema!r}, not store {store.uuid} in "
                                                        f"{catalog.schema!r}")
    return recorded


def provision(store: Store) -> RecoveryIdentity:
    """Create the execution tables and record the project recovery identity (idempotent).

    The identity goes into the database first and the bucket second, so a crash in between leaves
    a database identity the next call copies to the bucket. A bucket identity the database lacks
    (a corpus-only restore) or differs from is refused with ``ExecutionRecoveryMismatch``.
    """
    from contextful.storage.awakeables.postgres import PostgresAwakeableStore
    from contextful.storage.blobs.postgres import PostgresBlobStore
    from contextful.storage.journal.postgres import PostgresJournalStore
    from contextful.storage.outbox.postgres import PostgresOutboxStore

    check_bindings(store)
    catalog = _catalog(store)
    corpus_objects = _corpus(store)
    in_corpus = _in_corpus(corpus_objects)
    conn = _connect(catalog)
    try:
        if in_corpus is not None and (not _has_recovery_table(conn) or _recorded(conn) is None):
            raise ExecutionRecoveryMismatch(
                catalog.schema, f"the corpus carries recovery identity {in_corpus.recovery_id} and this execution "
                                "database none: a corpus-only restore admits no paid or effectful work")
        # Each port makes its tables when it opens.
        PostgresJournalStore(catalog.dsn, catalog.schema).close_store()
        PostgresBlobStore(catalog.dsn, catalog.schema).close()
        PostgresAwakeableStore(catalog.dsn, catalog.schema).close_store()
        PostgresOutboxStore(catalog.dsn, catalog.schema).close()
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"contextful-recovery:{catalog.schema}",))
            conn.execute(_RECOVERY_DDL)
            recorded = _recorded(conn)
            if recorded is None:
                recorded = RecoveryIdentity(uuid.uuid4().hex, store.uuid, catalog.schema, corpus_objects.url)
                conn.execute("INSERT INTO cf_recovery (key, value) VALUES ('identity', %s)", (recorded.dumps(),))
    finally:
        conn.close()
    if in_corpus is None:
        corpus_objects.put_if_absent(RECOVERY_KEY, recorded.dumps().encode())
        in_corpus = _in_corpus(corpus_objects)
    if in_corpus is None or in_corpus.recovery_id != recorded.recovery_id:
        raise ExecutionRecoveryMismatch(catalog.schema, f"its recovery identity {recorded.recovery_id} is not the "
                                                        f"corpus's ({in_corpus.recovery_id if in_corpus else 'none'})")
    return recorded
