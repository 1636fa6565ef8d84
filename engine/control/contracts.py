"""Standalone table contracts in an applied version, and the checks an applied job meets before its
execution opens (``surface.fire.standalone-snapshot``, ``applied-data-contract``,
``applied-current-authority``, ``applied-contract-missing``; docs/jobs.md, "What a job reads: the
applied version").

A *standalone table* of a version is a store table no ``[[pipeline]]`` of the version produces
that the version's jobs read or write, or that an ``[[external]]`` declares (a pipeline's tables
are pinned by its ``[[pipeline]]`` block, which the version holds). Import and a full apply capture
each one's contract from the store's table head (:func:`capture_contracts`): who writes it
(:func:`authority`), its columns with their Arrow types in order (absent while the table does not
exist), its primary key and ``order_by``. The version keeps them in its ``[snapshot]`` metadata
as ``tables``; a pipelines-only apply keeps what the version it builds on holds, an absence
included. :class:`AppliedContracts` reads them back.

Before an applied job's execution opens, :func:`check_applied` refuses it under validation when
its version holds no contract of a standalone table it uses (``AppliedContractMissing``: no live
declaration stands in), when a table it reads or writes has another writer now than its version
pinned (``AppliedAuthorityChanged``; "now" is the version the project's pointer names: an
unapplied edit of ``contextful.toml`` is no declaration), or when a model it reads publishes a
contract other than its version declares (``AppliedModelDisclosureChanged``). The store's
admission of a writer stays in force: a standalone table the job writes that the store now keys or
orders otherwise than the version captured refuses too (``TableDeclarationChanged``), and so does
whatever a fire credential does not reach.

The tables a job reads come from its declaration, a statement's relations from DuckDB's own parse
(``engine.jobs.pinned.statement_relations``; a statement that does not parse is ``QueryInvalid``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import (
    AppliedAuthorityChanged,
    AppliedContractMissing,
    AppliedModelDisclosureChanged,
    ManifestValueInvalid,
    TableDeclarationChanged,
)

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.jobs.context import JobContext
    from contextful.engine.model.spec import Contract
    from contextful.storage import Store


STORE = "store"
"""The authority of a table no declaration writes: only ``contextful table load`` writes it."""


@dataclass(frozen=True)
class TableContract:
    """One table's contract as a version pins it."""

    table: str
    authority: str
    """Who writes it: ``pipeline:<id>``, ``model:<name>``, ``external:<id>``, ``job:<name>`` or ``store``."""
    columns: tuple[tuple[str, str], ...] | None = None
    """Column names and Arrow type texts, in order (None: the table did not exist when captured, or a
    pipeline's table, whose columns its landings decide)."""
    primary_key: tuple[str, ...] = ()
    order_by: str | None = None

    def to_data(self) -> dict[str, Any]:
        """TOML-ready plain data (TOML has no null: an absent value is an absent key)."""
        data: dict[str, Any] = {"authority": self.authority, "primary_key": list(self.primary_key)}
        if self.columns is not None:
            data["columns"] = [[name, kind] for name, kind in self.columns]
        if self.order_by is not None:
            data["order_by"] = self.order_by
        return data

    @classmethod
    def from_data(cls, table: str, data: Mapping[str, Any]) -> TableContract:
        try:
            columns = data.get("columns")
            return cls(table, str(data["authority"]),
                       None if columns is None else tuple((str(n), str(k)) for n, k in columns),
                       tuple(str(c) for c in data.get("primary_key", ())), data.get("order_by"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestValueInvalid("[snapshot.tables]", table, f"is no table contract: {exc!r}") from exc


@dataclass(frozen=True)
class AppliedContracts:
    """The standalone table contracts a version holds."""

    version: int
    tables: Mapping[str, TableContract]

    @classmethod
    def from_data(cls, version: int, data: Mapping[str, Any]) -> AppliedContracts:
        """Read back what :func:`capture_contracts` captured for version ``version``."""
        return cls(version, {name: TableContract.from_data(name, value) for name, value in data.items()})

    @classmethod
    def of(cls, manifest: Manifest, job: JobSpec) -> AppliedContracts:
        """The contracts ``manifest.applied`` holds; ``AppliedContractMissing`` for ``job`` when its
        version holds none (claimed before contracts were captured, or a pipelines-only apply over one)."""
        applied = manifest.applied
        if applied is None:
            raise ValueError("a working manifest has no applied version: load one with load_version")
        if applied.tables is None:
            raise AppliedContractMissing(job.name, applied.version)
        return cls.from_data(applied.version, applied.tables)

    def table(self, name: str) -> TableContract | None:
        """``name``'s contract, names compared without case as DuckDB compares them."""
        return self.tables.get(name) or next((c for t, c in self.tables.items() if t.lower() == name.lower()), None)


def authority(manifest: Manifest, table: str) -> str:
    """Who writes ``table`` under ``manifest``'s declarations: the pipeline landing it, else the
    model building it, the ``[[external]]`` declaring it (``engine.jobs.pinned.declaration``), else
    the job writing it, else ``store``."""
    from contextful.engine.jobs.pinned import declaration

    declared = declaration(manifest, table)
    if declared is not None:
        kind = next(k for k in ("pipeline", "model", "external") if k in declared)
        return f"{kind}:{declared[kind]}"
    name = table.lower()
    return next((job.identity for job in manifest.jobs if name in {t.lower() for t in job_tables(job)[1]}), STORE)


def pipeline_of(manifest: Manifest, table: str) -> str | None:
    """The pipeline of ``manifest`` landing ``table``, a relational root's child tables included
    (None: no pipeline lands it)."""
    from contextful.engine.jobs.pinned import declaration

    declared = declaration(manifest, table)
    return None if declared is None else declared.get("pipeline")


def job_tables(job: JobSpec, manifest: Manifest | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The tables ``job`` reads and the tables it writes, as declared (a store-driven statement's
    relations by DuckDB's parse; a build's reads are its models' inputs, given ``manifest``)."""
    from contextful.engine.jobs.pinned import statement_relations

    if job.kind == "store-driven":
        return statement_relations(job), job.tables
    if job.kind == "synthesize":
        reads = tuple(dict.fromkeys(t for t in (job.source, *job.target, job.entities) if t))
        return reads, job.target
    if job.kind == "fold":
        return job.target, job.target
    if job.kind == "build" and manifest is not None:
        models = {m.name: m for m in manifest.models}
        reads = tuple(dict.fromkeys(t for name in job.target if name in models for t in models[name].referenced))
        return reads, job.target
    return (), ()


def standalone_tables(manifest: Manifest) -> list[str]:
    """The version's standalone tables: what its jobs read or write and its externals declare,
    less what its pipelines produce; sorted, each once whatever its case."""
    named = [t for job in manifest.jobs for side in job_tables(job, manifest) for t in side]
    named += [e.table for e in manifest.externals]
    found: dict[str, str] = {}
    for table in named:  # bounded by the declarations' table names
        if pipeline_of(manifest, table) is None:
            found.setdefault(table.lower(), table)
    return sorted(found.values())


def capture_contracts(manifest: Manifest, store: Store | None) -> dict[str, Any]:
    """The ``tables`` part of a version's ``[snapshot]`` metadata: each standalone table's contract
    from ``store``'s table head (None: no store yet, so no table exists), as TOML-ready data."""
    from contextful.storage.manifest import schema_from_text

    captured: dict[str, Any] = {}
    heads = {h.name.lower(): h for h in store.catalog.list_heads()} if store is not None else {}
    for table in standalone_tables(manifest):
        head = heads.get(table.lower())
        columns = None
        if head is not None:
            schema = schema_from_text(head.schema) if head.schema is not None else None
            columns = tuple((f.name, str(f.type)) for f in schema) if schema is not None else ()
        name = head.name if head is not None else table
        captured[name] = TableContract(name, authority(manifest, name), columns,
                                       head.primary_key if head is not None else (),
                                       head.order_by if head is not None else None).to_data()
    return captured


def capture_for_apply(manifest: Manifest, store: str | None = None) -> dict[str, Any]:
    """:func:`capture_contracts` over the store ``store`` (else the project's) as import and a full
    apply see it: opened only when it exists (reading never creates a store)."""
    from contextful.engine.model.inputs import store_exists
    from contextful.engine.project import open_store

    if not store_exists(manifest, store):
        return capture_contracts(manifest, None)
    with open_store(store or manifest.root) as opened:
        return capture_contracts(manifest, opened)


def applied_contract(ctx: JobContext, table: str) -> TableContract:
    """The contract ``ctx``'s version pins for ``table``, which its job reads or writes: a pipeline's
    table as that version's ``[[pipeline]]`` declares it, any other as the version captured it. A
    store-driven job lands its output under it; the working ``contextful.toml`` never enters."""
    reads, writes = job_tables(ctx.job, ctx.manifest)
    if table.lower() not in {t.lower() for t in reads + writes}:
        raise ManifestValueInvalid(f"[[job]] {ctx.job.name!r}", "tables", f"neither reads nor writes {table!r}")
    pipeline = pipeline_of(ctx.manifest, table)
    if pipeline is not None:
        spec = ctx.manifest.pipeline(pipeline)
        return TableContract(table, f"pipeline:{pipeline}", None, spec.primary_key, spec.order_by)
    contract = AppliedContracts.of(ctx.manifest, ctx.job).table(table)
    if contract is None:
        raise AppliedContractMissing(ctx.job.name, ctx.version, (table,))
    return contract


def check_applied(manifest: Manifest, store: Store, job: JobSpec, *, live: Manifest | None = None) -> None:
    """Refuse, before ``job``'s execution opens, what its applied version ``manifest`` no longer
    answers for (module docstring). ``live`` is the version in force now (None: the one the
    project's pointer names)."""
    contracts = AppliedContracts.of(manifest, job)
    reads, writes = job_tables(job, manifest)
    used = list(dict.fromkeys(reads + writes))
    pinned: dict[str, str] = {}
    for table in used:  # bounded by the job's declared tables
        pipeline, contract = pipeline_of(manifest, table), contracts.table(table)
        if pipeline is not None:
            pinned[table] = f"pipeline:{pipeline}"
        elif contract is not None:
            pinned[table] = contract.authority
    if missing := tuple(t for t in used if t not in pinned):
        raise AppliedContractMissing(job.name, contracts.version, missing)
    live = live if live is not None else _live(manifest)
    for table, writer in pinned.items():
        if (current := authority(live, table)) != writer:
            raise AppliedAuthorityChanged(job.name, contracts.version, table, writer, current)
    _check_models(manifest, store, job, contracts.version, reads)
    _check_heads(store, job, contracts, writes)


def _check_heads(store: Store, job: JobSpec, contracts: AppliedContracts, writes: tuple[str, ...]) -> None:
    """The store admits a writer on its own terms: a standalone table the job writes that the store
    now keys or orders otherwise than the version captured refuses (``TableDeclarationChanged``)
    rather than land rows under a mix of the two. A table the version captured as not existing, or
    the store no longer holds, has no key pinned to compare."""
    from contextful.engine.land.declaration import COMPARED

    for table in writes:  # bounded by the job's declared tables
        contract = contracts.table(table)
        head = store.catalog.load_head(contract.table) if contract is not None else None
        if contract is None or contract.columns is None or head is None:
            continue  # not captured (a pipeline's table, or none existed then): nothing pinned to compare
        for c in COMPARED:
            if c.setting not in ("primary_key", "order_by"):
                continue
            stored = c.stored(head, lambda: None)
            declared = contract.primary_key if c.setting == "primary_key" else contract.order_by
            if stored is not None and stored != declared:
                raise TableDeclarationChanged(
                    head.name, None, c.setting, c.spelled(stored), c.spelled(declared),
                    f"apply the project again (a full `contextful pipeline apply` captures the table as the store "
                    f"holds it), or give the table back its {c.setting}",
                    declared_in=f"job {job.name!r}'s applied version {contracts.version}")


def _live(manifest: Manifest) -> Manifest:
    """The version the project's pointer names now, as serve arms it (``manifest`` itself when it
    is that version, or when none is applied)."""
    from contextful.engine.control.apply import snapshot_dir
    from contextful.engine.control.arming import load_armable

    current = snapshot_dir(manifest.root).applied()
    applied = manifest.applied
    if current is None or (applied is not None and applied.version == current):
        return manifest
    return load_armable(manifest.root, current)[0]


def _check_models(manifest: Manifest, store: Store, job: JobSpec, version: int, reads: tuple[str, ...]) -> None:
    """Each model ``job`` reads discloses, in its published build, the contract its version declares
    (a model never published discloses nothing yet: its readers find no table)."""
    from contextful.engine.model.build import published_build
    from contextful.engine.model.spec import Contract

    for spec in manifest.models:  # bounded by the version's models
        if spec.name.lower() not in {t.lower() for t in reads}:
            continue
        published = published_build(store, spec.name)
        if published is None:
            continue
        recorded = published[1].meta.get("contract")
        current = Contract.from_json(recorded) if recorded else None
        if _disclosed(current) != _disclosed(spec.contract):
            raise AppliedModelDisclosureChanged(job.name, version, spec.name, _disclosed(spec.contract),
                                                _disclosed(current))


def _disclosed(contract: Contract | None) -> str:
    """A model contract as the refusal names it: version, grain and typed columns."""
    if contract is None:
        return "no contract"
    columns = ", ".join(f"{name} {c.type}{'' if c.nullable else ' not null'}" for name, c in contract.columns.items())
    return f"contract {contract.version} (grain {', '.join(contract.grain) or 'none'}; columns {columns})"
