"""Adopting a pulled control head: verify the chain a control source presents, then install its
head into this node's snapshot directory (docs/control.md, "The control source").

Implements ``surface.reconcile.pulled-control``, ``issuer-pin`` and ``pulled-control-untrusted``,
and ``surface.reconcile.pointer-malformed`` for a source's pointer; the reconciler
(``engine.control.reconcile``), ``contextful control pull`` and adopt-before-claim all install
through :func:`adopt`.

A source presents the one layout of a control source (a snapshot directory, a control URL, a
bucket prefix) through :class:`ChainSource`::

    manifest@current     the pointer "<N>\\n"                      (absent: no applied version)
    manifest@v<N>.toml   version N's snapshot bytes
    receipt@v<N>.json    version N's signed receipt (a synced project's)

:func:`adopt` adopts the source's head N only when it descends from the local head L (None: the
node holds no version yet):

- signed (the project syncs): each receipt L+1..N is verified (``engine.control.receipts``) under
  the pinned issuer keys, for this project and its own version, its parent the digest of the
  receipt before it (the local ``receipt@v<L>.json``'s for L+1; ``-`` for v1), and the head's
  receipt over the head's snapshot bytes. Receipts are small: a cold node reads the chain from v1;
  it reads one snapshot, the head's.
- unsigned: the source's ``manifest@v<L>.toml`` must hold the local version L's bytes.

Then the head must be this project's (``[project] name``) and pass the engine's validation against
this node's declarations as apply runs it over the snapshot's own pipelines (``surface.apply.self-valid``;
:func:`node_validation`). Only then is anything written: ``manifest@v<N>.toml`` (and
``receipt@v<N>.json``) claimed exclusively as the bytes verified, and the pointer advanced from L
by compare-and-swap. A failure of trust raises ``ControlSnapshotUntrusted`` naming its reason and
writes nothing; a pointer that is not wholly a version ``ControlPointerMalformed``; a source that
cannot be read (or a snapshot that is not UTF-8 TOML) ``ControlSnapshotUnreadable``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from contextful.engine.control.receipts import parse_receipt, verify_receipt
from contextful.engine.control.snapshots import (
    POINTER,
    SnapshotDir,
    parse_pointer,
    receipt_name,
    version_name,
)
from contextful.storage.errors import (
    ApplyValidationRefused,
    ControlSnapshotUnreadable,
    ControlSnapshotUntrusted,
    ManifestInvalid,
    ManifestVersionConflict,
)

if TYPE_CHECKING:
    from contextful.engine.control.credentials import IssuerKey


class ChainSource(Protocol):
    """Where a chain is read from: files of the control-source layout by name."""

    location: str
    """Names the source in errors (a directory, a URL, a bucket prefix)."""

    def read(self, name: str) -> bytes | None:
        """The file ``name``'s bytes; None when it is absent; ``ControlSnapshotUnreadable`` on any
        other failure."""
        ...


Validate = Callable[[int, dict[str, Any], str], None]
"""Validates version N's parsed document (``[snapshot]`` table included) read at a location;
raises ``ManifestInvalid`` or ``ApplyValidationRefused`` when it does not validate here."""


@dataclass(frozen=True)
class Adoption:
    """What one :func:`adopt` found and did."""

    head: int | None
    """The source's head (None: it holds no applied version)."""
    local: int | None
    """The local head before (None: none)."""
    installed: int | None = None
    """The version installed and applied (None: nothing was adopted)."""
    verified: tuple[int, ...] = ()
    """The versions whose receipts were verified, ascending (empty when unsigned)."""

    def to_json(self) -> dict[str, Any]:
        return {"head": self.head, "local": self.local, "installed": self.installed, "verified": list(self.verified)}


def adopt(source: ChainSource, snapshots: SnapshotDir, *, project: str, pins: Sequence[IssuerKey], signed: bool,
          validate: Validate) -> Adoption:
    """Adopt ``source``'s head into ``snapshots`` when it descends from the local head (module docstring)."""
    head = _head(source)
    local = snapshots.applied()
    if head is None or (local is not None and head <= local):
        return Adoption(head, local)
    where = f"{source.location}/{version_name(head)}"
    data = source.read(version_name(head))
    if data is None:
        raise ControlSnapshotUnreadable(where, f"the pointer names v{head} and the source holds no "
                                               f"{version_name(head)}")
    verified: tuple[int, ...] = ()
    receipt: bytes | None = None
    if signed:
        verified, receipt = _verified_chain(source, snapshots, project, pins, local, head, data)
    elif local is not None:
        _same_as_local(source, snapshots, local)
    doc = _document(data, where)
    named = doc.get("project", {}).get("name") if isinstance(doc.get("project"), dict) else None
    if named != project:
        raise ControlSnapshotUntrusted(where, f"it is project {named!r}'s snapshot, not {project!r}'s")
    try:
        validate(head, doc, where)
    except (ManifestInvalid, ApplyValidationRefused) as exc:
        problems = "; ".join(str(p) for p in getattr(exc, "problems", ())) or exc.detail
        raise ControlSnapshotUntrusted(where, f"it does not validate against this node's declarations: "
                                              f"{problems}") from exc
    _install(snapshots, local, head, data, receipt)
    return Adoption(head, local, head, verified)


def node_validation(root: Path, *, store: str | None = None, machine: str | None = None) -> Validate:
    """The validation a pulled snapshot meets on the node at ``root``: the engine's whole validation,
    as apply runs it, over the snapshot's own pipelines with its own ``[snapshot]`` metadata."""
    from contextful.engine.config.applied import AppliedSnapshot, split
    from contextful.engine.config.validate import validated_manifest

    def validate(version: int, doc: dict[str, Any], where: str) -> None:
        declared, meta = split(doc)
        validated_manifest(root, declared, source=where, store=store, machine=machine,
                           applied=AppliedSnapshot.read(version, meta))

    return validate


def _head(source: ChainSource) -> int | None:
    body = source.read(POINTER)
    return None if body is None else parse_pointer(body, f"{source.location}/{POINTER}")


def _verified_chain(source: ChainSource, snapshots: SnapshotDir, project: str, pins: Sequence[IssuerKey],
                    local: int | None, head: int, snapshot: bytes) -> tuple[tuple[int, ...], bytes]:
    """Verify receipts ``local``+1..``head`` as one chain descending from the local head's receipt,
    the head's over ``snapshot``; the versions verified and the head receipt's bytes."""
    parent: str | None = None
    if local is not None:
        mine, where = snapshots.receipt(local), str(snapshots.path / receipt_name(local))
        if mine is None:
            raise ControlSnapshotUntrusted(where, f"the local head v{local} holds no receipt for a pulled chain to "
                                                  "descend from")
        parent = parse_receipt(mine, where).digest()
    data = b""
    for version in range(1 if local is None else local + 1, head + 1):
        where = f"{source.location}/{receipt_name(version)}"
        found = source.read(receipt_name(version))
        if found is None:
            raise ControlSnapshotUntrusted(where, f"the chain is broken: the source holds no receipt of v{version}")
        data = found
        receipt = parse_receipt(data, where)
        verify_receipt(receipt, pins, where, project=project, version=version, parent=parent,
                       snapshot=snapshot if version == head else None)
        parent = receipt.digest()
    return tuple(range(1 if local is None else local + 1, head + 1)), data


def _same_as_local(source: ChainSource, snapshots: SnapshotDir, local: int) -> None:
    """Unsigned descent: the source holds the local head's version as this node holds it."""
    where = f"{source.location}/{version_name(local)}"
    try:
        mine = snapshots.file(local).read_bytes()
    except OSError as exc:
        raise ControlSnapshotUnreadable(str(snapshots.file(local)), f"cannot be read: {exc}") from exc
    if source.read(version_name(local)) != mine:
        raise ControlSnapshotUntrusted(where, f"its head does not descend from the local head v{local}: the source's "
                                              f"v{local} is not this node's")


def _document(data: bytes, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ControlSnapshotUnreadable(where, f"the snapshot is not UTF-8 TOML: {exc}") from exc


def _install(snapshots: SnapshotDir, local: int | None, head: int, data: bytes, receipt: bytes | None) -> None:
    """Claim the head's files (the receipt first: a snapshot file never stands without its receipt)
    and advance the pointer from ``local``. Another adopter of the same head (two serves of one
    node) may have claimed a file or moved the pointer first: the same bytes, or the pointer at
    ``head``, is that adoption done; anything else is the race a local apply won."""
    snapshots.prepare()
    if receipt is not None:
        claim_once(lambda: snapshots.claim_receipt(head, receipt), snapshots.path / receipt_name(head), receipt)
    # ``data`` decoded as UTF-8 (``_document``): encoding the text again gives back the bytes verified
    claim_once(lambda: snapshots.claim(head, data.decode("utf-8")), snapshots.file(head), data)
    try:
        snapshots.advance(local, head)
    except ManifestVersionConflict:
        if snapshots.applied() != head:
            raise


def claim_once(claim: Callable[[], Path], path: Path, data: bytes) -> None:
    """Run ``claim``; a file already at ``path`` holding ``data`` is the same claim made before (an
    adopter of the same head, or a synced claim whose published version this node adopted first)."""
    try:
        claim()
    except ManifestVersionConflict:
        try:
            same = path.read_bytes() == data
        except OSError:
            same = False
        if not same:
            raise


def node_pins(root: Path, extra: Sequence[IssuerKey] = ()) -> tuple[IssuerKey, ...]:
    """The issuer keys a pulled receipt is verified under on the node at ``root`` (``issuer-pin``):
    its pinned issuers (``CONTEXTFUL_ISSUER_PUBKEY``, else ``[project] issuer_keys``) and ``extra``
    (a verb's ``--public-key``)."""
    from contextful.engine.config.control import read_control
    from contextful.engine.control.credentials import pinned_issuers

    project, _control = read_control(root)
    return (*pinned_issuers(project), *extra)
