"""Shared fixtures: real PostgreSQL and S3-compatible servers on loopback, and stores over them.

The servers start once per session, on first use. ``store`` runs a test against every store
configuration: a local root with the SQLite catalog, the PostgreSQL catalog, and an S3 root.
``decoder`` is a real decoder fork server, one per test module.
"""

from __future__ import annotations

import compileall
import dataclasses
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from contextful.engine.land.decode import Decoder
from contextful.storage import ManualClock, Store
from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.d1.client import D1Binding

from tests.storage.catalog_place import CatalogPlace, place_for
from tests.support.miniflare_server import MiniflareServer, unavailable
from tests.support.postgres_server import PostgresServer
from tests.support.s3_server import S3Server


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the package's bytecode once, as an installed wheel has it. An editable install run
    with ``PYTHONDONTWRITEBYTECODE`` set would otherwise recompile ~180 modules in every command
    and decoder child the tests start (0.3 s each, hundreds of them)."""
    root = Path(__file__).resolve().parents[1]
    for package in ("contextful", "engine", "storage", "iceberg", "datasets"):
        compileall.compile_dir(root / package, quiet=1)


@pytest.fixture(scope="module")
def decoder() -> Iterator[Decoder]:
    """A decoder fork server shared by the tests of one module."""
    with Decoder() as shared:
        yield shared


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    dsn = os.environ.get("CONTEXTFUL_TEST_POSTGRES_DSN")
    if dsn:
        yield dsn
        return
    server = PostgresServer().start()
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def pg_schema() -> str:
    """A fresh PostgreSQL schema name, so tests sharing the server share nothing else."""
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def d1_server() -> Iterator[D1Binding]:
    """The D1 profile's Worker under miniflare on loopback, one per session (or the one
    ``CONTEXTFUL_TEST_D1_URL``/``CONTEXTFUL_TEST_D1_TOKEN`` name); skipped, saying why, only where
    node or the ``npm ci`` install is missing."""
    url, token = os.environ.get("CONTEXTFUL_TEST_D1_URL"), os.environ.get("CONTEXTFUL_TEST_D1_TOKEN")
    if url and token:
        yield D1Binding(url, token)
        return
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = MiniflareServer().start()
    try:
        yield D1Binding(server.url, server.token)
    finally:
        server.stop()


@pytest.fixture
def d1_binding(d1_server: D1Binding) -> D1Binding:
    """A binding to the session's Worker in a fresh namespace, so tests sharing it share nothing else."""
    return dataclasses.replace(d1_server, namespace=MiniflareServer.new_namespace())


StoreFactory = Callable[..., Store]


@pytest.fixture(params=["local", "postgres", "s3"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Open stores of one kind; every call with the same ``name`` opens the same store."""
    opened: list[Store] = []
    kind = request.node.callspec.params.get("store_kind", "local") if hasattr(request.node, "callspec") else "local"
    roots: dict[str, tuple[str, dict]] = {}

    def factory(name: str = "main", **kwargs) -> Store:
        if kind == "s3":
            server = request.getfixturevalue("s3_server")
            if name not in roots:
                roots[name] = (f"s3://{server.new_bucket()}/store", server.storage_options)
            root, options = roots[name]
            store = Store.open(root, storage_options=options, catalog_path=str(tmp_path / f"{name}-catalog.sqlite"),
                               **kwargs)
        elif kind == "postgres":
            dsn = request.getfixturevalue("pg_dsn")
            if name not in roots:
                roots[name] = (str(tmp_path / name), {"schema": f"t_{uuid.uuid4().hex[:16]}"})
            root, options = roots[name]
            store = Store.open(root, catalog=PostgresCatalog(dsn, options["schema"]), **kwargs)
        else:
            store = Store.open(tmp_path / name, **kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory, store_kind: str) -> Store:
    """A store of each kind (local/SQLite, PostgreSQL catalog, S3 root), with a manual clock."""
    return make_store(clock=ManualClock())


@pytest.fixture
def local_store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "store", clock=ManualClock())
    yield store
    store.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> CatalogPlace:
    """Where a test's stores keep their catalog (tests/storage/catalog_place.py): SQLite, then PostgreSQL."""
    if request.param == "sqlite":
        return place_for("sqlite", tmp_path)
    return place_for("postgres", tmp_path, request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema"))
