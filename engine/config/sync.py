"""The ``[sync]`` block: the bucket a project's applied versions are synced through (docs/control.md,
"Synced control").

Implements the configuration half of ``surface.apply.synced-attestation`` (a project with ``[sync]``
signs every version it claims) and of ``surface.reside.site-regions`` (``site`` names the pushing
site). ``bucket`` (required) is an ``s3://bucket/prefix`` URL reached as the corpus bucket is, with
the storage options of the environment (``CONTEXTFUL_S3_ENDPOINT_URL``, the AWS variables:
``storage.objects``); the control heads live under ``<bucket>/control/<project>/`` in the layout of
the snapshot directory (``engine.control.bucket``). ``site`` names this node's site in the bucket
head (default: the machine's host name). :func:`parse_sync` reads the block for
:func:`~contextful.engine.config.parse.parse_manifest`; :func:`read_sync` reads only ``[sync]`` of the
working document, as apply and push find the bucket whatever else it holds. The bucket is one of
the site's remote resources serve checks against ``[residency] regions``
(``surface.reside.region-mismatch``): :func:`sync_resources` is registered in
``engine.control.residency.RESOURCE_FINDERS``.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.control.residency import RESOURCE_FINDERS, Resource
from contextful.engine.project import MANIFEST, read_manifest_document
from contextful.storage.errors import (
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest

SYNC_KEYS = ("bucket", "site")
BUCKET_PROTOCOLS = ("s3",)
"""Where a control head can live: a bucket whose server decides a conditional write (If-Match, If-None-Match)."""
_SITE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class SyncSpec:
    """The ``[sync]`` block."""

    bucket: str
    """The bucket URL (``s3://bucket/prefix``, no trailing slash): the control heads live under
    ``<bucket>/control/<project>/``."""
    site: str
    """The site this node pushes as (``[sync] site``, default the host name): the bucket head records it
    beside the site's residency allow-set."""


def default_site() -> str:
    """The machine's host name, as a site name (its first label when it is not one)."""
    name = socket.gethostname().split(".")[0]
    return name if _SITE.fullmatch(name) else "site"


def parse_sync(block: Any) -> tuple[SyncSpec | None, list[ContextfulError]]:
    """The ``[sync]`` block (None: the manifest has none), with every problem in it."""
    if block is None:
        return None, []
    if not isinstance(block, dict):
        return None, [ManifestValueInvalid("the manifest", "sync", "must be a [sync] table")]
    problems: list[ContextfulError] = [ManifestKeyUnknown("[sync]", key, SYNC_KEYS) for key in block
                                       if key not in SYNC_KEYS]
    bucket = block.get("bucket")
    protocol, _, rest = bucket.partition("://") if isinstance(bucket, str) else ("", "", "")
    if bucket is None:
        problems.append(ManifestValueInvalid("[sync]", "bucket", "is required: the s3://bucket/prefix URL the "
                                                                 "control heads are synced through"))
    elif protocol not in BUCKET_PROTOCOLS or not rest.strip("/"):
        problems.append(ManifestValueInvalid("[sync]", "bucket", f"must be an s3://bucket/prefix URL, not {bucket!r}"))
    site = block.get("site", None)
    if site is not None and not (isinstance(site, str) and _SITE.fullmatch(site)):
        problems.append(ManifestValueInvalid("[sync]", "site", f"must be 1 to 63 letters, digits, '.', '_' or '-', "
                                                               f"not {site!r}"))
    if problems:
        return None, problems
    assert isinstance(bucket, str)
    return SyncSpec(bucket.rstrip("/"), site if isinstance(site, str) else default_site()), []


def read_sync(root: Path) -> SyncSpec | None:
    """The ``[sync]`` block of the working ``contextful.toml`` at ``root``, read alone (None: the project
    does not sync); ``ManifestInvalid`` lists the block's problems."""
    sync, problems = parse_sync(read_manifest_document(root).get("sync"))
    if problems:
        raise ManifestInvalid(str(root / MANIFEST), problems)
    return sync


def sync_resources(manifest: Manifest, store_url: str | None) -> list[Resource]:
    """The ``[sync]`` bucket, as a resource whose region residency gates (none without ``[sync]``)."""
    return [] if manifest.sync is None else [Resource("the [sync] bucket", manifest.sync.bucket)]


RESOURCE_FINDERS.append(sync_resources)
