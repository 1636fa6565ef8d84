"""DuckDB connections that can read the store's parts wherever they live.

Local parts are plain paths. For a remote root the store's fsspec filesystem is registered with
the connection, so ``read_parquet('s3://…')`` goes through s3fs with the store's own credentials
and endpoint (DuckDB's own extensions are not needed and not downloaded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.storage.lazy import lazy_module
from contextful.storage.objects import ObjectStore

if TYPE_CHECKING:
    import duckdb
else:
    duckdb = lazy_module("duckdb")


def connect(objects: ObjectStore, database: str = ":memory:") -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(database, config={"autoload_known_extensions": False,
                                           "autoinstall_known_extensions": False})
    if not objects.is_local:
        con.register_filesystem(objects.fs)
    return con
