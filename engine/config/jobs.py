"""The ``[[job]]`` blocks: every recurring piece of work besides landing, as a declaration.

Implements the declaration half of the control plane's fire stage (../shared/spec/seed-control-plane.txt,
"fire"): a job is one of a closed union of kinds, each dispatched under the identity ``job:<name>``:

- ``build`` — the native model publisher over ``target`` (models); ``after = "<pipeline>"`` inherits
  that pipeline's head schedule and runs only after a successful unit (``surface.fire.build-dependency``);
- ``fold`` and ``sync-push`` — maintenance, dispatched as ``contextful job fire <name>``
  (``surface.fire.scheduled-maintenance``); a fold's ``target`` names produced tables;
- ``store-driven`` — a registered body (``body = "<name>"``) or a bound delegate
  (``body = { delegate = "<name>" }``, the spec's spelling) over a store
  input relation (``statement``), writing ``tables``; ``max_in_flight`` is required, no default
  (``surface.fire.store-driven-concurrency``); ``isolated_items`` names each item's logical key, its
  entity and its attempt budget (:class:`IsolatedItems`; a delegate's defer parks such an item:
  ``surface.delegate.defer-parks``, ``engine.jobs.parking``);
- ``plan`` — a compiled plan file beside the manifest lowered onto one execution (``surface.fire.plan-job``);
- ``synthesize`` — reads ``source``, ``target`` and ``entities``, writes ``target``; ``read_individual``
  widens its fire credential (``surface.dispatch.fire-individual``).

``sweep``, ``rebuild-catalog`` and ``validate`` are kinds the spec names but never dispatches:
``JobKindUndispatched`` naming the command that does that work (``surface.fire.kind-undispatched``).
Any other kind, an argument vector or a host command is ``JobKindUnknown`` (``surface.fire.job-kind-unknown``).

This module reads the blocks (:func:`parse_jobs`); the checks that need the rest of the manifest
(targets bound, dependencies, identities, bodies registered) are :func:`job_problems`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import (
    ArgumentInvalid,
    BodyUnregistered,
    ContextfulError,
    JobBodyUnregistered,
    JobConcurrencyUnset,
    JobKindUndispatched,
    JobKindUnknown,
    JobTargetUnbound,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest

KINDS = ("build", "fold", "sync-push", "store-driven", "plan", "synthesize")
"""The closed union of dispatched job kinds."""

UNDISPATCHED = {
    "sweep": "contextful store collect",
    "rebuild-catalog": "contextful export run",
    "validate": "contextful pipeline validate",
}
"""The kinds the spec names that no job dispatches, and the command that does their work."""

HOST_COMMAND_KEYS = ("command", "argv", "args", "exec", "shell")
"""Keys that would make a job run a host command or an argument vector: never a job (JobKindUnknown)."""

KEYS = ("name", "kind", "schedule", "after", "target", "body", "statement", "tables",
        "max_in_flight", "as_of", "retry", "isolated_items", "plan", "source", "entities", "read_individual", "description")

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,127}")


ISOLATED_KEYS = ("logical_key", "entity_key", "entity_namespace", "max_attempts")


@dataclass(frozen=True)
class IsolatedItems:
    """A store-driven job's ``isolated_items``: what names each item and how often it may be tried."""

    logical_key: str
    """The statement's column naming each item (its ``_items`` row's logical key)."""
    entity_key: str | None = None
    """The column naming the entity the item writes for (None: the logical key's column)."""
    entity_namespace: str | None = None
    """The entity's namespace (None: the job's identity ``job:<name>``)."""
    max_attempts: int | None = None
    """The item's attempt budget, a defer's attempt included (None: the job's ``retry`` attempts)."""


@dataclass(frozen=True)
class JobSpec:
    """One ``[[job]]`` block as declared."""

    name: str
    kind: str
    schedule: str | None = None
    after: str | None = None
    """A build's upstream pipeline: the build inherits its head schedule and runs after its successful units."""
    target: tuple[str, ...] = ()
    """A build's models, a fold's tables, a synthesize job's target table."""
    body: str | None = None
    delegate: str | None = None
    statement: str | None = None
    """A store-driven job's input relation (SQL over store tables)."""
    tables: tuple[str, ...] = ()
    """The tables a store-driven job writes."""
    max_in_flight: int | None = None
    as_of: str | None = None
    """A store-driven job's input instant (ISO 8601, UTC); None: the instant its execution opens."""
    retry: tuple[tuple[str, Any], ...] = ()
    """A store-driven job's per-item retry budget (``attempts``, ``base_s``, ``max_s``; engine.run.retry)."""
    isolated_items: IsolatedItems | None = None
    """A store-driven job's isolated items (None: each item is named by the statement's first column)."""
    plan: str | None = None
    """A plan job's compiled plan file, relative to the manifest."""
    source: str | None = None
    entities: str | None = None
    read_individual: bool = False
    description: str | None = None

    @property
    def identity(self) -> str:
        """The dispatch identity and host scope: ``job:<name>``."""
        return f"job:{self.name}"


def parse_jobs(blocks: Any) -> tuple[list[JobSpec], list[ContextfulError]]:
    """The ``[[job]]`` blocks and every problem reading them (names unique; a kind of the union)."""
    problems: list[ContextfulError] = []
    if not isinstance(blocks, list):
        return [], [ManifestValueInvalid("the manifest", "job", "declare jobs as [[job]] blocks")]
    jobs: list[JobSpec] = []
    seen: set[str] = set()
    for n, block in enumerate(blocks, 1):
        job = _job(block, n, problems)
        if job is None:
            continue
        if job.name in seen:
            problems.append(ManifestValueInvalid(f"[[job]] {job.name!r}", "name", "is the name of another job"))
            continue
        seen.add(job.name)
        jobs.append(job)
    return jobs, problems


def _job(block: Any, n: int, problems: list[ContextfulError]) -> JobSpec | None:
    where = f"[[job]] #{n}"
    if not isinstance(block, dict):
        problems.append(ManifestValueInvalid(where, "job", "must be a table"))
        return None
    name = block.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(ManifestValueInvalid(where, "name", "is required: a letter, then letters, digits, '_' or '-'"))
        return None
    where = f"[[job]] {name!r}"
    kind = block.get("kind")
    host = [k for k in HOST_COMMAND_KEYS if k in block]
    if host:
        problems.append(JobKindUnknown(name, str(kind), f"declares {host[0]!r}: a job never runs a host command or "
                                                       "an argument vector, only a kind of the union"))
        return None
    if kind in UNDISPATCHED:
        problems.append(JobKindUndispatched(name, str(kind), UNDISPATCHED[str(kind)]))
        return None
    if kind not in KINDS:
        problems.append(JobKindUnknown(name, str(kind), f"kind {kind!r} is none of {', '.join(KINDS)}"))
        return None
    for key in block:
        if key not in KEYS:
            problems.append(ManifestKeyUnknown(where, key, KEYS))
    found = len(problems)
    job = JobSpec(
        name, str(kind),
        schedule=_text(where, block, "schedule", problems),
        after=_text(where, block, "after", problems),
        target=_names(where, block, "target", problems),
        body=_text(where, block, "body", problems) if not isinstance(block.get("body"), dict) else None,
        delegate=_delegate(where, block, problems),
        statement=_text(where, block, "statement", problems),
        tables=_names(where, block, "tables", problems),
        max_in_flight=_in_flight(name, kind, block, problems),
        as_of=_as_of(name, kind, block, problems),
        retry=_retry(name, kind, block, problems),
        isolated_items=_isolated(name, kind, block, problems),
        plan=_text(where, block, "plan", problems),
        source=_text(where, block, "source", problems),
        entities=_text(where, block, "entities", problems),
        read_individual=_flag(where, block, "read_individual", problems),
        description=_text(where, block, "description", problems),
    )
    return job if len(problems) == found else None


def _delegate(where: str, block: dict[str, Any], problems: list[ContextfulError]) -> str | None:
    """``body = { delegate = "<name>" }``: a bound delegate in place of a registered body (the spec's spelling)."""
    body = block.get("body")
    if not isinstance(body, dict):
        return None
    if set(body) != {"delegate"}:
        problems.append(ManifestValueInvalid(where, "body", "is a registered body's name or { delegate = \"<name>\" }, "
                                                            f"not {body!r}"))
        return None
    return _text(where, body, "delegate", problems)


def _text(where: str, block: dict[str, Any], key: str, problems: list[ContextfulError]) -> str | None:
    value = block.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        problems.append(ManifestValueInvalid(where, key, f"must be a non-empty string, not {value!r}"))
        return None
    return value


def _names(where: str, block: dict[str, Any], key: str, problems: list[ContextfulError]) -> tuple[str, ...]:
    from contextful.engine.config.parse import string_list

    value = block.get(key, [])
    names = string_list(value)
    if names is None:
        problems.append(ManifestValueInvalid(where, key, f"must be a name or a list of names, not {value!r}"))
        return ()
    return names


def _flag(where: str, block: dict[str, Any], key: str, problems: list[ContextfulError]) -> bool:
    value = block.get(key, False)
    if not isinstance(value, bool):
        problems.append(ManifestValueInvalid(where, key, f"must be true or false, not {value!r}"))
        return False
    return value


def _in_flight(name: str, kind: Any, block: dict[str, Any], problems: list[ContextfulError]) -> int | None:
    """A store-driven job's ``max_in_flight``: a positive integer, required, no default."""
    value = block.get("max_in_flight")
    if kind != "store-driven":
        if value is not None:
            problems.append(ManifestValueInvalid(f"[[job]] {name!r}", "max_in_flight",
                                                 "is a store-driven job's bound only"))
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(JobConcurrencyUnset(name, value))
        return None
    return value


def _store_driven_only(name: str, kind: Any, block: dict[str, Any], key: str,
                       problems: list[ContextfulError]) -> bool:
    """Whether ``key`` is declared on a store-driven block (reported as a problem on any other kind)."""
    if key not in block:
        return False
    if kind != "store-driven":
        problems.append(ManifestValueInvalid(f"[[job]] {name!r}", key, "is a store-driven job's key only"))
        return False
    return True


def _as_of(name: str, kind: Any, block: dict[str, Any], problems: list[ContextfulError]) -> str | None:
    """A store-driven job's ``as_of``: an instant (TOML date-time or ISO 8601 text), kept as UTC ISO text."""
    from contextful.engine.read import parse_instant

    if not _store_driven_only(name, kind, block, "as_of", problems):
        return None
    value = block["as_of"]
    try:
        instant = parse_instant(value if isinstance(value, str | datetime) else repr(value))
    except ArgumentInvalid as exc:
        problems.append(ManifestValueInvalid(f"[[job]] {name!r}", "as_of", exc.reason))
        return None
    assert instant is not None
    return instant.astimezone(UTC).isoformat()  # one instant, one text: the pinned plan hashes it


def _retry(name: str, kind: Any, block: dict[str, Any], problems: list[ContextfulError]) -> tuple[tuple[str, Any], ...]:
    """A store-driven job's ``retry`` table, checked as a retry schedule's configuration."""
    from contextful.engine.run.retry import RetrySchedule

    if not _store_driven_only(name, kind, block, "retry", problems):
        return ()
    value = block["retry"]
    where = f"[[job]] {name!r} retry"
    if not isinstance(value, dict):
        problems.append(ManifestValueInvalid(f"[[job]] {name!r}", "retry", f"must be a table, not {value!r}"))
        return ()
    try:
        RetrySchedule.from_config(value, where=where)
    except ManifestInvalid as exc:
        problems.extend(exc.problems)
        return ()
    return tuple(sorted(value.items()))


def _isolated(name: str, kind: Any, block: dict[str, Any], problems: list[ContextfulError]) -> IsolatedItems | None:
    """A store-driven job's ``isolated_items`` table: a ``logical_key`` column, optional ``entity_key``
    and ``entity_namespace`` text, ``max_attempts`` an integer >= 1; every problem named."""
    if not _store_driven_only(name, kind, block, "isolated_items", problems):
        return None
    value = block["isolated_items"]
    where = f"[[job]] {name!r}"
    if not isinstance(value, dict):
        problems.append(ManifestValueInvalid(where, "isolated_items", "must be a table { logical_key = \"<column>\", "
                                                                      f"... }}, not {value!r}"))
        return None
    found = len(problems)
    problems += [ManifestValueInvalid(where, f"isolated_items.{key}", f"is no key of isolated_items (keys: "
                                                                     f"{', '.join(ISOLATED_KEYS)})")
                 for key in value if key not in ISOLATED_KEYS]
    if "logical_key" not in value:
        problems.append(ManifestValueInvalid(where, "isolated_items.logical_key", "is required: the statement's "
                                                                                  "column naming each item"))
    texts: dict[str, str | None] = {}
    for key in ("logical_key", "entity_key", "entity_namespace"):
        text = value.get(key)
        texts[key] = text if isinstance(text, str) and text.strip() else None
        if text is not None and texts[key] is None:
            problems.append(ManifestValueInvalid(where, f"isolated_items.{key}",
                                                 f"must be a non-empty string, not {text!r}"))
    attempts = value.get("max_attempts")
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1):
        problems.append(ManifestValueInvalid(where, "isolated_items.max_attempts",
                                             f"must be an integer >= 1, not {attempts!r}"))
    logical_key = texts["logical_key"]
    if len(problems) != found or logical_key is None:
        return None
    return IsolatedItems(logical_key, texts["entity_key"], texts["entity_namespace"], attempts)


def job_problems(manifest: Manifest, jobs: list[JobSpec]) -> list[ContextfulError]:
    """What the rest of the manifest says of ``jobs``: targets bound (``JobTargetUnbound``), a
    dependency naming a pipeline of a build declaring no schedule, and no pipeline sharing a job's
    dispatch identity (``surface.fire.job-identity``)."""
    from contextful.engine.model.inputs import produced

    problems: list[ContextfulError] = []
    tables = {t.lower() for t in produced(manifest)}
    models = {m.name for m in manifest.models}
    pipelines = {p.id for p in manifest.pipelines}
    for job in jobs:
        where = f"[[job]] {job.name!r}"
        if job.kind == "build":
            problems += [JobTargetUnbound(job.name, t, "no [[model]] of that name") for t in job.target if t not in models]
        elif job.kind == "fold":
            problems += [JobTargetUnbound(job.name, t, "no pipeline, model or external produces it")
                         for t in job.target if t.lower() not in tables]
        if job.kind == "store-driven":
            problems += body_problems(job, manifest)
            if job.statement is None:
                problems.append(ManifestValueInvalid(where, "statement", "a store-driven job reads its items from a "
                                                                         "`statement` over store tables"))
        if job.kind == "plan" and job.plan is None:
            problems.append(ManifestValueInvalid(where, "plan", "a plan job names its compiled plan file "
                                                                "(relative to the manifest)"))
        if job.kind == "synthesize":
            problems += _synthesize_problems(job)
        elif job.read_individual:
            problems.append(ManifestValueInvalid(where, "read_individual", f"only a synthesize job reads individual "
                                                 f"rows (surface.dispatch.fire-individual), not a {job.kind} job"))
        if job.after is not None:
            if job.kind != "build":
                problems.append(ManifestValueInvalid(where, "after", f"only a build job depends on a pipeline, not a "
                                                                     f"{job.kind} job"))
            elif job.after not in pipelines:
                problems.append(ManifestValueInvalid(where, "after", f"names no pipeline: {job.after!r}"))
            if job.schedule is not None:
                problems.append(ManifestValueInvalid(where, "after", "a job depending on a pipeline inherits its "
                                                                     "schedule: declare `after` or `schedule`, not both"))
        if job.identity in pipelines or job.name in pipelines:
            problems.append(ManifestValueInvalid(where, "name", f"pipeline {job.name!r} shares its dispatch identity: "
                                                                "one exclusion key cannot dispatch two operations"))
    return problems


def _synthesize_problems(job: JobSpec) -> list[ContextfulError]:
    """A synthesize job names its ``source`` (mentions), its ``entities`` table and one ``target``
    (its claims), three distinct tables (docs/jobs.md "Synthesize jobs")."""
    where = f"[[job]] {job.name!r}"
    problems: list[ContextfulError] = [ManifestValueInvalid(where, key, "a synthesize job names it")
                                       for key in ("source", "entities") if getattr(job, key) is None]
    if len(job.target) != 1:
        problems.append(ManifestValueInvalid(where, "target", "a synthesize job names one target table (its claims)"))
    named = [t.lower() for t in (job.source, job.entities, *job.target) if t]
    if len(set(named)) != len(named):
        problems.append(ManifestValueInvalid(where, "target", "source, entities and target are three distinct tables"))
    return problems


def body_problems(job: JobSpec, manifest: Manifest) -> list[ContextfulError]:
    """A store-driven job runs a body the executable registers (``[project] modules`` and the
    ``contextful.tasks`` entry points are imported by now: ``engine.registrations``) or a delegate a
    ``[control.delegates.<name>]`` block binds (``JobDelegateUnbound``: ``surface.delegate.binding``)."""
    from contextful.engine.run.bodies import BODIES

    where = f"[[job]] {job.name!r}"
    if (job.body is None) == (job.delegate is None):
        return [ManifestValueInvalid(where, "body", "a store-driven job names its body: a registered body's name "
                                                    "or { delegate = \"<name>\" }")]
    if job.delegate is not None:
        from contextful.engine.jobs.delegated import unbound_delegate

        unbound = unbound_delegate(job, manifest)
        return [] if unbound is None else [unbound]
    assert job.body is not None
    try:
        BODIES.get(job.body)
    except BodyUnregistered as exc:
        return [JobBodyUnregistered(job.name, f"body {job.body!r}",
                                    f"registered: {', '.join(exc.known) or 'none'}; [project] modules imported: "
                                    f"{', '.join(exc.modules) or 'none'}; contextful.tasks entry points: "
                                    f"{', '.join(exc.entry_points) or 'none'}")]
    return []
