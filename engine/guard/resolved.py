"""Resolved secret values: masked back to the reference they came from.

A secret reference (``${secret:NAME}``, ``engine.config.secrets``) resolves to a value only in the
process that makes the request. That process remembers each value it resolved here, and
``mask_message`` (every error line, run record and log line the engine masks) shows the reference
text wherever the value would appear, whatever its shape: the catalogue's matchers
(``engine.guard.catalogue``) know credential families, this knows the project's own values.

    >>> remember("hunter2-token", "${secret:API_TOKEN}")
    >>> mask_resolved("401: token hunter2-token refused")
    '401: token ${secret:API_TOKEN} refused'
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_known: dict[str, str] = {}
"""Value -> the reference text shown in its place."""


def remember(value: str, reference: str) -> None:
    """Mask ``value`` as ``reference`` from now on in this process (an empty value masks nothing)."""
    if value:
        with _lock:
            _known[value] = reference


def mask_resolved(text: str) -> str:
    """``text`` with every remembered value replaced by its reference, longest value first."""
    with _lock:
        known = sorted(_known.items(), key=lambda item: -len(item[0]))
    for value, reference in known:  # bounded by the secrets a manifest references
        if value in text:
            text = text.replace(value, reference)
    return text
