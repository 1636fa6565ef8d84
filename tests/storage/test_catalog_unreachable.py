"""A PostgreSQL catalog whose server goes away reports ``CatalogUnavailable``, never a driver error.

The catalog connects through a loopback proxy (``tests.support.pg_proxy``) to the real server; the
proxy then stops (its port closed, its connections cut), so the catalog's next operation loses its
connection and cannot make a new one. Each operation, read or write, raises ``CatalogUnavailable``
(transient, exit 75) with the password of its DSN masked. Connecting to a port nothing listens on is
covered end to end by tests/engine/cli/test_project_discovery.py.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.errors import CatalogUnavailable

from tests.support.pg_proxy import PgProxy

PASSWORD = "hunter2sekrit"


@pytest.mark.postgres
def test_a_connection_lost_for_good_is_catalog_unavailable_with_the_password_masked(pg_dsn: str) -> None:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    proxy = PgProxy(pg_dsn).start()
    catalog = PostgresCatalog(f"{proxy.dsn()} password={PASSWORD}", schema)  # trust auth: the password is unused
    try:
        catalog.create_table("t", str(uuid.uuid4()), (), 1)
        proxy.stop()
        for operation in (catalog.list_heads, lambda: catalog.load_head("t"),
                          lambda: catalog.create_table("u", str(uuid.uuid4()), (), 2)):
            with pytest.raises(CatalogUnavailable) as info:
                operation()
            assert info.value.backend == f"postgres:{schema}" and info.value.exit_code == 75
            assert f"port {proxy.port}" in str(info.value) and PASSWORD not in str(info.value)
            assert isinstance(info.value.__cause__, psycopg.OperationalError)
    finally:
        catalog.close()
        proxy.stop()
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
