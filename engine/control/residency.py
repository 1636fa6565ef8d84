"""Residency: the regions a site's configured resources resolve to, gated by its allow-set.

Implements ``surface.reside.region-mismatch`` (decision "residency divergence detected"; the
allow-set itself is ``engine.config.residency``): at startup, before anything is bound or armed,
``pipeline serve`` (the daemon and ``--cycle``) resolves the region of every remote resource it is
configured with — the store root when it is an ``s3://`` URL, the container profile's corpus bucket
(``CONTEXTFUL_CORPUS_BUCKET``), and any resource a later capability registers in
:data:`RESOURCE_FINDERS` (the ``[sync]`` bucket) — and a region outside ``[residency] regions``
raises ``EnforceRegionMismatch`` naming the resource and its region: the runtime serves nothing.
A resource whose region cannot be learned is refused the same way (its region reads
``unresolved``): a declared residency is enforced closed, never assumed.

A bucket's region is the one its provider reports (S3 ``GetBucketLocation``; an empty location is
``us-east-1``, the legacy ``EU`` is ``eu-west-1``). Local directories and the catalog database
carry no region the engine can learn; they are the site's own.

:func:`site_regions` is the allow-set a push records for ``surface.reside.site-regions``
(sorted; None without ``[residency]``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.storage.errors import EnforceRegionMismatch, first_line

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest

UNRESOLVED = "unresolved"


@dataclass(frozen=True)
class Resource:
    """A configured remote resource: what it is (for the error) and its URL."""

    what: str
    url: str


ResourceFinder = Callable[["Manifest", "str | None"], list[Resource]]


def site_regions(manifest: Manifest) -> tuple[str, ...] | None:
    """This site's residency allow-set, sorted (None: the manifest declares no ``[residency]``)."""
    regions = manifest.residency.regions
    return None if regions is None else tuple(sorted(regions))


def _store_resources(manifest: Manifest, store_url: str | None) -> list[Resource]:
    found: list[Resource] = []
    root = store_url or manifest.project.store
    if isinstance(root, str) and root.startswith(("s3://", "s3a://")):
        found.append(Resource("the store root", root))
    bucket = os.environ.get("CONTEXTFUL_CORPUS_BUCKET")
    if bucket and bucket.startswith(("s3://", "s3a://")) and bucket != root:
        found.append(Resource("the corpus bucket (CONTEXTFUL_CORPUS_BUCKET)", bucket))
    return found


RESOURCE_FINDERS: list[ResourceFinder] = [_store_resources]
"""What lists a site's remote resources; a capability configuring another appends its finder."""


def bucket_region(url: str) -> str:
    """The region the provider reports for the bucket of ``url`` (``s3://bucket/prefix``);
    :data:`UNRESOLVED` with the reason when it cannot be learned."""
    from contextful.storage.objects import ObjectStore

    store = ObjectStore(url, create=False)
    bucket = store.root.split("/", 1)[0]
    try:
        answer = store.fs.call_s3("get_bucket_location", Bucket=bucket)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the region unknown, and unknown is refused
        return f"{UNRESOLVED} ({first_line(exc)})"
    location = answer.get("LocationConstraint") or "us-east-1"
    return "eu-west-1" if location == "EU" else str(location)


def enforce_residency(manifest: Manifest, store_url: str | None = None) -> None:
    """Raise ``EnforceRegionMismatch`` when a configured resource resolves outside ``[residency] regions``."""
    allowed = manifest.residency.regions
    if allowed is None:
        return
    for finder in RESOURCE_FINDERS:
        for resource in finder(manifest, store_url):
            region = bucket_region(resource.url)
            if region not in allowed:
                raise EnforceRegionMismatch(f"{resource.what} {resource.url}", region, allowed)
