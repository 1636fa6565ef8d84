"""Import and apply: the node's applied versions of its manifest (``surface.apply.*``, docs/control.md).

``contextful pipeline serve`` runs an applied version, never the working ``contextful.toml``; these
verbs are how a version becomes applied (``surface.apply.local-claim``: the node validates and
claims it in its own snapshot directory, ``engine.control.snapshots``, with no other process on
the path):

- :func:`import_manifest` (``surface.apply.guarded-import``) claims v1 from the working document
  while the snapshot directory holds no version; over a directory holding one it claims nothing,
  names the applied version and succeeds.
- :func:`apply_manifest` claims the next version: before any import it raises
  ``StoreNotInitialized`` (``surface.apply.uninitialized-store``); it validates the document it
  would claim with the engine's whole validation (``engine.config.validate``) against that
  document's own pipelines (``surface.apply.self-valid``) and refuses with
  ``ApplyValidationRefused``, claiming nothing (``surface.apply.validation``); a document that
  normalizes to the applied one claims nothing ("unchanged"). ``pipelines_only`` takes only the
  ``[[pipeline]]`` blocks of the working document and everything else (``[project]``,
  ``[control]``, ``[[model]]``, ``[[export]]``, ``[[external]]``) from the applied version
  (``surface.apply.external-snapshot``).
- A lost race (``surface.apply.version-race``): another apply claimed the version, or moved the
  pointer, first. The loser's ``ManifestVersionConflict`` is caught here: it reloads the winning
  version and applies its pending edits onto it (the working document again; pipelines-only, the
  working pipelines over the winner's document), at most :data:`MAX_ATTEMPTS` times. A claimed
  file is never rewritten; a version claimed by an apply that then lost the pointer stays, never
  applied, and the next claim takes the number after the highest claimed.
  In a project with ``[sync]`` the bucket head decides instead (``SyncedClaim.claim``): a version
  is published to the bucket first and claimed locally only once the head is won; a loser adopts
  the winner from the bucket and reapplies onto it.

What a version holds: the manifest document (TOML) as applied, then its ``[snapshot]`` table
(``engine.config.applied``). A full apply and an import store the working file's text as it is
(comments included) and a ``[snapshot]`` table captured from the project: each model's
``sql_file`` text inlined (``surface.fire.model-snapshot``), so a version runs the SQL it was
applied with. A pipelines-only apply whose document differs from the working file stores the
composed document written by ``engine.config.toml_writer``, and the applied version's
``[snapshot]`` table as it was (absent when it was absent): it validates with that version's
model SQL and regenerates nothing from the project's files. Two versions compare equal when
their documents normalize to one text and their ``[snapshot]`` tables are equal, so editing a
model's SQL file alone is a change a full apply claims.
:func:`load_applied` is what serve runs; :func:`versions` lists what was claimed.
"""

from __future__ import annotations

import contextlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contextful.engine.config.applied import KEY as SNAPSHOT_KEY
from contextful.engine.config.applied import AppliedSnapshot, metadata, split
from contextful.engine.config.control import read_control
from contextful.engine.config.manifest import Manifest
from contextful.engine.config.sync import read_sync
from contextful.engine.config.toml_writer import dumps
from contextful.engine.control.snapshots import POINTER, SnapshotDir
from contextful.engine.control.synced import Offered, SyncedClaim, admit, working_site_regions
from contextful.engine.project import MANIFEST, locate_project
from contextful.storage.errors import (
    ApplyValidationRefused,
    ControlSnapshotUnreadable,
    ManifestInvalid,
    ManifestVersionConflict,
    ProjectInvalid,
    StoreNotInitialized,
)

MAX_ATTEMPTS = 8
"""How many times an apply reloads the winner of a lost race and reapplies before giving up."""

MARKER = "\n# Written by import or apply: what this version was applied with (docs/control.md).\n"
"""The line between a version's document and its ``[snapshot]`` table."""

Sign = Callable[[int, str], bytes]
"""Signs version N's receipt over its content before the claim: the receipt's canonical bytes."""

Step = Callable[[str, int], None]
"""Called with ``("claim", N)`` before an apply claims version N and ``("advance", N)`` before it
moves the pointer to N: tests hold an apply there to make a race happen deterministically."""


@dataclass(frozen=True)
class ApplyOutcome:
    """What an import or apply did."""

    verb: str
    """``import`` or ``apply``."""
    version: int
    """The version applied when the verb returned."""
    claimed: bool
    """Whether this call claimed ``version`` (False: it was applied already, or the document is unchanged)."""
    previous: int | None
    """The version applied before (None: none was)."""
    snapshot: Path
    """The file of ``version``."""
    conflicts: int = 0
    """How many races this call lost and reapplied after."""
    adopted: bool = False
    """Whether this call adopted ``version`` from the ``[sync]`` bucket (``surface.apply.adopt-before-claim``)."""

    def to_json(self) -> dict[str, Any]:
        return {"verb": self.verb, "version": self.version, "claimed": self.claimed, "previous": self.previous,
                "snapshot": str(self.snapshot), "conflicts": self.conflicts, "adopted": self.adopted}


@dataclass(frozen=True)
class Applied:
    """The applied version: what serve runs."""

    version: int
    manifest: Manifest
    """The version's document parsed with the project directory as its root."""
    path: Path
    """Its ``manifest@v<N>.toml``."""


@dataclass(frozen=True)
class VersionInfo:
    version: int
    claimed_at: datetime
    """When it was claimed (its file's modification time, UTC)."""
    applied: bool
    """Whether the pointer names it now."""

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "claimed_at": self.claimed_at.isoformat(), "applied": self.applied}


def snapshot_dir(root: Path) -> SnapshotDir:
    """The snapshot directory the working document's ``[control]`` names (its ``[project]`` and
    ``[control]`` blocks alone are read: a node finds its versions whatever else the file holds)."""
    project, control = read_control(root)
    assert control.snapshot_dir is not None  # parse_control always resolves it
    return SnapshotDir(control.snapshot_dir, project.name)


def _claiming_dir(root: Path) -> SnapshotDir:
    """:func:`snapshot_dir` for a verb that claims: a working document whose ``[project]`` or
    ``[control]`` does not validate (or is not TOML) is refused under validation."""
    try:
        return snapshot_dir(root)
    except ManifestInvalid as exc:
        raise ApplyValidationRefused(exc.path, exc.problems) from exc
    except ProjectInvalid as exc:
        raise ApplyValidationRefused(exc.path, [exc]) from exc


def import_manifest(directory: str | Path = ".", *, store: str | None = None, machine: str | None = None,
                    offered: Offered | None = None) -> ApplyOutcome:
    """``contextful pipeline import``: claim v1 from the working document while no version is held
    (synced: first adopt the bucket's head when it has one, and claim nothing then)."""
    root = locate_project(directory)
    snapshots = _claiming_dir(root)
    synced = synced_claim(root, offered)
    applied = snapshots.applied()
    if applied is not None:
        return ApplyOutcome("import", applied, False, applied, snapshots.file(applied))
    held = snapshots.versions()
    if held not in ([], [1]):
        raise ControlSnapshotUnreadable(str(snapshots.path), f"it holds versions {held[0]} to {held[-1]} and no "
                                        f"applied pointer ({POINTER}); write the applied version's number there")
    if synced is not None and not held:
        return _synced_import(root, snapshots, synced, store, machine)
    claimed = False
    if not held:
        text, doc = _working(root)
        manifest = validate_document(root, doc, str(root / MANIFEST), store, machine)
        content = claimable_text(text, _captured(manifest, store))
        snapshots.prepare()
        try:
            snapshots.claim(1, content)
            claimed = True
        except ManifestVersionConflict:  # a concurrent import claimed v1 first
            pass
    else:
        snapshots.prepare()
    if synced is not None and snapshots.receipt(1) is None:  # v1 claimed by an import that died before its receipt
        with contextlib.suppress(ManifestVersionConflict):
            snapshots.claim_receipt(1, synced.sign(snapshots, 1, snapshots.text(1)))
    try:  # v1 held and no pointer: a concurrent import between its claim and its advance, or one that died there
        snapshots.advance(None, 1)
    except ManifestVersionConflict:
        pass
    return ApplyOutcome("import", 1, claimed, None, snapshots.file(1))


def _synced_import(root: Path, snapshots: SnapshotDir, synced: SyncedClaim, store: str | None,
                   machine: str | None) -> ApplyOutcome:
    """A synced import over a snapshot directory holding no version: adopt the bucket's head when it
    has one (claiming nothing), else claim v1 through the bucket (``SyncedClaim.claim``); an import
    that loses v1 to another node's adopts the winner's."""
    content: str | None = None
    lost: ManifestVersionConflict | None = None
    for attempt in range(MAX_ATTEMPTS):
        if (adopted := synced.adopt_head(snapshots, store=store, machine=machine)) is not None:
            return ApplyOutcome("import", adopted, False, None, snapshots.file(adopted), attempt, adopted=True)
        if content is None:
            text, doc = _working(root)
            content = claimable_text(text, _captured(validate_document(root, doc, str(root / MANIFEST), store, machine), store))
        try:
            synced.claim(snapshots, None, content)
        except ManifestVersionConflict as exc:
            lost = exc
            continue
        return ApplyOutcome("import", 1, True, None, snapshots.file(1), attempt)
    assert lost is not None
    raise lost


def apply_manifest(directory: str | Path = ".", *, pipelines_only: bool = False, store: str | None = None,
                   machine: str | None = None, step: Step | None = None, offered: Offered | None = None) -> ApplyOutcome:
    """``contextful pipeline apply [--pipelines-only]``: claim and apply the next version (synced: adopt
    the bucket's head first when it descends from the applied version, sign the claim, push it)."""
    root = locate_project(directory)
    snapshots = _claiming_dir(root)
    synced = synced_claim(root, offered)
    if synced is not None:  # the bucket's head first (adopt-before-claim), so the claim descends from it
        synced.adopt_head(snapshots, store=store, machine=machine)
        synced.publish_pending(snapshots)
    if snapshots.applied() is None:
        raise StoreNotInitialized(snapshots.project, str(snapshots.path))
    snapshots.prepare()
    working_text, working = _working(root)
    source = str(root / MANIFEST) + (" ([[pipeline]] blocks over the applied version)" if pipelines_only else "")
    conflicts = 0
    lost: ManifestVersionConflict | None = None
    for _attempt in range(MAX_ATTEMPTS):
        applied = snapshots.applied()
        assert applied is not None  # a pointer never goes away
        base, base_meta = split(parsed_version(snapshots, applied))
        if pipelines_only:  # everything but the pipelines as applied, its [snapshot] table included
            doc, kept = _pipelines_over(working, base), AppliedSnapshot.read(applied, base_meta)
            validate_document(root, doc, source, store, machine, kept)
            meta = base_meta
        else:
            doc = working
            meta = _captured(validate_document(root, doc, source, store, machine), store)
        if normal_text(doc) == normal_text(base) and meta == base_meta:
            return ApplyOutcome("apply", applied, False, applied, snapshots.file(applied), conflicts)
        text = working_text if normal_text(doc) == normal_text(working) else dumps(doc)
        try:
            if synced is not None:  # the bucket head's conditional write decides the version
                version = synced.claim(snapshots, applied, claimable_text(text, meta), step)
            else:
                version = claim_next(snapshots, applied, text, meta, step)
        except ManifestVersionConflict as exc:
            conflicts += 1
            lost = exc
            if synced is not None:  # the winner is the bucket's head: adopt it, then reapply onto it
                synced.adopt_head(snapshots, store=store, machine=machine)
            continue
        return ApplyOutcome("apply", version, True, applied, snapshots.file(version), conflicts)
    assert lost is not None  # every attempt that did not return lost a race
    raise lost


def claim_next(snapshots: SnapshotDir, applied: int, text: str, meta: dict[str, Any] | None,
               step: Step | None = None, sign: Sign | None = None) -> int:
    """Claim the version after the highest claimed, holding ``text`` and its ``[snapshot]`` table
    ``meta``, and advance the pointer to it from ``applied``: the version compare-and-swap every
    apply claims through (the CLI's and a served draft's, ``engine.control.drafts``).
    ``ManifestVersionConflict`` when the version is claimed first or the pointer moved.

    ``sign`` (a synced claim's, ``surface.apply.receipt-file``) signs the version's receipt before
    anything is written, so a signing failure leaves neither snapshot nor pointer naming it; the
    receipt is claimed beside the snapshot, and only then does the pointer move."""
    version = max(snapshots.versions(), default=applied) + 1
    content = claimable_text(text, meta)
    receipt = sign(version, content) if sign is not None else None
    _call(step, "claim", version)
    snapshots.claim(version, content)
    if receipt is not None:
        snapshots.claim_receipt(version, receipt)
    _call(step, "advance", version)
    snapshots.advance(applied, version)
    return version


def load_applied(directory: str | Path = ".") -> Applied | None:
    """The applied version's manifest, parsed with the project directory as its root (None: nothing
    is applied yet); a version that no longer parses raises ``ControlSnapshotUnreadable``."""
    root = locate_project(directory)
    snapshots = snapshot_dir(root)
    version = snapshots.applied()
    if version is None:
        return None
    return Applied(version, load_version(root, version, snapshots), snapshots.file(version))


def load_version(root: Path, version: int, snapshots: SnapshotDir | None = None, *,
                 without_jobs: frozenset[str] = frozenset()) -> Manifest:
    """Version ``version``'s manifest, parsed with ``root`` (the project directory) as its root: what
    a unit's child process runs, whatever has been applied since it was dispatched. ``without_jobs``:
    the ``[[job]]`` blocks of those names are left out (serve arming around the jobs it refuses,
    ``engine.control.arming``)."""
    from contextful.engine.config.parse import parse_manifest

    snapshots = snapshots or snapshot_dir(root)
    path = snapshots.file(version)
    doc, meta = split(parsed_version(snapshots, version))
    if without_jobs and isinstance(doc.get("job"), list):
        doc["job"] = [b for b in doc["job"] if not (isinstance(b, dict) and b.get("name") in without_jobs)]
    try:
        return parse_manifest(doc, root, str(path), applied=AppliedSnapshot.read(version, meta))
    except ManifestInvalid as exc:
        raise ControlSnapshotUnreadable(str(path), f"version {version} does not validate: {exc.detail}") from exc


def versions(directory: str | Path = ".") -> list[VersionInfo]:
    """Every claimed version, ascending, with when it was claimed and whether it is applied."""
    snapshots = snapshot_dir(locate_project(directory))
    applied = snapshots.applied()
    found = []
    for version in snapshots.versions():
        try:
            mtime = snapshots.file(version).stat().st_mtime
        except OSError as exc:
            raise ControlSnapshotUnreadable(str(snapshots.file(version)), f"cannot be read: {exc}") from exc
        found.append(VersionInfo(version, datetime.fromtimestamp(mtime, UTC), version == applied))
    return found


def synced_claim(root: Path, offered: Offered | None) -> SyncedClaim | None:
    """The synced claim of a project with ``[sync]``, its authority admitted first (None: it does not
    sync); a ``[sync]`` block that does not validate is refused under validation."""
    try:
        sync = read_sync(root)
        project, _control = read_control(root)
        regions = working_site_regions(root, project) if sync is not None else None
    except ManifestInvalid as exc:
        raise ApplyValidationRefused(exc.path, exc.problems) from exc
    if sync is None:
        return None
    authority = admit(project, offered or Offered())
    return SyncedClaim(root, project, sync, authority.pins, regions, authority.signer)


def claimable_text(text: str, meta: dict[str, Any] | None) -> str:
    """The text a version file holds: the document ``text`` as it is (comments included), then its
    ``[snapshot]`` table ``meta`` (``engine.config.applied``; None: the version holds none)."""
    if meta is None:
        return text
    return f"{text if text.endswith(chr(10)) else text + chr(10)}{MARKER}{dumps({SNAPSHOT_KEY: meta})}"


def _captured(manifest: Manifest, store: str | None) -> dict[str, Any]:
    """The ``[snapshot]`` table import and a full apply write for ``manifest``: each model's
    ``sql_file`` text inlined (``surface.fire.model-snapshot``) and the standalone table contracts
    captured from the store (``surface.fire.standalone-snapshot``; ``engine.control.contracts``)."""
    from contextful.engine.control.contracts import capture_for_apply

    return metadata({m.name: m.sql for m in manifest.models if m.sql_file is not None},
                    capture_for_apply(manifest, store))


def _call(step: Step | None, what: str, version: int) -> None:
    if step is not None:
        step(what, version)


def _working(root: Path) -> tuple[str, dict[str, Any]]:
    """The working contextful.toml's text and parsed document; unparseable TOML is refused under validation."""
    path = root / MANIFEST
    text = path.read_text(encoding="utf-8")
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ApplyValidationRefused(str(path), [ProjectInvalid(str(path), f"not valid TOML: {exc}")]) from exc


def parsed_version(snapshots: SnapshotDir, version: int) -> dict[str, Any]:
    try:
        return tomllib.loads(snapshots.text(version))
    except tomllib.TOMLDecodeError as exc:
        raise ControlSnapshotUnreadable(str(snapshots.file(version)), f"version {version} is not valid TOML: "
                                                                      f"{exc}") from exc


def _pipelines_over(working: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The applied document ``base`` with the working document's ``[[pipeline]]`` blocks (all of
    them, none when it declares none) in place of its own, every other key as applied."""
    composed = {key: working["pipeline"] if key == "pipeline" else value for key, value in base.items()
                if key != "pipeline" or "pipeline" in working}
    if "pipeline" in working:
        composed.setdefault("pipeline", working["pipeline"])
    return composed


def normal_text(doc: dict[str, Any]) -> str:
    """The normal form two documents are compared in: TOML with every table's keys sorted."""
    return dumps(doc, sort_keys=True)


def validate_document(root: Path, doc: dict[str, Any], source: str, store: str | None, machine: str | None,
              applied: AppliedSnapshot | None = None) -> Manifest:
    """The manifest of ``doc`` after the engine's whole validation; ``applied``: the metadata a
    pipelines-only apply keeps (its models' SQL is the applied version's, not the project's files)."""
    from contextful.engine.config.validate import validated_manifest
    from contextful.engine.control.document_secrets import refuse_secret_material

    refuse_secret_material(doc)  # surface.edit.secret-in-document: before validation can quote a value
    try:
        return validated_manifest(root, doc, source=source, store=store, machine=machine, applied=applied)
    except ManifestInvalid as exc:
        raise ApplyValidationRefused(source, exc.problems) from exc
