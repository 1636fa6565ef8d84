"""The ``[[publication]]`` blocks: a coordinated publication's declaration (PublicationDeclaration).

Implements ``run.export.group-block`` (decision "coordinated-exports-activate", docs/exports.md
"Coordinated publications"): a publication groups the outputs of producers so that a receiver
activates every member together or none. A block declares

- ``name`` — the publication's name (what ``contextful export group <name>`` takes);
- ``destination`` — the one receiver every member is delivered to (an ``http``/``https`` URL);
- ``headers`` — the one header binding every delivery carries (``${secret:NAME}`` references
  resolved at delivery, ``engine.config.secrets``);
- ``[[publication.member]]`` — its typed export members, each ``type`` (``table``: a store-driven
  job's output table; ``model``: a model a build job publishes), ``producer`` (the job) and
  ``name`` (the output).

A member declares no destination or headers of its own: the block's are the members' shared ones.
:func:`parse_publications` reads the blocks; :func:`publication_problems` checks them against the
manifest's jobs: every producer a store-driven or build job, every member one of its producer's
outputs of the member's type, and every output of every producer covered exactly once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from contextful.engine.config.secrets import reference_problems
from contextful.storage.errors import ContextfulError, ManifestKeyUnknown, ManifestValueInvalid

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest

KEYS = ("name", "destination", "headers", "member", "description")
MEMBER_KEYS = ("type", "producer", "name")
MEMBER_TYPES = {"table": "store-driven", "model": "build"}
"""Each member type and the job kind producing outputs of that type."""
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,127}")


@dataclass(frozen=True)
class PublicationMember:
    """One typed export member: an output of one producer."""

    type: str
    """``table`` (a store-driven job's output table) or ``model`` (a build job's model)."""
    producer: str
    """The ``[[job]]`` producing it."""
    name: str
    """The table or model."""


@dataclass(frozen=True)
class PublicationSpec:
    """One ``[[publication]]`` block (PublicationDeclaration)."""

    name: str
    """The publication's name."""
    destination: str
    """The receiver's URL, shared by every member."""
    headers: tuple[tuple[str, str], ...]
    """The header binding every delivery carries (values may hold ``${secret:NAME}`` references)."""
    members: tuple[PublicationMember, ...]
    """The typed export members, in declaration order (the group's publication order)."""

    @property
    def producers(self) -> tuple[str, ...]:
        """The producing jobs, in first-member order."""
        return tuple(dict.fromkeys(m.producer for m in self.members))


def parse_publications(blocks: Any) -> tuple[list[PublicationSpec], list[ContextfulError]]:
    """The ``[[publication]]`` blocks and every problem reading them (names unique, shapes typed)."""
    if not isinstance(blocks, list):
        return [], [ManifestValueInvalid("the manifest", "publication", "declare publications as [[publication]] "
                                         "blocks")]
    problems: list[ContextfulError] = []
    found: list[PublicationSpec] = []
    for n, block in enumerate(blocks, 1):
        spec = _publication(block, n, problems)
        if spec is None:
            continue
        if any(p.name == spec.name for p in found):
            problems.append(ManifestValueInvalid(f"[[publication]] {spec.name!r}", "name",
                                                 "is declared by another [[publication]]"))
            continue
        found.append(spec)
    return found, problems


def _publication(block: Any, n: int, problems: list[ContextfulError]) -> PublicationSpec | None:
    where = f"[[publication]] #{n}"
    if not isinstance(block, dict):
        problems.append(ManifestValueInvalid(where, "publication", "is not a table"))
        return None
    name = block.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        problems.append(ManifestValueInvalid(where, "name", "is required: a letter, then letters, digits, _ or -"))
        name = None
    else:
        where = f"[[publication]] {name!r}"
    problems += [ManifestKeyUnknown(where, key, KEYS) for key in block if key not in KEYS]
    destination = block.get("destination")
    scheme = urlsplit(destination).scheme if isinstance(destination, str) else ""
    if scheme not in ("http", "https") or not urlsplit(str(destination)).netloc:
        problems.append(ManifestValueInvalid(where, "destination", "is required: the receiver's http(s) URL, "
                                             "one for every member"))
    headers = block.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        problems.append(ManifestValueInvalid(where, "headers", "is a table of header name = text"))
        headers = {}
    problems += reference_problems(where, {k: v for k, v in block.items() if k != "member"})
    members = _members(where, block.get("member", []), problems)
    if name is None or not isinstance(destination, str):
        return None
    return PublicationSpec(name, destination, tuple(headers.items()), members)


def _members(where: str, blocks: Any, problems: list[ContextfulError]) -> tuple[PublicationMember, ...]:
    if not isinstance(blocks, list) or not blocks:
        problems.append(ManifestValueInvalid(where, "member", "declare at least one [[publication.member]]"))
        return ()
    members: list[PublicationMember] = []
    for n, block in enumerate(blocks, 1):
        at = f"{where} member #{n}"
        if not isinstance(block, dict):
            problems.append(ManifestValueInvalid(at, "member", "is not a table"))
            continue
        problems += [ManifestKeyUnknown(at, key, MEMBER_KEYS) for key in block if key not in MEMBER_KEYS]
        kind, producer, name = block.get("type"), block.get("producer"), block.get("name")
        if kind not in MEMBER_TYPES:
            problems.append(ManifestValueInvalid(at, "type", f"is one of {', '.join(MEMBER_TYPES)}"))
        for key, value in (("producer", producer), ("name", name)):
            if not isinstance(value, str) or not value:
                problems.append(ManifestValueInvalid(at, key, "is required (text)"))
        if isinstance(kind, str) and kind in MEMBER_TYPES and isinstance(producer, str) and producer \
                and isinstance(name, str) and name:
            members.append(PublicationMember(kind, producer, name))
    return tuple(members)


def producer_outputs(manifest: Manifest, producer: str) -> tuple[str, tuple[str, ...]] | None:
    """The member type a job produces and its outputs (a store-driven job's tables, a build's models);
    None when ``producer`` names no such job."""
    for job in manifest.jobs:
        if job.name == producer:
            if job.kind == "store-driven":
                return "table", job.tables
            if job.kind == "build":
                return "model", job.target
            return None
    return None


def publication_problems(manifest: Manifest, publications: list[PublicationSpec]) -> list[ContextfulError]:
    """What the jobs say of each publication: every producer a store-driven or build job, every member
    one of its outputs of its type, every output of every producer a member exactly once."""
    problems: list[ContextfulError] = []
    for spec in publications:
        where = f"[[publication]] {spec.name!r}"
        seen: dict[tuple[str, str], int] = {}
        for member in spec.members:
            key = (member.producer, member.name)
            seen[key] = seen.get(key, 0) + 1
        for producer in spec.producers:
            outputs = producer_outputs(manifest, producer)
            if outputs is None:
                problems.append(ManifestValueInvalid(where, "member.producer", f"{producer!r} is no store-driven or "
                                                     "build [[job]]: a producer is a store-driven job or a model build"))
                continue
            kind, names = outputs
            for member in spec.members:
                if member.producer == producer and member.type != kind:
                    problems.append(ManifestValueInvalid(where, "member.type", f"{member.name!r} of {producer!r} is "
                                                         f"a {kind}, not a {member.type}"))
                elif member.producer == producer and member.name not in names:
                    problems.append(ManifestValueInvalid(where, "member.name", f"{member.name!r} is no output of "
                                                         f"{producer!r} (its outputs: {', '.join(names)})"))
            missing = [name for name in names if (producer, name) not in seen]
            if missing:
                problems.append(ManifestValueInvalid(where, "member", f"every output of {producer!r} is a member "
                                                     f"exactly once; not covered: {', '.join(missing)}"))
        twice = sorted(f"{p}.{n}" for (p, n), count in seen.items() if count > 1)
        if twice:
            problems.append(ManifestValueInvalid(where, "member", f"every output is a member exactly once; declared "
                                                 f"more than once: {', '.join(twice)}"))
    return problems
