"""Coordinated publications (decision "coordinated-exports-activate", docs/exports.md "Coordinated
publications"): what a publication's producers completed, and the port their records persist behind.

Implements the record half of ``run.export.group-source``: a successful store-driven job or
materialized model build records ONE immutable :class:`Completion` binding its run identifier, its
pinned input frontier and every output table's frontier, an empty output included
(``engine.export.publications.completion`` computes it where the fire commits its outcome).

The port is :class:`CompletionStore`; each adapter is a module beside this one (``sqlite``: the
local profile's catalog database, beside its other ``cf_`` tables), picked by :func:`open_completions`
from the store's catalog (the D1 profile's is ``d1``, decision "d1-coordinated-groups"). A profile with
no adapter answers None: its producers record nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from contextful.storage.store import Store


@dataclass(frozen=True)
class OutputFrontier:
    """One output table as a producer's run left it."""

    table: str
    """The output table (a store-driven job's table, a build's model)."""
    commit_seq: int | None
    """Its head commit (a model: the build id it published); None: the output is empty, no commit yet."""


@dataclass(frozen=True)
class Completion:
    """One producer run's completion: immutable once recorded."""

    producer: str
    """The ``[[job]]`` that ran."""
    kind: str
    """``store-driven`` or ``build``."""
    run_id: str
    """The run identifier: the fire's execution id."""
    input_frontier: dict[str, Any]
    """What the run read, pinned: a store-driven job's ``as_of_us`` and each relation's commit, a
    build's watermark per model."""
    outputs: tuple[OutputFrontier, ...]
    """Every output's frontier, in declaration order, empty outputs included."""
    recorded_us: int
    """When it was recorded (the store's clock)."""

    def to_json(self) -> dict[str, Any]:
        return {"producer": self.producer, "kind": self.kind, "run_id": self.run_id,
                "input_frontier": self.input_frontier,
                "outputs": [{"table": o.table, "commit_seq": o.commit_seq} for o in self.outputs],
                "recorded_us": self.recorded_us}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Completion:
        return cls(doc["producer"], doc["kind"], doc["run_id"], doc["input_frontier"],
                   tuple(OutputFrontier(o["table"], o["commit_seq"]) for o in doc["outputs"]), doc["recorded_us"])

    def body(self) -> str:
        """The canonical JSON an adapter stores (and compares a second record of the same run against)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


class CompletionStore(Protocol):
    """Where producer completions persist."""

    def record(self, completion: Completion) -> Completion:
        """Record ``completion`` once; the same run recorded again keeps the first record and returns it."""

    def latest(self, producer: str) -> Completion | None:
        """The producer's newest completion (None before its first)."""

    def of_run(self, run_id: str) -> Completion | None:
        """The completion a run recorded (None: it recorded none)."""


def open_completions(store: Store) -> CompletionStore | None:
    """The store's completion adapter, by its catalog's profile (None: the profile keeps none)."""
    from contextful.storage.catalog.sqlite import SqliteCatalog

    if isinstance(store.catalog, SqliteCatalog) and store.container is None:
        from contextful.engine.export.publications.sqlite import SqliteCompletions

        return SqliteCompletions(store.catalog.path)
    from contextful.storage.d1.catalog import D1Catalog

    if isinstance(store.catalog, D1Catalog):
        from contextful.engine.export.publications.d1 import D1Completions

        return D1Completions(store.catalog.client)
    return None
