"""Store drafts: an Admin's edit of the control document, validated and saved, then claimed.

Implements ``surface.edit.store-draft``, ``surface.apply.draft-claim``,
``surface.apply.draft-table-contracts`` and ``surface.apply.draft-absent`` (docs/served.md,
"Control routes"; the routes are ``engine.served.control``).

- :func:`save_draft`: the complete document (TOML text, no ``[snapshot]`` table) an operator edited
  from applied version N is validated as apply validates (``engine.control.apply``: the credential
  scan, then the engine's whole validation against the document's own pipelines) with version N's
  ``[snapshot]`` metadata standing in for the project's files (its models' SQL, its standalone
  table contracts: the draft *keeps* N's metadata, as a pipelines-only apply does). A valid one is
  saved as the project's one draft in the store's catalog (``cf_control_drafts``, SQLite and
  PostgreSQL alike), bound to N, the verified operator and a random nonce, with the digest of what
  was validated; it replaces the draft saved before. The applied pointer does not move.
- :func:`claim_draft`: finds the draft (``ControlDraftAbsent`` when none is saved, or another id),
  refuses it under validation (``ApplyValidationRefused``) when its row no longer matches its digest
  or its kept metadata is not version N's, regenerates the ``[snapshot]`` table from version N's
  immutable file, validates the document again, and claims it through the one version
  compare-and-swap every apply uses (``engine.control.apply.claim_next``): from N, so a pointer that
  moved since raises ``ManifestVersionConflict`` and claims nothing. A claimed draft is forgotten.
  In a project with ``[sync]`` the claim is a synced one (``surface.apply.synced-attestation``): the
  request's Admin credential and the serve's issuer signing key (``CONTEXTFUL_CONTROL_SIGNING_KEY``)
  are admitted first (``ControlAttestationUnavailable`` else), the bucket's head adopted as apply
  adopts it, the version's receipt signed before anything is written, and the version decided in the
  bucket before it is claimed here (``SyncedClaim.claim``): a lost race claims nothing locally.
  A document that normalizes to version N's claims nothing ("unchanged") and is forgotten too.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from contextful.engine.config.applied import AppliedSnapshot, split
from contextful.engine.control.apply import (
    MARKER,
    claim_next,
    claimable_text,
    normal_text,
    parsed_version,
    synced_claim,
    validate_document,
)
from contextful.engine.control.document_secrets import refuse_secret_material, refuse_secret_text
from contextful.engine.control.snapshots import SnapshotDir
from contextful.engine.control.synced import Offered
from contextful.storage.catalog import Catalog, DraftRow
from contextful.storage.clock import Clock, from_us
from contextful.storage.errors import (
    ApplyValidationRefused,
    ControlDraftAbsent,
    ManifestValueInvalid,
    ManifestVersionConflict,
    ProjectInvalid,
    StoreNotInitialized,
)


@dataclass(frozen=True)
class Claimed:
    """What claiming a draft did."""

    version: int
    """The version applied now."""
    previous: int
    """The version the draft edited (applied before)."""
    claimed: bool
    """False: the draft's document was version ``previous``'s, and nothing was claimed."""

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "previous": self.previous, "claimed": self.claimed}


def applied_document(snapshots: SnapshotDir, version: int) -> str:
    """Version ``version``'s document as it was applied, without its ``[snapshot]`` table: the text
    before the marker import and apply write ahead of the table (comments kept)."""
    text = snapshots.text(version)
    head, marker, tail = text.rpartition(MARKER)
    if marker and set(tomllib.loads(tail)) <= {"snapshot"}:
        return head if head.endswith("\n") else head + "\n"
    return text


def draft_json(row: DraftRow | None) -> dict[str, Any] | None:
    """A saved draft as ``GET /control/document`` shows it."""
    if row is None:
        return None
    return {"id": row.draft_id, "version": row.version, "operator": row.operator,
            "saved_at": from_us(row.saved_us).isoformat(), "document": row.document}


def draft_digest(row: DraftRow) -> str:
    """The SHA-256 (hex) of what a draft's validation covered: its project, version, operator,
    nonce, document and kept metadata, as canonical JSON."""
    covered = {"project": row.project, "version": row.version, "operator": row.operator, "nonce": row.nonce,
               "document": row.document, "snapshot": row.snapshot}
    return hashlib.sha256(json.dumps(covered, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _source(version: int) -> str:
    return f"the control draft of v{version}"


def _kept(snapshots: SnapshotDir, version: int) -> dict[str, Any] | None:
    """Version ``version``'s ``[snapshot]`` table, read from its immutable file (None: it holds none)."""
    return split(parsed_version(snapshots, version))[1]


def _meta_text(meta: dict[str, Any] | None) -> str | None:
    return None if meta is None else json.dumps(meta, sort_keys=True, separators=(",", ":"))


def _validated(root: Path, snapshots: SnapshotDir, text: str, version: int, meta: dict[str, Any] | None,
               store: str | None) -> dict[str, Any]:
    """The parsed document of ``text`` after the credential scan (its text, comments included) and
    apply's validation with version ``version``'s metadata ``meta`` standing in for the project's files."""
    source = _source(version)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ApplyValidationRefused(source, [ProjectInvalid(source, f"not valid TOML: {exc}")]) from exc
    refuse_secret_material(doc)  # a field names where a credential sits better than a line does
    refuse_secret_text(text, source)
    validate_document(root, doc, source, store, None, AppliedSnapshot.read(version, meta))
    return doc


def save_draft(root: Path, snapshots: SnapshotDir, catalog: Catalog, *, text: str, version: int, operator: str,
               clock: Clock, store: str | None = None) -> DraftRow:
    """Validate ``text`` as an edit of applied version ``version`` and save it as the project's one
    draft (module docstring); the pointer does not move."""
    applied = snapshots.applied()
    if applied is None:
        raise StoreNotInitialized(snapshots.project, "its snapshot directory")
    if version != applied:
        raise ManifestVersionConflict(snapshots.project, version, applied,
                                      f"is not the applied version (v{applied}); load v{applied} and edit it again")
    meta = _kept(snapshots, version)
    _validated(root, snapshots, text, version, meta, store)
    row = DraftRow(snapshots.project, f"d{secrets.token_hex(8)}", version, operator, secrets.token_hex(16),
                   clock.now_us(), text, _meta_text(meta), "")
    row = replace(row, digest=draft_digest(row))
    catalog.save_draft(row)
    return row


def claim_draft(root: Path, snapshots: SnapshotDir, catalog: Catalog, draft_id: str, *,
                store: str | None = None, token: str | None = None) -> Claimed:
    """Claim the saved draft ``draft_id`` as the next version (module docstring). ``token``: the
    request's Admin credential, the capability a synced claim admits (``engine.control.synced``)."""
    synced = synced_claim(root, Offered(token=token))
    if synced is not None:  # the bucket's head first, as apply adopts it: a draft of an older version then conflicts
        synced.adopt_head(snapshots, store=store)
    row = catalog.draft(snapshots.project)
    if row is None:
        raise ControlDraftAbsent(snapshots.project)
    if row.draft_id != draft_id:
        raise ControlDraftAbsent(snapshots.project, f"no validated draft {draft_id!r} is saved (the saved one is "
                                                    f"{row.draft_id!r})")
    source = _source(row.version)
    if draft_digest(row) != row.digest:
        raise ApplyValidationRefused(source, [ProjectInvalid(source, "the saved draft was altered after it was "
                                                                     "validated; save it again")])
    meta = _kept(snapshots, row.version)  # regenerated from the immutable version the draft edits
    if _meta_text(meta) != row.snapshot:
        raise ApplyValidationRefused(source, [ManifestValueInvalid("[snapshot]", "tables", (
            f"the saved draft keeps metadata other than v{row.version} holds; save it again"))])
    doc = _validated(root, snapshots, row.document, row.version, meta, store)
    current = snapshots.applied()
    if current != row.version:  # checked before a claim too, so a stale draft leaves no claimed file behind
        raise ManifestVersionConflict(snapshots.project, row.version + 1, current or 0,
                                      f"was claimed by another apply (applied: v{current}); the draft edits "
                                      f"v{row.version}: load v{current} and edit it again")
    if normal_text(doc) == normal_text(split(parsed_version(snapshots, row.version))[0]):
        catalog.drop_draft(row.project, row.draft_id)
        return Claimed(row.version, row.version, False)
    if synced is not None:  # decided in the bucket first, as a synced apply is (surface.apply.version-race)
        version = synced.claim(snapshots, row.version, claimable_text(row.document, meta))
    else:
        version = claim_next(snapshots, row.version, row.document, meta)
    catalog.drop_draft(row.project, row.draft_id)
    return Claimed(version, row.version, True)
