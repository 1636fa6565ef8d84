"""A relational landing of orders with their items, and what a notebook connection sees of it torn.

Shared by the tests proving that a landing's root and child tables publish at one point
(``tests/engine/land/test_atomic_landing.py``, ``tests/storage/test_commit_outcome.py``).
"""

from __future__ import annotations

import contextful.engine.read
import pyarrow as pa
from contextful.engine.config.manifest import PipelineSpec, SourceSpec
from contextful.engine.land.sink import LandingSink
from contextful.storage import Store

ORDERS = PipelineSpec(id="orders", source=SourceSpec("files"), table="orders", normalize="relational")
CHILD = "orders__items"
ITEMS_PER_ORDER = 2


def orders(ids: list[int]) -> pa.Table:
    """Orders ``ids`` as they arrive, each with two items."""
    return pa.table({"id": ids, "items": [[{"sku": f"{i}-{j}"} for j in range(ITEMS_PER_ORDER)] for i in ids]})


def land_orders(store: Store, ids: list[int]) -> None:
    """One relational landing of orders ``ids`` and the pipeline's position."""
    sink = LandingSink(store, ORDERS)
    try:
        sink.stage(orders(ids))
        sink.commit("pipeline:orders", {"landed": ids})
    finally:
        sink.abort()


def torn(store: Store) -> tuple[int, int]:
    """What a notebook connection sees torn: child rows whose root row is missing, and root rows
    missing some of their children."""
    con = contextful.engine.read.connect(store)
    try:
        views = {r[0] for r in con.sql("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
        if CHILD not in views:
            return 0, con.sql("SELECT count(*) FROM orders").fetchall()[0][0] if "orders" in views else 0
        if "orders" not in views:
            return con.sql(f"SELECT count(*) FROM {CHILD}").fetchall()[0][0], 0
        orphans = con.sql(f"SELECT count(*) FROM {CHILD} c WHERE NOT EXISTS"
                          " (SELECT 1 FROM orders o WHERE o._cf_id = c._cf_parent_id)").fetchall()[0][0]
        short = con.sql(f"SELECT count(*) FROM orders o WHERE o._cf_len__items <>"
                        f" (SELECT count(*) FROM {CHILD} c WHERE c._cf_parent_id = o._cf_id)").fetchall()[0][0]
        return orphans, short
    finally:
        con.close()
