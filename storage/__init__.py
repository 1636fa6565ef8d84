"""The store table layer and the storage ports.

Transactional Parquet tables over fsspec (``Store``, ``Table``), the catalog port with SQLite and
PostgreSQL adapters, run manifests, schema reconciliation, folds and collection, the reserved run
record, and the blob store port. Nothing here imports ``engine`` or ``iceberg``.

The names below load on first use, so importing one light module of the package (the error
catalogue, the clock, a catalog) does not load Arrow and the table layer with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextful.storage.clock import ManualClock, SystemClock
    from contextful.storage.store import Store
    from contextful.storage.table import Table
    from contextful.storage.transaction import CommitResult, RunTransaction

__all__ = ["CommitResult", "ManualClock", "RunTransaction", "Store", "SystemClock", "Table"]

_WHERE = {
    "CommitResult": "contextful.storage.transaction",
    "ManualClock": "contextful.storage.clock",
    "RunTransaction": "contextful.storage.transaction",
    "Store": "contextful.storage.store",
    "SystemClock": "contextful.storage.clock",
    "Table": "contextful.storage.table",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
