"""Which publications a serve unit writes the inputs of, computed from the applied manifest.

Implements the reading half of ``surface.dispatch.export-quiesced`` and ``export-claim-unread``
(seed-control-plane "dispatch"): a unit (a pipeline's head with its landing steps and derive tiers
and the builds riding it, or a job entry) writes a publication's inputs when it writes

- a member of the publication (a producer job's output: a store-driven job's table, a build's model),
  or
- a relation a producer of it reads: a store-driven producer's statement relations (DuckDB's parse,
  ``engine.jobs.pinned.statement_relations``), a build producer's models' inputs, through the models
  they read in turn down to the tables beneath them.

What a unit writes: a pipeline its table (a relational root's child tables ``<table>__*`` too, a
derive pipeline its declared ``tables``); a store-driven job its tables; a build its target models;
a fold or synthesize job its target.

A unit whose inputs cannot be computed (a producer's statement relations or a job's tables unreadable
from the applied version) claims every declared publication (``export-claim-unread``):
:attr:`UnitInputs.unreadable` says why, so serve logs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.storage.errors import ContextfulError

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.config.publications import PublicationSpec

JOB_PREFIX = "job:"


@dataclass(frozen=True)
class UnitInputs:
    """The publications one unit claims."""

    publications: tuple[str, ...]
    """The publications whose inputs the unit writes (every declared one when ``unreadable``)."""
    unreadable: str | None = None
    """Why the unit's publication inputs could not be computed (None: they were)."""


def _lower(names: Iterable[str]) -> frozenset[str]:
    return frozenset(n.lower() for n in names)


def _job_writes(job: JobSpec) -> frozenset[str]:
    if job.kind == "store-driven":
        return _lower(job.tables)
    return _lower(job.target)


def _build_reads(manifest: Manifest, job: JobSpec) -> frozenset[str]:
    """A build's models' inputs, through the models they read down to the tables beneath them."""
    models = {m.name.lower(): m for m in manifest.models}
    seen: set[str] = set()
    stack = [t.lower() for t in job.target]
    while stack:
        name = stack.pop()
        model = models.get(name)
        if model is None:
            continue
        for read in (model.inputs if model.inputs is not None else model.referenced):
            if read.lower() not in seen:
                seen.add(read.lower())
                stack.append(read.lower())
    return frozenset(seen)


def _producer_reads(manifest: Manifest, job: JobSpec) -> frozenset[str]:
    from contextful.engine.jobs.pinned import statement_relations

    if job.kind == "store-driven":
        return _lower(statement_relations(job))  # QueryInvalid when it cannot be read
    if job.kind == "build":
        return _build_reads(manifest, job)
    return frozenset()


def publication_relations(manifest: Manifest, spec: PublicationSpec) -> frozenset[str]:
    """What ``spec``'s inputs are: its members and every relation its producers read (lower-cased)."""
    jobs = {job.name: job for job in manifest.jobs}
    found = set(_lower(m.name for m in spec.members))
    for producer in spec.producers:
        job = jobs.get(producer)
        if job is None:
            raise _Unreadable(f"publication {spec.name!r}: its producer [[job]] {producer!r} is not in the "
                              "applied version")
        found |= _producer_reads(manifest, job)
    return frozenset(found)


class _Unreadable(Exception):
    """A unit's publication inputs cannot be computed (why)."""


def _writes(manifest: Manifest, members: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """What ``members`` (pipeline ids and ``job:<name>`` entries) write: table names, and the prefixes
    of a relational root's child tables."""
    jobs = {job.identity: job for job in manifest.jobs}
    pipelines = {p.id: p for p in manifest.pipelines}
    names: set[str] = set()
    prefixes: list[str] = []
    for member in members:
        if member in jobs:
            names |= _job_writes(jobs[member])
            continue
        spec = pipelines.get(member)
        if spec is None:
            raise _Unreadable(f"{member!r} is neither a pipeline nor a job of the applied version")
        names.add(spec.table.lower())
        if spec.source.kind == "derive":
            names |= _lower(str(t) for t in spec.source.config.get("tables", ()))
        if spec.normalize == "relational":
            prefixes.append(spec.table.lower() + "__")
    return frozenset(names), tuple(prefixes)


def unit_inputs(manifest: Manifest, members: Iterable[str]) -> UnitInputs:
    """The publications whose inputs the unit running ``members`` writes (``ControlPlane.members``:
    its pipelines and the builds riding them, or a job entry)."""
    declared = tuple(spec.name for spec in manifest.publications)
    if not declared:
        return UnitInputs(())
    members = tuple(members)
    try:
        names, prefixes = _writes(manifest, members)
        producing = {m[len(JOB_PREFIX):] for m in members if m.startswith(JOB_PREFIX)}
        claimed = []
        for spec in manifest.publications:
            relations = publication_relations(manifest, spec)
            if (producing & set(spec.producers) or names & relations
                    or any(r.startswith(p) for r in relations for p in prefixes)):
                claimed.append(spec.name)
    except (_Unreadable, ContextfulError) as exc:
        return UnitInputs(declared, str(exc))
    return UnitInputs(tuple(claimed))
