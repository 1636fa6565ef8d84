"""``contextful export rebuild <name> --namespace <epoch>``: a publication's full admitted state into a
fresh receiver namespace.

Implements the sender's half of ``run.export.group-rebuild`` (decision "coordinated-exports-activate";
docs/exports.md "Coordinated publications"): every producer's newest completion is read, and its
outputs at their completed frontiers — the full admitted state — are staged as ONE group in the
namespace ``epoch``: order 1, no predecessor, no delivered base, whatever the publication delivered
before (:func:`~.sender.export_group` with ``rebuild``). Nothing executes: no job fires, no body or
delegate is called; only completions and committed snapshots are read. The receiver keeps the
publication's active namespace until this group completes and then switches to ``epoch`` in the same
transaction (``engine.export.receiver``); later ``export group`` calls follow the rebuild's group in
``epoch``. An interrupted rebuild stays pending: the next ``export group`` (or the same rebuild)
resumes it, and a namespace the publication delivered into already is refused (``ArgumentInvalid``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from contextful.engine.export.publications.sender import GroupDelivery, Post, export_group
from contextful.storage.errors import ArgumentInvalid

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.store import Store

NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A namespace travels in the receiver's URL path (``GET /active/<namespace>``): no slash, no space."""


def export_rebuild(store: Store, manifest: Manifest, name: str, namespace: str, *,
                   post: Post | None = None) -> GroupDelivery:
    """Stage (or resume) and deliver publication ``name``'s rebuild into the fresh ``namespace``."""
    if not NAMESPACE.fullmatch(namespace):
        raise ArgumentInvalid("--namespace", namespace, "a namespace is letters, digits, '_', '.' and '-' "
                              "(starting with a letter or digit), at most 128 characters")
    return export_group(store, manifest, name, post=post, rebuild=namespace)
