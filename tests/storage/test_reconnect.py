"""Each PostgreSQL adapter — catalog, journal store, blob store — survives losing its connection.

Between two operations the adapter's backend is terminated (``pg_terminate_backend``, as an
administrator or a server restart does); the next operation reconnects and succeeds, and so does
every one after it: the loss costs one retried operation, not the rest of the process's life.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from contextful.storage.blobs.postgres import PostgresBlobStore
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.journal import open_journal_store

from tests.storage.test_catalog_conformance import at, request


def terminate(dsn: str, application_name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                              (application_name,)).fetchall()
    assert killed, f"no backend of {application_name}"


@pytest.fixture
def named(pg_dsn: str) -> tuple[str, str, str]:
    """A DSN whose backends carry a name of their own, that name, and a fresh schema."""
    name = f"cf-{uuid.uuid4().hex[:12]}"
    return f"{pg_dsn} application_name={name}", name, f"t_{uuid.uuid4().hex[:16]}"


def test_the_catalog_reconnects_for_reads_and_commits(pg_dsn: str, named: tuple[str, str, str]) -> None:
    dsn, name, schema = named
    catalog = PostgresCatalog(dsn, schema)
    try:
        catalog.create_table("t", str(uuid.uuid4()), (), 1)
        terminate(pg_dsn, name)
        assert catalog.load_head("t") is not None  # a read after the loss
        terminate(pg_dsn, name)
        assert catalog.commit(request(), at(2)) == 1  # a commit after the loss
        terminate(pg_dsn, name)
        assert catalog.commit(request(), at(3)) == 2
        assert [c.commit_seq for c in catalog.commits("t")] == [1, 2]
    finally:
        catalog.close()


def test_the_journal_store_reconnects(pg_dsn: str, named: tuple[str, str, str]) -> None:
    dsn, name, schema = named
    journal = open_journal_store("postgres", dsn=dsn, schema=schema)
    try:
        owner = journal.claim("scope", "plan", "holder", 1, 1_000_000)
        terminate(pg_dsn, name)
        assert journal.record(owner.execution_id, 0, "step", b"value", 2) == b"value"
        terminate(pg_dsn, name)
        assert journal.owner("scope") is not None
        assert [s.value for s in journal.steps(owner.execution_id)] == [b"value"]
    finally:
        journal.close_store()


def test_the_blob_store_reconnects(pg_dsn: str, named: tuple[str, str, str]) -> None:
    dsn, name, schema = named
    blobs = PostgresBlobStore(dsn, schema)
    try:
        digest = blobs.put(b"first")
        terminate(pg_dsn, name)
        assert blobs.get(digest) == b"first"
        terminate(pg_dsn, name)
        second = blobs.put(b"second")
        assert blobs.exists(second) and blobs.get(second) == b"second"
    finally:
        blobs.close()
