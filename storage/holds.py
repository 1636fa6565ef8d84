"""Build holds (``run.publish.hold``): a HoldRecord at ``tables/<model>/holds/<build id>.json``.

A model build's id is the ``commit_seq`` its publishing commit reached on the model's table
(``run.model.build-id``), so a hold names one commit. Writing a hold replaces any earlier hold on
that build (one PUT of the whole record). Collection keeps every part a held build added; a hold
confers no other authority (it neither blocks new builds nor changes what any snapshot answers).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from contextful.storage.clock import from_us
from contextful.storage.errors import SnapshotNotFound
from contextful.storage.manifest import table_prefix

if TYPE_CHECKING:
    from contextful.storage.store import Store


@dataclass(frozen=True)
class HoldRecord:
    model: str
    build_id: int
    reason: str
    created_at: str
    """ISO-8601 UTC instant the hold was written (the store's clock)."""

    def dumps(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")


def hold_key(model: str, build_id: int) -> str:
    return f"{table_prefix(model)}/holds/{build_id}.json"


def hold_build(store: Store, model: str, build_id: int, reason: str = "") -> HoldRecord:
    """Hold ``build_id`` of ``model`` (a commit_seq of its table), replacing an earlier hold on it."""
    table = store.table(model)
    if not any(c.commit_seq == build_id and c.manifest for c in table.commits()):
        raise SnapshotNotFound(model, f"at build {build_id} (no commit published it)")
    record = HoldRecord(model, int(build_id), reason, from_us(store.clock.now_us()).isoformat())
    store.objects.put_bytes(hold_key(model, build_id), record.dumps(), durable=store.durable)
    return record


def release_hold(store: Store, model: str, build_id: int) -> bool:
    """Remove the hold on ``build_id``; whether there was one."""
    key = hold_key(model, build_id)
    if not store.objects.exists(key):
        return False
    store.objects.delete([key])
    return True


def holds(store: Store, model: str) -> list[HoldRecord]:
    """Every hold on ``model``'s builds, oldest build first."""
    found = []
    for obj in store.objects.list(f"{table_prefix(model)}/holds"):
        if obj.key.endswith(".json"):
            found.append(HoldRecord(**json.loads(store.objects.get_bytes(obj.key))))
    return sorted(found, key=lambda h: h.build_id)
