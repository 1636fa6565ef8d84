"""The bucket side of synced control: the control head of a project in its ``[sync]`` bucket, and push.

Implements ``surface.apply.receipt-digest`` (the bucket head names its receipt's digest),
``surface.reside.site-regions`` (a push records the pushing site's residency allow-set and refuses
a differing one another site recorded) and the push half of ``surface.apply.synced-attestation``
(docs/control.md, "Synced control").

Layout under ``<bucket>/control/<project>/``, the snapshot directory's (``engine.control.snapshots``)::

    manifest@v<N>.toml   immutable, written once with put-if-absent (If-None-Match: *)
    receipt@v<N>.json    immutable, the receipt's RFC 8785 canonical bytes, put-if-absent
    manifest@current     the bucket head: the body "<N>\\n", and the user metadata
                         receipt = <sha256 hex of receipt@v<N>.json's bytes>
                         site    = <the pushing site's name>
                         regions = <JSON list of its residency allow-set> (absent: the site declares none)

The head is one object, so its version, receipt digest and residency record change together, and
only by a conditional PUT the server decides: ``If-None-Match: *`` for the first head,
``If-Match: <the ETag read>`` after (never a check and then a put). Of two pushers that read one
head, the server lets the first write and answers the second 412: the loser raises
``ManifestVersionConflict`` and nothing it pushed is overwritten.

:meth:`ControlBucket.push` walks the local chain from the bucket's head to the node's applied version,
verifies each receipt under the pins (signer pinned, signature, project, version, predecessor,
snapshot digest: a receipt altered after signing is never published), checks the residency record,
uploads each missing version and receipt with put-if-absent (an object of that name holding other
bytes is another site's claim: ``ManifestVersionConflict``), then advances the head.
:meth:`ControlBucket.publish` is a synced claim's compare-and-swap (``surface.apply.version-race``):
one new version as the head's successor, put-if-absent then the head's conditional write; finding
another push's version whole and signed above the head it advances the head to it first.
:meth:`ControlBucket.read` presents the layout to adoption (``engine.control.adopt``'s chain source):
the pointer as the version the head read names, and that version's receipt only when its digest is
the one the head names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contextful.engine.control.credentials import IssuerKey
from contextful.engine.control.receipts import parse_receipt, sha256_hex, verify_receipt
from contextful.engine.control.snapshots import (
    POINTER,
    SnapshotDir,
    parse_pointer,
    receipt_name,
    version_name,
)
from contextful.storage.errors import (
    ControlSnapshotUnreadable,
    ControlSnapshotUntrusted,
    ManifestVersionConflict,
    ResidencySitesDiverge,
    StoreNotInitialized,
)
from contextful.storage.objects import ObjectStore

HEAD = POINTER
CONTROL_PREFIX = "control"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_LOST = ("PreconditionFailed", "ConditionalRequestConflict")
"""What an S3-compatible server answers a conditional PUT whose condition another writer broke."""

Step = Callable[[str, int], None]
"""Called with ``("head", N)`` after a push read the head and verified its chain, before it uploads
anything: tests hold a pusher there to make a race happen deterministically."""


@dataclass(frozen=True)
class BucketHead:
    """The bucket head as one GET read it."""

    version: int
    receipt: str
    """The SHA-256 hex of the head version's receipt bytes (``surface.apply.receipt-digest``)."""
    site: str
    """The site that pushed it."""
    regions: tuple[str, ...] | None
    """That site's residency allow-set (None: it declared none)."""
    etag: str

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "receipt": self.receipt, "site": self.site,
                "regions": None if self.regions is None else list(self.regions)}


@dataclass(frozen=True)
class PushOutcome:
    """What a push did."""

    head: BucketHead
    """The bucket head after the push."""
    pushed: tuple[int, ...]
    """The versions this push made the head descend through (empty: the bucket was at the applied version)."""
    location: str

    def to_json(self) -> dict[str, Any]:
        return {"bucket": self.location, "head": self.head.to_json(), "pushed": list(self.pushed)}


class ControlBucket:
    """The control heads of ``project`` under ``bucket`` (``s3://bucket/prefix``), reached with the
    environment's storage options (``storage.objects``) unless ``storage_options`` are given."""

    def __init__(self, bucket: str, project: str, storage_options: dict[str, Any] | None = None) -> None:
        self.project = project
        self.objects = ObjectStore(f"{bucket.rstrip('/')}/{CONTROL_PREFIX}/{project}", storage_options, create=False)
        self.location = self.objects.url
        self._seen: BucketHead | None = None

    # --- reading -------------------------------------------------------------------------------

    def head(self) -> BucketHead | None:
        """The bucket head (None: nothing was pushed yet), read in one GET."""
        got = self._get(HEAD)
        if got is None:
            self._seen = None
            return None
        body, etag, meta = got
        where = f"{self.location}/{HEAD}"
        version = parse_pointer(body, where)
        receipt, site, regions = meta.get("receipt", ""), meta.get("site", ""), meta.get("regions")
        if not _DIGEST.fullmatch(receipt) or not site:
            raise ControlSnapshotUntrusted(where, "the bucket head names no receipt digest or no site")
        self._seen = BucketHead(version, receipt, site, _regions(regions, where), etag)
        return self._seen

    def read(self, name: str) -> bytes | None:
        """The object ``name`` of the layout (None: absent), as of the head last read: the pointer is
        that head's version, and its version's receipt must have the digest the head names."""
        head = self._seen
        if name == HEAD:
            return None if head is None else f"{head.version}\n".encode()
        data = self._get_bytes(name)
        if head is not None and data is not None and name == receipt_name(head.version) \
                and sha256_hex(data) != head.receipt:
            raise ControlSnapshotUntrusted(f"{self.location}/{name}", "its digest is not the one the bucket head names")
        return data

    # --- pushing -------------------------------------------------------------------------------

    def push(self, snapshots: SnapshotDir, *, site: str, regions: tuple[str, ...] | None,
             pins: Sequence[IssuerKey], step: Step | None = None) -> PushOutcome:
        """Push the node's applied version and the chain below it down to the bucket head; advance the head."""
        applied = snapshots.applied()
        if applied is None:
            raise StoreNotInitialized(self.project, str(snapshots.path))
        head = self._residency_checked(self.head(), site, regions)
        chain = self._chain(snapshots, applied, head, pins)
        if not chain:
            assert head is not None
            return PushOutcome(head, (), self.location)
        if step is not None:
            step("head", applied)
        for version, content, receipt in chain:
            self._put_once(version_name(version), content, version)
            self._put_once(receipt_name(version), receipt, version)
        digest = sha256_hex(chain[-1][2])
        self._advance(head, applied, digest, site, regions)
        return PushOutcome(BucketHead(applied, digest, site, regions, ""), tuple(v for v, _, _ in chain),
                           self.location)

    def publish(self, version: int, content: bytes, receipt: bytes, *, parent: int | None, site: str,
                regions: tuple[str, ...] | None, pins: Sequence[IssuerKey]) -> BucketHead:
        """Publish version ``version`` (its snapshot bytes and signed receipt) as the successor of the
        bucket head ``parent`` (None: the bucket holds no head): the compare-and-swap that decides a
        synced claim (``surface.apply.version-race``). Both objects are put-if-absent, then the head
        is advanced by its conditional write. ``ManifestVersionConflict`` when the head is not
        ``parent`` any more, when another push put an object of ``version`` with other bytes, or when
        the head moved meanwhile: nothing is overwritten, and the caller adopts the winner. Finding the
        other push's version whole (snapshot and a receipt verified under ``pins`` descending from the
        head) but the head not yet moved, it first advances the head to that version on its behalf, so
        a push that died between its objects and its head never wedges the bucket."""
        head = self._residency_checked(self.head(), site, regions)
        now = None if head is None else head.version
        if now != parent:
            raise ManifestVersionConflict(self.project, version, now or 0, f"was not published: the bucket head is "
                                          f"v{now or 0}, not v{parent or 0} it was claimed after; nothing was "
                                          "overwritten")
        try:
            self._put_once(version_name(version), content, version)
            self._put_once(receipt_name(version), receipt, version)
        except ManifestVersionConflict:
            self._roll_forward(head, version, pins, site, regions)
            raise
        digest = sha256_hex(receipt)
        self._advance(head, version, digest, site, regions)
        return BucketHead(version, digest, site, regions, "")

    def _roll_forward(self, head: BucketHead | None, version: int, pins: Sequence[IssuerKey], site: str,
                      regions: tuple[str, ...] | None) -> None:
        """Advance the head from ``head`` to another push's ``version`` when the bucket holds it whole
        and signed as ``head``'s successor; else leave the head as it is."""
        snapshot, receipt = self._get_bytes(version_name(version)), self._get_bytes(receipt_name(version))
        if snapshot is None or receipt is None:
            return  # that push is between its objects: its head write follows
        where = f"{self.location}/{receipt_name(version)}"
        try:
            verify_receipt(parse_receipt(receipt, where), pins, where, project=self.project, version=version,
                           parent=None if head is None else head.receipt, snapshot=snapshot)
            self._advance(head, version, sha256_hex(receipt), site, regions)
        except (ControlSnapshotUntrusted, ControlSnapshotUnreadable, ManifestVersionConflict):
            return  # not a successor this node trusts, or its own push advanced the head first

    def _residency_checked(self, head: BucketHead | None, site: str,
                           regions: tuple[str, ...] | None) -> BucketHead | None:
        """``head``, unless another site recorded a residency allow-set differing from ``regions``."""
        if head is not None and head.site != site and head.regions != regions:
            raise ResidencySitesDiverge(f"{self.location}/{HEAD} (pushed by site {head.site!r})", regions, head.regions)
        return head

    def _chain(self, snapshots: SnapshotDir, applied: int, head: BucketHead | None,
               pins: Sequence[IssuerKey]) -> list[tuple[int, bytes, bytes]]:
        """The local versions above the bucket head up to ``applied``, each verified, oldest first."""
        base = 0 if head is None else head.version
        if base > applied:
            raise ManifestVersionConflict(self.project, applied, base, f"is behind the bucket head v{base}; pull it "
                                          "(contextful control pull)")
        parent = None if head is None else self._local_receipt_digest(snapshots, head)
        chain = []
        for version in range(base + 1, applied + 1):
            content = snapshots.file(version).read_bytes()
            where = str(snapshots.path / receipt_name(version))
            data = snapshots.receipt(version)
            if data is None:
                raise ControlSnapshotUntrusted(where, f"version {version} holds no receipt; only signed versions "
                                                      "are pushed")
            verify_receipt(parse_receipt(data, where), pins, where, project=self.project, version=version,
                           parent=parent, snapshot=content)
            chain.append((version, content, data))
            parent = sha256_hex(data)
        return chain

    def _local_receipt_digest(self, snapshots: SnapshotDir, head: BucketHead) -> str:
        """The digest of this node's receipt of the head's version, which must be the head's: else the
        node's chain does not descend from the bucket's."""
        data = snapshots.receipt(head.version)
        if data is None or sha256_hex(data) != head.receipt:
            raise ManifestVersionConflict(self.project, head.version, head.version,
                                          "at the bucket head is not this node's: its chain "
                                          "does not descend from the bucket's; pull before applying (contextful "
                                          "control pull)")
        return head.receipt

    def _put_once(self, name: str, data: bytes, version: int) -> None:
        """Put ``name`` unless it is there; when it is, it must hold ``data`` (a push repeated), else it
        is another site's claim of ``version``."""
        if self.objects.put_if_absent(name, data):
            return
        if self.objects.get_bytes(name) != data:
            raise ManifestVersionConflict(self.project, version, version, f"is claimed in the bucket by another push "
                                          f"({name} holds other bytes); nothing was overwritten: pull, then apply "
                                          "again")

    def _advance(self, head: BucketHead | None, version: int, digest: str, site: str,
                 regions: tuple[str, ...] | None) -> None:
        """Write the head naming ``version`` if it is still ``head`` (a conditional PUT)."""
        self.objects.require_conditional_create()  # the server must decide conditions (probed once)
        meta = {"receipt": digest, "site": site}
        if regions is not None:
            meta["regions"] = json.dumps(list(regions), ensure_ascii=True, separators=(",", ":"))
        condition = {"IfNoneMatch": "*"} if head is None else {"IfMatch": head.etag}
        bucket, key, _ = self.objects.fs.split_path(self.objects.path(HEAD))
        try:
            self.objects.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=f"{version}\n".encode(),
                                    Metadata=meta, **condition)
        except OSError as exc:
            if not (_lost(exc) or (head is not None and isinstance(exc, FileNotFoundError))):
                raise
            now = self.head()  # a retried PUT that landed the first time reads as ours
            if now is not None and (now.version, now.receipt) == (version, digest):
                return
            raise ManifestVersionConflict(self.project, version, now.version if now else 0,
                                          f"was not pushed: another push moved the bucket head first (to v"
                                          f"{now.version if now else 0}); nothing was overwritten: pull, then apply "
                                          "again") from exc

    # --- object access -------------------------------------------------------------------------

    def _get(self, name: str) -> tuple[bytes, str, dict[str, str]] | None:
        """The body, ETag and user metadata of ``name`` in one GET (None: absent)."""
        import fsspec.asyn

        fs = self.objects.fs
        bucket, key, _ = fs.split_path(self.objects.path(name))

        async def get() -> tuple[bytes, str, dict[str, str]] | None:
            try:
                answer = await fs._call_s3("get_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            async with answer["Body"] as body:
                data = await body.read()
            return bytes(data), str(answer["ETag"]), dict(answer.get("Metadata") or {})

        try:
            return fsspec.asyn.sync(fs.loop, get)
        except OSError as exc:
            raise ControlSnapshotUnreadable(f"{self.location}/{name}", f"cannot be read: {exc}") from exc

    def _get_bytes(self, name: str) -> bytes | None:
        got = self._get(name)
        return None if got is None else got[0]


def _regions(text: str | None, where: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    try:
        regions = json.loads(text)
    except ValueError:
        regions = None
    if not isinstance(regions, list) or not all(isinstance(r, str) for r in regions):
        raise ControlSnapshotUntrusted(where, "the bucket head's residency record is not a list of regions")
    return tuple(regions)


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` is the server refusing a conditional PUT (412, or 409 for a concurrent one)."""
    if isinstance(exc, FileExistsError):
        return True
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code in _LOST or (isinstance(response, dict) and
                             response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412))
