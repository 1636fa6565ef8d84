"""The authority a synced import or apply holds before it claims: an Admin capability and an issuer
signing port (docs/control.md, "Synced control").

Implements ``surface.apply.synced-attestation`` (admission), ``surface.apply.attestation-unavailable``
and ``surface.apply.version-race`` on the synced path (:meth:`SyncedClaim.claim`: the bucket head's
conditional write decides a version; only a version won there is claimed locally).
In a project with ``[sync]`` (``engine.config.sync``), ``pipeline import`` and ``pipeline apply``
first admit:

- an **Admin capability**: the credential in ``CONTEXTFUL_TOKEN``, admitted for the audience
  ``control`` under the pinned issuer keys and holding an Admin grant over ``*``
  (``engine.control.admin.admit_admin``);
- an **issuer signing port** (``engine.control.receipts.SigningPort``): the private key of
  ``--signing-key PATH``, else of ``CONTEXTFUL_CONTROL_SIGNING_KEY``, whose public key is pinned
  (``[project] issuer_keys``, ``CONTEXTFUL_ISSUER_PUBKEY`` or the verb's ``--public-key``): a receipt
  signed by a key nobody pins is refused by every node that pulls it.

Lacking either, the verb raises ``ControlAttestationUnavailable`` naming what is missing, before
anything is read from the bucket or written anywhere: no version is claimed. The pins the verb
verifies a pulled head under (``surface.apply.adopt-before-claim``) are the pinned issuer keys and
its ``--public-key`` keys.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.engine.config.sync import SyncSpec
from contextful.engine.control.admin import admit_admin
from contextful.engine.control.credentials import Credential, IssuerKey, parse_public_key, pinned_issuers
from contextful.engine.control.receipts import KeySigner, SigningPort, sha256_hex, sign_receipt
from contextful.engine.control.snapshots import SnapshotDir, receipt_name
from contextful.engine.project import Project
from contextful.storage.errors import (
    ContextfulError,
    ControlAttestationUnavailable,
    ControlSnapshotUntrusted,
    ManifestInvalid,
    ManifestValueInvalid,
    ManifestVersionConflict,
)

if TYPE_CHECKING:
    from contextful.engine.control.adopt import Adoption
    from contextful.engine.control.bucket import BucketHead, ControlBucket, PushOutcome, Step

TOKEN_VARIABLE = "CONTEXTFUL_TOKEN"
SIGNING_KEY_VARIABLE = "CONTEXTFUL_CONTROL_SIGNING_KEY"


@dataclass(frozen=True)
class Offered:
    """What a caller offers a synced verb (each None: read from the environment)."""

    token: str | None = None
    """The Admin credential (default ``CONTEXTFUL_TOKEN``)."""
    signing_key: Path | None = None
    """The issuer's private key file (default ``CONTEXTFUL_CONTROL_SIGNING_KEY``)."""
    signer: SigningPort | None = None
    """A signing port in place of a key file (a library caller's own)."""
    public_keys: tuple[str, ...] = ()
    """The verb's ``--public-key`` pins (``ed25519:…``), beside the pinned issuer keys."""


@dataclass(frozen=True)
class Authority:
    """An admitted Admin capability and issuer signing port: what a synced claim signs with."""

    credential: Credential
    signer: SigningPort
    pins: tuple[IssuerKey, ...]
    """The keys a pulled head is verified under: the pinned issuer keys and the verb's ``--public-key``."""


def verb_pins(project: Project, public_keys: Sequence[str]) -> tuple[IssuerKey, ...]:
    """The pinned issuer keys and ``public_keys`` (``--public-key``; ``IssuerKeyInvalid`` for one that is not a key)."""
    given = tuple(parse_public_key(text, "--public-key") for text in public_keys)
    return pinned_issuers(project) + tuple(p for p in given if p not in pinned_issuers(project))


def admit(project: Project, offered: Offered, environ: Mapping[str, str] | None = None) -> Authority:
    """The authority ``offered`` proves for ``project``; ``ControlAttestationUnavailable`` naming what lacks."""
    env = os.environ if environ is None else environ
    token = offered.token if offered.token is not None else env.get(TOKEN_VARIABLE, "").strip()
    if not token:
        raise ControlAttestationUnavailable(project.name, f"no Admin capability: {TOKEN_VARIABLE} holds no control "
                                                          "credential (contextful key issue --audience control --admin)")
    try:
        pins = verb_pins(project, offered.public_keys)
        credential = admit_admin(token, pinned_issuers(project))
    except ContextfulError as exc:
        raise ControlAttestationUnavailable(project.name, f"the Admin capability is not admitted: {exc}") from exc
    signer = offered.signer or _key_signer(project, offered.signing_key, env)
    if not any(pin.text == signer.signer for pin in pins):
        raise ControlAttestationUnavailable(project.name, f"the signing key {signer.signer} is not a pinned issuer "
                                                          "key ([project] issuer_keys, CONTEXTFUL_ISSUER_PUBKEY or "
                                                          "--public-key)")
    return Authority(credential, signer, pins)


def _key_signer(project: Project, path: Path | None, env: Mapping[str, str]) -> SigningPort:
    named = path if path is not None else (Path(env[SIGNING_KEY_VARIABLE]) if env.get(SIGNING_KEY_VARIABLE) else None)
    if named is None:
        raise ControlAttestationUnavailable(project.name, f"no issuer signing key: name one with --signing-key or "
                                                          f"{SIGNING_KEY_VARIABLE}")
    try:
        return KeySigner.from_file(named)
    except ContextfulError as exc:
        raise ControlAttestationUnavailable(project.name, f"the issuer signing key cannot be used: {exc}") from exc


@dataclass(frozen=True)
class SyncedProject:
    """A project with ``[sync]``: its bucket, and the pins its pulled and pushed chains are verified under."""

    root: Path
    project: Project
    sync: SyncSpec
    pins: tuple[IssuerKey, ...]
    regions: tuple[str, ...] | None
    """This site's residency allow-set (``engine.control.residency.site_regions`` of the working
    document's ``[residency]``), which a push records (``surface.reside.site-regions``)."""

    @classmethod
    def at(cls, directory: str | Path, public_keys: Sequence[str] = ()) -> SyncedProject:
        """The project at ``directory``, which must declare ``[sync]`` (else ``ManifestValueInvalid``)."""
        from contextful.engine.config.control import read_control
        from contextful.engine.config.sync import read_sync
        from contextful.engine.project import locate_project

        root = locate_project(directory)
        sync = read_sync(root)
        project, _control = read_control(root)
        if sync is None:
            raise ManifestValueInvalid("the manifest", "sync", "is absent: declare [sync] bucket = "
                                                               "\"s3://bucket/prefix\" to push or pull its control")
        return cls(root, project, sync, verb_pins(project, public_keys), working_site_regions(root, project))

    def bucket(self) -> ControlBucket:
        from contextful.engine.control.bucket import ControlBucket

        return ControlBucket(self.sync.bucket, self.project.name)

    def push(self, snapshots: SnapshotDir, step: Step | None = None) -> PushOutcome:
        """Push the applied version, and the chain below it, to the bucket (``engine.control.bucket``)."""
        return self.bucket().push(snapshots, site=self.sync.site, regions=self.regions, pins=self.pins, step=step)

    def pull(self, snapshots: SnapshotDir, *, store: str | None = None, machine: str | None = None) -> Adoption:
        """Adopt the bucket head into ``snapshots`` when it descends from the local head: each receipt
        verified under the pins, the head's snapshot self-valid on this node (``engine.control.adopt``)."""
        bucket = self.bucket()
        self._refuse_diverged(bucket, bucket.head(), snapshots)  # the head this adoption reads, once
        return self._adopt(bucket, snapshots, store, machine)

    def adopt_head(self, snapshots: SnapshotDir, *, store: str | None = None, machine: str | None = None) -> int | None:
        """``surface.apply.adopt-before-claim``: over a snapshot directory holding no version, adopt the
        bucket's head (verified under the verb's pins, self-valid, whatever the working document
        declares); the version adopted (None: the bucket holds no head)."""
        bucket = self.bucket()
        if (head := bucket.head()) is None:
            return None
        self._refuse_diverged(bucket, head, snapshots)
        return self._adopt(bucket, snapshots, store, machine).installed

    def publish_pending(self, snapshots: SnapshotDir) -> None:
        """Push the applied version when the bucket head is below it (a claim whose push never
        happened, a node claiming by the older order): the chain is the bucket's before a claim."""
        head, applied = self.bucket().head(), snapshots.applied()
        if applied is not None and (head is None or head.version < applied):
            self.push(snapshots)

    def _refuse_diverged(self, bucket: ControlBucket, head: BucketHead | None, snapshots: SnapshotDir) -> None:
        """``ManifestVersionConflict`` naming the recovery when this node's applied chain and the
        bucket's part at a version both hold: a version this node claimed and never published, which
        another node published first (a node that claimed locally before publishing)."""
        local = snapshots.applied()
        if head is None or local is None:
            return
        at = min(head.version, local)
        mine = snapshots.receipt(at)
        if at == head.version:
            same = mine is not None and sha256_hex(mine) == head.receipt
        else:
            same = mine is not None and bucket.read(receipt_name(at)) == mine
        if not same:
            raise ManifestVersionConflict(self.project.name, at, head.version, DIVERGED.format(
                at=at, head=head.version, directory=snapshots.path))

    def _adopt(self, bucket: ControlBucket, snapshots: SnapshotDir, store: str | None,
               machine: str | None) -> Adoption:
        from contextful.engine.control.adopt import adopt, node_validation

        return adopt(bucket, snapshots, project=self.project.name, pins=self.pins, signed=True,
                     validate=node_validation(self.root, store=store, machine=machine))


DIVERGED = ("in {directory} is not the bucket's v{at} (the bucket head is v{head}): this node claimed it and "
            "never published it, and another node's v{at} was published first. A claimed file is never rewritten, "
            "so this directory cannot rejoin the bucket's chain: name an empty directory in [control] snapshot_dir "
            "and run `contextful pipeline import`, which adopts the bucket head; apply your edits again there")
"""What a node whose chain parted from the bucket's is told (docs/control.md, "Synced control")."""


@dataclass(frozen=True)
class SyncedClaim(SyncedProject):
    """A synced import's or apply's claim: its receipt signed through the admitted signing port."""

    signer: SigningPort | None = None

    def receipt_signer(self, snapshots: SnapshotDir, parent_version: int) -> Callable[[int, str], bytes]:
        """What signs a version claimed after ``parent_version`` (``engine.control.apply.claim_next``'s ``sign``)."""
        return functools.partial(self.sign, snapshots, parent_version=parent_version)

    def claim(self, snapshots: SnapshotDir, applied: int | None, content: str, step: Step | None = None) -> int:
        """Claim ``content`` as the version after ``applied`` (None: as v1), deciding it in the bucket
        (``surface.apply.version-race`` on the synced path): sign its receipt before anything is
        written, publish snapshot and receipt and win the bucket head's conditional write
        (``ControlBucket.publish``), and only then claim the same bytes here, the receipt beside the
        snapshot before the pointer advances (``surface.apply.receipt-file``). A lost publish raises
        ``ManifestVersionConflict`` having written nothing locally: the caller adopts the winner and
        reapplies onto it."""
        from contextful.engine.control.adopt import claim_once

        version = (applied or 0) + 1
        receipt = self.sign(snapshots, version, content, parent_version=applied)
        if step is not None:
            step("claim", version)
        self.bucket().publish(version, content.encode("utf-8"), receipt, parent=applied, site=self.sync.site,
                              regions=self.regions, pins=self.pins)
        snapshots.prepare()
        claim_once(lambda: snapshots.claim(version, content), snapshots.file(version), content.encode("utf-8"))
        claim_once(lambda: snapshots.claim_receipt(version, receipt), snapshots.path / receipt_name(version), receipt)
        if step is not None:
            step("advance", version)
        try:
            snapshots.advance(applied, version)
        except ManifestVersionConflict:
            if snapshots.applied() != version:  # another process of this node adopted it first: the same claim
                raise
        return version

    def sign(self, snapshots: SnapshotDir, version: int, content: str, parent_version: int | None = None) -> bytes:
        """The canonical bytes of the receipt of ``content`` claimed as ``version`` after
        ``parent_version`` (None: ``version`` is 1), signed before anything is written."""
        assert self.signer is not None
        parent = None
        if parent_version is not None:
            data = snapshots.receipt(parent_version)
            if data is None:
                raise ControlSnapshotUntrusted(str(snapshots.path / receipt_name(parent_version)),
                                               f"version {parent_version} holds no receipt; a synced claim "
                                               "descends from a signed version")
            parent = sha256_hex(data)
        return sign_receipt(self.signer, self.project.name, version, parent, content.encode("utf-8")).to_bytes()


def working_site_regions(root: Path, project: Project) -> tuple[str, ...] | None:
    """This site's residency allow-set: the working document's ``[residency]`` block, read alone."""
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.config.residency import parse_residency
    from contextful.engine.control.residency import site_regions
    from contextful.engine.project import MANIFEST, read_manifest_document

    residency, problems = parse_residency(read_manifest_document(root).get("residency", {}))
    if problems:
        raise ManifestInvalid(str(root / MANIFEST), problems)
    return site_regions(Manifest(root, project, residency=residency))


def push_control(directory: str | Path = ".", *, public_keys: Sequence[str] = ()) -> PushOutcome:
    """``contextful control push``: push the applied version, and the chain below it, to the ``[sync]``
    bucket, each receipt verified under the pins and ``public_keys`` before it is published."""
    synced = SyncedProject.at(directory, public_keys)
    return synced.push(_snapshots(synced))


def pull_control(directory: str | Path = ".", *, public_keys: Sequence[str] = (), store: str | None = None,
                 machine: str | None = None) -> Adoption:
    """``contextful control pull``: adopt the ``[sync]`` bucket's head when it descends from this node's
    applied version, verified under the pins and ``public_keys``."""
    synced = SyncedProject.at(directory, public_keys)
    return synced.pull(_snapshots(synced), store=store, machine=machine)


def _snapshots(synced: SyncedProject) -> SnapshotDir:
    from contextful.engine.control.apply import snapshot_dir

    return snapshot_dir(synced.root)
