"""The manifest's shapes: what a ``contextful.toml`` declares, after validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.config.residency import ResidencySpec
from contextful.engine.project import Project

if TYPE_CHECKING:
    from contextful.engine.config.applied import AppliedSnapshot
    from contextful.engine.config.delegates import DelegateBinding
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.publications import PublicationSpec
    from contextful.engine.config.sync import SyncSpec
    from contextful.engine.export.spec import ExportSpec
    from contextful.engine.land.seed import SeedSpec
    from contextful.engine.model.spec import ModelSpec
    from contextful.engine.run.plan import CompiledPlan

NORMALIZE_MODES = ("nested", "relational")
SOURCE_KINDS = ("files", "http", "receive", "derive")


@dataclass(frozen=True)
class SourceSpec:
    kind: str
    """Source kind: ``files``, ``http``, ``receive`` or ``derive`` (docs/derive.md)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Kind-specific settings (``[pipeline.source.config]``), validated by the source."""


@dataclass(frozen=True)
class PipelineSpec:
    id: str
    """Unique pipeline id; names the run scope and the cursor."""
    source: SourceSpec
    """Where rows come from."""
    table: str
    """Destination table (default: the pipeline id)."""
    normalize: str = "nested"
    """``nested`` lands records as they arrive; ``relational`` projects lists into child tables."""
    incremental: str | None = None
    """Field whose value orders rows for incremental pulls (a cursor bound to that field)."""
    primary_key: tuple[str, ...] = ()
    """Key columns: the table answers the latest row per key."""
    order_by: str | None = None
    """Column ordering rows within a key (default: ingest order)."""
    write_disposition: str | None = None
    """How a run's rows meet the table's (``engine.land.disposition``): ``append``, ``merge`` by
    primary key, or ``replace`` (each run's rows become the table); None: :attr:`disposition`'s default."""
    types: dict[str, str] = field(default_factory=dict)
    """Column -> type spelling the landing casts to (docs/manifest.md lists the spellings)."""
    schedule: str | None = None
    """``every <n><unit>`` or a five-field UTC cron expression (used by the control plane)."""
    after: tuple[str, ...] = ()
    """Pipelines that run before this one."""
    priority: int = 0
    """Higher runs first among pipelines ready at once."""
    seed: SeedSpec | None = None
    """A one-time historical load landed before the live source's first pull (``[pipeline.seed]``)."""
    transform: tuple[dict[str, Any], ...] = ()
    """The compiled transform chain (``[[pipeline.transform]]``, ``engine.run.transform``) each batch runs through."""
    derive_parents: tuple[str, ...] = ()
    """A derive pipeline: the pipelines landing the tables it reads; it runs after them, on their run
    (``engine.derive.chain``)."""

    @property
    def disposition(self) -> str:
        """The write disposition in force: the declared one, else ``merge`` when keyed, else ``append``."""
        return self.write_disposition or ("merge" if self.primary_key else "append")

    @property
    def follows(self) -> tuple[str, ...]:
        """Every pipeline this one runs after: its ``after`` and its derive parents."""
        return self.after + tuple(p for p in self.derive_parents if p not in self.after)


DEFAULT_POOL = 4
DEFAULT_TRIGGER = "in-process"
DEFAULT_POLL = "every 30s"


@dataclass(frozen=True)
class ControlSpec:
    """The ``[control]`` block: this node's own control plane (docs/control.md)."""

    snapshot_dir: str | None = None
    """The directory of applied versions (``engine.control.snapshots``), resolved against the project
    root; :func:`parse_manifest` always fills it (default ``<root>/.contextful/control/<project>/``)."""
    pool: int = DEFAULT_POOL
    """How many units serve dispatches at once (a positive integer)."""
    trigger: str = DEFAULT_TRIGGER
    """The trigger adapter serve fires through; an unknown one is refused when serve starts."""
    url: str | None = None
    """The control URL this node reads its applied versions from (``[control] url``, beside no
    ``snapshot_dir``): the reconciler's source (docs/control.md, "The control source")."""
    source: str | None = None
    """The control source the block names, as written: its ``url``, else its ``snapshot_dir`` (None:
    neither; the default snapshot directory is no configured source). ``serve --cycle`` refuses one
    that does not resolve (``engine.control.source``)."""
    poll: str = DEFAULT_POLL
    """How often serve reads its control URL (a schedule string, ``surface.reconcile.poll-cadence``;
    ``engine.control.reconcile``)."""
    workers: tuple[str, ...] = ()
    """The worker URLs landing steps are submitted to (``[control] workers``, ``engine.control.relay``)."""
    relay: str | None = None
    """The URL whose ``/awake/<token>`` route receives workers' heartbeats and callbacks (``[control] relay``)."""
    delegates: tuple[DelegateBinding, ...] = ()
    """``[control.delegates.<name>]``: the delegates store-driven bodies call (``engine.config.delegates``)."""

    def delegate(self, name: str) -> DelegateBinding | None:
        """The binding ``[control.delegates.<name>]`` declares (None: none)."""
        return next((binding for binding in self.delegates if binding.name == name), None)


@dataclass(frozen=True)
class ExternalSpec:
    """An ``[[external]]`` block: a table a process outside Contextful writes into the store."""

    id: str
    """Unique id among the externals (the syntax of a pipeline id)."""
    table: str
    """The table it writes (default: the id); no pipeline or model may produce it."""
    description: str | None = None
    """What writes it, in words (for status and the console)."""


@dataclass(frozen=True)
class Manifest:
    root: Path
    """The project directory."""
    project: Project
    pipelines: tuple[PipelineSpec, ...] = ()
    models: tuple[ModelSpec, ...] = ()
    """The ``[[model]]`` blocks (docs/models.md)."""
    exports: tuple[ExportSpec, ...] = ()
    """The ``[[export]]`` blocks (docs/exports.md)."""
    plan: CompiledPlan | None = None
    """The compiled plan (``engine.run.plan``); every manifest :func:`load_manifest` reads has one."""
    control: ControlSpec = field(default_factory=ControlSpec)
    """The ``[control]`` block (docs/control.md)."""
    externals: tuple[ExternalSpec, ...] = ()
    """The ``[[external]]`` blocks: tables written from outside Contextful (docs/manifest.md)."""
    jobs: tuple[JobSpec, ...] = ()
    """The ``[[job]]`` blocks (``engine.config.jobs``; docs/jobs.md)."""
    applied: AppliedSnapshot | None = None
    """The metadata of the applied version this manifest was read from (``engine.config.applied``);
    None for the working ``contextful.toml``."""
    residency: ResidencySpec = field(default_factory=ResidencySpec)
    """The ``[residency]`` block: the regions this site may reside in (``engine.config.residency``)."""
    sync: SyncSpec | None = None
    """The ``[sync]`` block (``engine.config.sync``; docs/control.md "Synced control"); None: the project
    does not sync its control."""
    publications: tuple[PublicationSpec, ...] = ()
    """The ``[[publication]]`` blocks (``engine.config.publications``; docs/exports.md "Coordinated publications")."""

    def export(self, name: str) -> ExportSpec:
        for spec in self.exports:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def pipeline(self, pipeline_id: str) -> PipelineSpec:
        for spec in self.pipelines:
            if spec.id == pipeline_id:
                return spec
        raise KeyError(pipeline_id)

    def model(self, name: str) -> ModelSpec:
        for spec in self.models:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def models_in_order(self, names: list[str] | None = None) -> list[ModelSpec]:
        """The named models (default: all), each after the models it reads."""
        by_name = {m.name: m for m in self.models}
        done: list[ModelSpec] = []

        def visit(name: str) -> None:  # bounded by the model count; validation rejected cycles
            if name not in by_name or by_name[name] in done:
                return
            for dep in by_name[name].input_names(set(by_name)):
                visit(dep)
            done.append(by_name[name])

        for name in sorted(by_name):
            visit(name)
        return [m for m in done if names is None or m.name in names]

    def in_dependency_order(self, ids: list[str] | None = None) -> list[PipelineSpec]:
        """The named pipelines (default: all) with each after the pipelines it follows (``after``
        and derive parents); ties by priority (higher first), then id. Naming a pipeline brings its
        derive descendants: they run on its run (``run.select.derive-order``)."""
        wanted = set(ids) if ids else {p.id for p in self.pipelines}
        grew = True
        while grew:  # bounded by the pipeline count
            more = {p.id for p in self.pipelines if wanted.intersection(p.derive_parents)} - wanted
            wanted |= more
            grew = bool(more)
        by_id = {p.id: p for p in self.pipelines}
        done: list[PipelineSpec] = []
        placed: set[str] = set()
        pending = sorted((by_id[i] for i in wanted), key=lambda p: (-p.priority, p.id))
        while pending:  # bounded by the pipeline count; validation rejected cycles
            for spec in pending:
                if all(dep in placed or dep not in wanted for dep in spec.follows):
                    done.append(spec)
                    placed.add(spec.id)
                    pending.remove(spec)
                    break
        return done
