"""Two writers creating one table at once, on SQLite and on the real PostgreSQL.

The interleaving is injected, not waited for: the second writer's catalog calls a hook after its
reads, and the first writer creates the table right after the second one found it absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from contextful.storage import ManualClock

from tests.storage.catalog_place import CatalogPlace
from tests.storage.hooked_catalog import Hooks


def _rows(n: int) -> pa.Table:
    return pa.table({"i": pa.array(range(n), pa.int64())})


def test_a_table_created_by_another_writer_meanwhile_is_joined_not_called_a_case_twin(place: CatalogPlace) -> None:
    first = place.store(ManualClock())
    hooks = Hooks()
    second = place.store(ManualClock(), hooks)
    fired: list[str] = []

    def create_after_the_absent_head(statement: str, params: Sequence[Any]) -> None:
        if not fired and "events" in params:  # the second writer just read 'events' as absent
            fired.append(statement)
            first.append("events", _rows(2))

    try:
        hooks.after_read = create_after_the_absent_head
        result = second.append("events", _rows(3))
        hooks.after_read = None
        assert fired, "the interleaving was never injected"
        assert result.commit_seq == 2
        assert second.table("events").to_arrow().num_rows == 5
        assert [h.name for h in second.catalog.list_heads() if not h.name.startswith("_")] == ["events"]
    finally:
        first.close()
        second.close()

