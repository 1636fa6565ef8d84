"""Build status and staleness (decision "build-stale-landings"): a build is stale by the landings
it has not read.

With ``cutoff = t - max_lag`` (``policy.max_lag``, default 0), a published model is stale at ``t``
when an input holds a committed run above the build's watermark for it (``through``) that
committed before the cutoff (``run.publish.staleness``), or when the runs at or below ``through``
differ in count or digest from those the build recorded (``run.publish.staleness-omitted-check``:
the input was dropped and made again under its name, so its commit sequence means other runs). An input that is a model also waits on
each of its published builds newer than the watermark, aged by that build's ``created_at`` (its
run manifest's creation time; ``run.publish.staleness-model-input``); a build whose manifest is
gone counts as older than the cutoff.

A build is stale too when the model's definition changed since it published — its statement (the
SQL text's digest), its contract, or the inputs it reads (declared, detected, or a
``relationships`` test's table): the build answers a definition the manifest no longer holds, so
status names what changed (``changed``, and ``why``: ``"sql changed"``) and ``build`` rebuilds it.
A rebuild over the current frontier and definition always clears staleness: its watermark is
every input's head, and its meta the definition it built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contextful.engine.model.build import definition, published_build

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.model.spec import ModelSpec
    from contextful.storage import Store


@dataclass(frozen=True)
class ModelStatus:
    model: str
    build_id: int | None
    """The published build (None before the first)."""
    watermark: dict[str, int] = field(default_factory=dict)
    stale_inputs: list[str] = field(default_factory=list)
    """Inputs holding a run the build has not read that is older than ``max_lag``."""
    changed: list[str] = field(default_factory=list)
    """What of the definition differs from the published build's: ``sql``, ``contract``, ``inputs``."""

    @property
    def stale(self) -> bool:
        return bool(self.stale_inputs or self.changed)

    @property
    def why(self) -> list[str]:
        """Each reason the build is stale, in words."""
        return ([f"{part} changed" for part in self.changed]
                + [f"input {name} has runs the build has not read" for name in self.stale_inputs])

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "build_id": self.build_id, "watermark": self.watermark,
                "stale": self.stale, "stale_inputs": self.stale_inputs, "changed": self.changed, "why": self.why}


def build_status(store: Store, manifest: Manifest, now_us: int | None = None) -> list[ModelStatus]:
    """Every declared model's published build, watermark, stale inputs at ``now_us`` (default: the
    store's clock) and changed definition."""
    now = store.clock.now_us() if now_us is None else now_us
    models = {m.name for m in manifest.models}
    known = set(store.table_names()) | models
    return [_status(store, spec, models, known, now) for spec in manifest.models]


def _status(store: Store, spec: ModelSpec, models: set[str], known: set[str], now: int) -> ModelStatus:
    found = published_build(store, spec.name)
    if found is None:
        return ModelStatus(spec.name, None)
    meta = found[1].meta
    watermark: dict[str, int] = meta.get("watermark", {})
    chains: dict[str, dict[str, Any]] = meta.get("chain", {})
    cutoff = now - int((spec.policy.max_lag_seconds or 0) * 1_000_000)
    stale = [name for name, through in watermark.items()
             if _omitted_changed(store, name, through, chains.get(name))
             or _waits(store, name, through, cutoff, name in models)]
    recorded = {**meta, "inputs": sorted(meta.get("inputs", []))}  # earlier builds kept them in read order
    changed = [part for part, value in definition(spec, known).items() if recorded.get(part) != value]
    return ModelStatus(spec.name, found[0], watermark, stale, [_PARTS[part] for part in changed])


_PARTS = {"sql_digest": "sql", "contract": "contract", "inputs": "inputs"}
"""The meta entries that define a build's answer, by the name status gives them."""


def _omitted_changed(store: Store, name: str, through: int, recorded: dict[str, Any] | None) -> bool:
    """``run.publish.staleness-omitted-check``: the runs at or below ``through`` differ in count or
    digest from what the build recorded (the input was replaced under its name, or its history
    was rewritten): it holds a waiting run counted as committed before the cutoff."""
    if recorded is None or name not in store.table_names(include_reserved=True):
        return recorded is not None  # the input is gone: what the build read cannot be current
    from contextful.engine.model.build import chain_record

    return chain_record(store, name, through) != recorded


def _waits(store: Store, name: str, through: int, cutoff: int, is_model: bool) -> bool:
    if name not in store.table_names(include_reserved=True):
        return False
    table = store.table(name)
    newer = [c for c in table.commits() if c.commit_seq > through]  # the commits since the build: bounded
    if any(c.committed_us < cutoff for c in newer):
        return True
    if not is_model:
        return False
    for commit in newer:
        if not commit.manifest:
            continue
        try:
            manifest = table.manifest(commit.run_id)
        except FileNotFoundError:  # its manifest was collected: counts as older than the cutoff
            return True
        if manifest.meta.get("model") == name and manifest.created_us < cutoff:
            return True
    return False
