"""Catalogs that call a test's hook at chosen moments: interleaving injection around real adapters.

The catalogs are the real :class:`SqliteCatalog` and :class:`PostgresCatalog`; a test only learns
when something happens and may act then (land a run from another store, set an event):

- ``after_read(statement, params)``: after each read statement returned its rows (outside the
  catalog's lock, so the hook may use other stores freely);
- ``before_write()``: when a write transaction begins, before it takes any lock (what follows in
  that transaction waits for locks another connection holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contextful.storage.catalog.postgres import PostgresCatalog
from contextful.storage.catalog.sqlite import SqliteCatalog


@dataclass
class Hooks:
    after_read: Callable[[str, Sequence[Any]], None] | None = None
    before_write: Callable[[], None] | None = None


class _Hooked:
    hooks: Hooks

    def _query_rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = super()._query_rows(statement, params)  # type: ignore[misc]
        if self.hooks.after_read is not None:
            self.hooks.after_read(statement, params)
        return rows

    def _begin_write(self, cur: Any, durable: bool) -> None:
        if self.hooks.before_write is not None:
            self.hooks.before_write()
        super()._begin_write(cur, durable)  # type: ignore[misc]


class HookedSqliteCatalog(_Hooked, SqliteCatalog):
    def __init__(self, path: str, hooks: Hooks) -> None:
        self.hooks = hooks
        super().__init__(path)


class HookedPostgresCatalog(_Hooked, PostgresCatalog):
    def __init__(self, dsn: str, schema: str, hooks: Hooks) -> None:
        self.hooks = hooks
        super().__init__(dsn, schema)
