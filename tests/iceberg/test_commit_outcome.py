"""An export commit whose outcome the catalog never reported: resolved before anything is deleted.

Real faults on a SQL catalog on the real PostgreSQL, reached through a loopback proxy
(``tests/support/pg_proxy.py``) that cuts the connection at the COMMIT: after the server committed
(the client never hears it), or before the COMMIT reaches the server. Each test keeps its catalog
tables in a schema of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from contextful.iceberg.commit import export_table
from contextful.storage.errors import CommitOutcomeUnknown, TransientError
from pyiceberg.catalog.sql import SqlCatalog

from tests.iceberg.test_commit import IDENT, assert_no_stray_files, read, rows
from tests.support.pg_proxy import PgProxy

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[PgProxy, SqlCatalog, SqlCatalog]]:
    """(the proxy, a catalog through it, the same catalog reached directly)."""
    parts = dict(item.split("=", 1) for item in pg_dsn.split())
    schema = f"iceberg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as con:
        con.execute(f"CREATE SCHEMA {schema}")
    proxy = PgProxy(pg_dsn).start()
    warehouse = f"file://{tmp_path / 'wh'}"
    options = f"sslmode=disable&options=-csearch_path%3D{schema}"
    user, db = parts.get("user", "postgres"), parts["dbname"]
    through = SqlCatalog("outcome", uri=f"postgresql+psycopg://{user}@127.0.0.1:{proxy.port}/{db}?{options}",
                         warehouse=warehouse)
    direct = SqlCatalog("outcome", uri=f"postgresql+psycopg://{user}@{parts['host']}:{parts['port']}/{db}?{options}",
                        warehouse=warehouse)
    through.create_namespace("exports")
    try:
        yield proxy, through, direct
    finally:
        through.engine.dispose()
        direct.engine.dispose()
        proxy.stop()
        with psycopg.connect(pg_dsn, autocommit=True) as con:
            con.execute(f"DROP SCHEMA {schema} CASCADE")


def files_on_disk(root: Path) -> set[str]:
    return {f"file://{p}" for p in root.rglob("*") if p.suffix in (".avro", ".parquet")}


def test_a_commit_the_server_made_but_the_client_never_heard_is_resolved_as_landed(
        pg: tuple[PgProxy, SqlCatalog, SqlCatalog], tmp_path: Path) -> None:
    proxy, catalog, direct = pg
    first = export_table(catalog, IDENT, rows([1, 2], "a"))
    proxy.cut_after_commit(b"")
    result = export_table(catalog, IDENT, rows([3, 4, 5], "b"))
    assert proxy.fired.is_set()  # the connection died right after the server's COMMIT

    table = direct.load_table(IDENT)
    current = table.current_snapshot()
    assert current is not None and current.snapshot_id == result.snapshot_id
    assert current.parent_snapshot_id == first.snapshot_id
    assert (result.attempts, result.operation, result.rows) == (1, "overwrite", 3)
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id, result.snapshot_id]  # landed once
    assert read(table) == rows([3, 4, 5], "b").to_pylist()  # its files were kept
    assert_no_stray_files(table, tmp_path / "wh")


def test_a_commit_that_never_reached_the_server_is_sent_again_and_lands_once(
        pg: tuple[PgProxy, SqlCatalog, SqlCatalog], tmp_path: Path) -> None:
    proxy, catalog, direct = pg
    first = export_table(catalog, IDENT, rows([1, 2], "a"))
    proxy.cut_before(b"COMMIT")
    result = export_table(catalog, IDENT, rows([7], "c"))
    assert proxy.fired.is_set()

    table = direct.load_table(IDENT)
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id, result.snapshot_id]
    assert result.attempts == 1
    assert read(table) == rows([7], "c").to_pylist()
    assert_no_stray_files(table, tmp_path / "wh")


def test_an_outcome_that_cannot_be_resolved_deletes_nothing_and_raises_commit_outcome_unknown(
        pg: tuple[PgProxy, SqlCatalog, SqlCatalog], tmp_path: Path) -> None:
    proxy, catalog, direct = pg
    first = export_table(catalog, IDENT, rows([1, 2], "a"))
    before = files_on_disk(tmp_path / "wh")
    proxy.cut_after_commit(b"", then_refuse=True)  # the server commits, then the catalog stays unreachable
    with pytest.raises(CommitOutcomeUnknown) as caught:
        export_table(catalog, IDENT, rows([3, 4], "b"))
    err = caught.value
    assert isinstance(err, TransientError) and err.category == "unknown"
    assert (err.exit_code, err.http_status) == (75, 503)
    assert err.target == f"Iceberg table {IDENT!r}" and IDENT in str(err) and "nothing was deleted" in str(err)
    written = files_on_disk(tmp_path / "wh") - before
    assert {p.rsplit(".", 1)[-1] for p in written} == {"parquet", "avro"}  # data file, manifests, list: all kept

    # The commit had landed: deleting the files would have broken the table's current snapshot.
    table = direct.load_table(IDENT)
    current = table.current_snapshot()
    assert current is not None and current.parent_snapshot_id == first.snapshot_id
    assert err.run_id == str(current.snapshot_id)
    assert read(table) == rows([3, 4], "b").to_pylist()
    assert_no_stray_files(table, tmp_path / "wh")


class RivalOnResolve:
    """The catalog through the proxy, except that a rival export lands on the direct catalog just before
    the first reload that follows the proxy's cut (the reload resolving our unheard commit)."""

    def __init__(self, real: SqlCatalog, direct: SqlCatalog, proxy: PgProxy) -> None:
        self._real, self._direct, self._proxy = real, direct, proxy
        self.rival: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def load_table(self, identifier: str) -> Any:
        if self._proxy.fired.is_set() and self.rival is None:
            self.rival = export_table(self._direct, IDENT, rows([99], "rival")).snapshot_id
        return self._real.load_table(identifier)


def test_an_unheard_commit_found_not_landed_is_a_lost_attempt_and_the_retry_lands(
        pg: tuple[PgProxy, SqlCatalog, SqlCatalog], tmp_path: Path) -> None:
    proxy, catalog, direct = pg
    first = export_table(catalog, IDENT, rows([1, 2], "a"))
    racing = RivalOnResolve(catalog, direct, proxy)
    proxy.cut_before(b"COMMIT")  # the COMMIT never reaches the server; then a rival moves main
    result = export_table(racing, IDENT, rows([5, 6], "ours"))  # type: ignore[arg-type]

    table = direct.load_table(IDENT)
    assert racing.rival is not None
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id, racing.rival, result.snapshot_id]
    ours = table.snapshot_by_id(result.snapshot_id)
    assert ours is not None and ours.parent_snapshot_id == racing.rival and result.attempts == 2
    assert read(table) == rows([5, 6], "ours").to_pylist()
    assert_no_stray_files(table, tmp_path / "wh")  # the lost attempt's manifests and list were deleted
