"""The store table layer and the storage ports.

Transactional Parquet tables over fsspec (``Store``, ``Table``), the catalog port with SQLite and
PostgreSQL adapters, run manifests, schema reconciliation, folds and collection, the reserved run
record, and the blob store port. Nothing here imports ``engine`` or ``iceberg``.
"""

from contextful.storage.clock import ManualClock, SystemClock
from contextful.storage.store import Store
from contextful.storage.table import Table
from contextful.storage.transaction import CommitResult, RunTransaction

__all__ = ["CommitResult", "ManualClock", "RunTransaction", "Store", "SystemClock", "Table"]
