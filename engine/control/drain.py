"""The cadence holder's drain: queued batches reach their read between fires.

Implements the drain of ``surface.fire.cycle-drain``, ``cycle-drain-exit``, ``daemon-drain`` and
``daemon-drain-retry``: the process holding the cadence lease lands what the project's receive
queues still hold (members spooled by receivers that died or are waiting: ``engine.land.receive``),
each pipeline's queue under its land lock, so one drainer runs at a time. A pipeline whose drain
raises (its store unreachable, a lock it cannot take) keeps its members queued for the next pass
and the others still drain; a member that cannot land even alone is settled failed by the landing
itself and named. Object-arrival keys join this drain with the object-arrival source that makes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage import Store


@dataclass
class DrainResult:
    """What one drain settled, and what it could not."""

    settled: int = 0
    """Queued batches landed (or found landed already) by this drain."""
    failures: list[str] = field(default_factory=list)
    """One line per queue whose drain failed (its members stay queued) or member that cannot land."""

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"settled": self.settled, "failed": len(self.failures), "failures": self.failures}


def drain_queues(store: Store, manifest: Manifest) -> DrainResult:
    """Drain every receive pipeline's queue of ``manifest`` once."""
    from contextful.engine.land.receive.group import drain_queue
    from contextful.storage.errors import ContextfulError

    result = DrainResult()
    for spec in manifest.pipelines:
        if spec.source.kind != "receive":
            continue
        try:
            landed = drain_queue(store, manifest, spec)
        except ContextfulError as exc:
            result.failures.append(f"{spec.id}: {exc}")
            continue
        except OSError as exc:
            result.failures.append(f"{spec.id}: {type(exc).__name__}: {exc}")
            continue
        result.settled += len(landed.inputs_landed) + landed.inputs_skipped
        result.failures += [f"{spec.id}: {f.input}: {f.error}: {f.detail}" for f in landed.failures]
    return result
