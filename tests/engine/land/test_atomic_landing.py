"""A relational landing publishes its root and child tables at one point, and readers pin every
table they read at one point: no reader ever sees child rows without their root rows, or root
rows without their children.

On SQLite and on the real PostgreSQL. Readers run while a landing commits, at moments the test
chooses: whenever the committing store asks its clock the time (the old commit path asked it
between the child and the root commits), and between a reader's own catalog reads (a hooked
catalog, ``tests.storage.hooked_catalog``). Failures between the commits are in
``tests/storage/test_commit_outcome.py``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import contextful.engine.read
import pytest
from contextful.engine.config.manifest import SourceSpec
from contextful.engine.config.parse import parse_manifest
from contextful.engine.land.receive.config import ReceiveConfig
from contextful.engine.land.receive.group import drain
from contextful.engine.land.receive.spool import Queue, key_digest
from contextful.engine.land.sink import prepare_batch
from contextful.engine.model.build import build_models
from contextful.storage import ManualClock, Store

from tests.storage.catalog_place import CatalogPlace
from tests.storage.hooked_catalog import Hooks
from tests.support.relational_landing import CHILD, ITEMS_PER_ORDER, ORDERS, land_orders, orders, torn


@pytest.fixture
def opened(place: CatalogPlace) -> Iterator[Callable[..., Store]]:
    stores: list[Store] = []

    def open_store(clock: ManualClock | None = None, hooks: Hooks | None = None) -> Store:
        stores.append(place.store(clock or ManualClock(), hooks))
        return stores[-1]

    yield open_store
    for store in stores:
        store.close()


class WatchedClock(ManualClock):
    """A manual clock that calls ``watch`` each time it is asked the time."""

    watch: Callable[[], None] | None = None

    def now_us(self) -> int:
        if self.watch is not None:
            self.watch()
        return super().now_us()


def test_a_reader_during_a_relational_landing_never_sees_children_without_their_root(
        opened: Callable[..., Store]) -> None:
    clock = WatchedClock()
    writer = opened(clock)
    reader = opened()
    seen: list[tuple[int, int]] = []
    clock.watch = lambda: seen.append(torn(reader))
    land_orders(writer, [1, 2])
    land_orders(writer, [3])
    clock.watch = None
    assert seen and set(seen) == {(0, 0)}
    assert torn(reader) == (0, 0)
    assert reader.table(CHILD).count() == 3 * ITEMS_PER_ORDER


def test_a_reader_during_a_relational_receive_group_never_sees_children_without_their_root(
        opened: Callable[..., Store], tmp_path: Path) -> None:
    spec = replace(ORDERS, source=SourceSpec("receive", {"key_retention_secs": 60}))
    clock = WatchedClock()
    writer = opened(clock)
    reader = opened()
    queue = Queue(tmp_path / "queue", spec.id)
    seen: list[tuple[int, int]] = []
    try:
        for key, ids in (("k1", [1, 2]), ("k2", [3])):  # spooled by receivers; one group lands both
            digest = key_digest(spec.id, key)
            queue.index.touch(digest, key, clock.now_us())
            tables, _ = prepare_batch(spec, orders(ids), digest, types=None, guard=False)
            queue.spool(key, digest, tables, received_us=clock.now_us(), body_bytes=0, body_sha256="")
        clock.watch = lambda: seen.append(torn(reader))
        [landing] = drain(writer, spec, queue, ReceiveConfig(60.0), clock=clock)
        clock.watch = None
    finally:
        queue.close()
    assert {c.table for c in landing.commits} == {"orders", CHILD}
    assert seen and set(seen) == {(0, 0)}
    assert torn(reader) == (0, 0)
    assert reader.table(CHILD).count() == 3 * ITEMS_PER_ORDER


def once_between_reads(tables: set[str], act: Callable[[], None]) -> Callable[[str, Sequence[Any]], None]:
    """A read hook calling ``act`` once, after the first read of one of ``tables``' live parts."""
    done: list[bool] = []

    def hook(statement: str, params: Sequence[Any]) -> None:
        if not done and "FROM cf_parts" in statement and params and params[0] in tables:
            done.append(True)
            act()

    return hook


def test_a_model_pins_every_input_at_one_point(opened: Callable[..., Store], tmp_path: Path) -> None:
    writer = opened()
    land_orders(writer, [1])
    hooks = Hooks()
    builder = opened(hooks=hooks)
    # the SQL names the child table first: inputs were pinned one at a time, in this order
    text = ('[project]\nname = "m"\n[[model]]\nname = "counts"\n'
            f'sql = "SELECT (SELECT count(*) FROM {CHILD}) AS items, (SELECT count(*) FROM orders) AS orders"\n')
    manifest = parse_manifest(tomllib.loads(text), tmp_path)
    hooks.after_read = once_between_reads({"orders", CHILD}, lambda: land_orders(writer, [2]))
    build_models(builder, manifest)
    hooks.after_read = None
    [row] = builder.table("counts").to_arrow().to_pylist()
    assert row["items"] == row["orders"] * ITEMS_PER_ORDER, row
    assert row["orders"] == 1  # the landing came after the inputs were pinned


def test_a_notebook_connection_pins_every_table_at_one_point(opened: Callable[..., Store]) -> None:
    writer = opened()
    land_orders(writer, [1])
    hooks = Hooks()
    reader = opened(hooks=hooks)
    hooks.after_read = once_between_reads({"orders", CHILD}, lambda: land_orders(writer, [2]))
    con = contextful.engine.read.connect(reader)
    hooks.after_read = None
    try:
        orders = con.sql("SELECT count(*) FROM orders").fetchall()[0][0]
        items = con.sql(f"SELECT count(*) FROM {CHILD}").fetchall()[0][0]
    finally:
        con.close()
    assert (orders, items) == (1, ITEMS_PER_ORDER)
