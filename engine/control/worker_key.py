"""The worker key: the HMAC every worker submission, heartbeat, callback and delegate call is signed with.

Implements the signing half of ``surface.dispatch.worker-key``, ``submit-signed`` and
``callback-skew``, and of ``surface.delegate.signed`` (decision "workers reach the orchestrator";
docs/control.md "Workers" and "Delegates").

The key is the text ``CONTEXTFUL_WORKER_KEY`` holds (at least :data:`MIN_KEY_CHARS` characters; its
UTF-8 bytes are the HMAC key), shared by serve, its workers and its delegates. A signed message is
HMAC-SHA256 over the UTF-8 bytes of::

    <kind>\\n<bound>\\n<timestamp>\\n

followed by the raw body, where ``kind`` names what is signed (``submit``, ``heartbeat``,
``callback``, ``call``, ``answer``), ``bound`` what the signature is bound to (a heartbeat's route,
an answer's request ``idempotency_key``; empty where the spec binds nothing) and ``timestamp`` the
signer's system clock in whole Unix seconds. It travels in two headers: :data:`TIMESTAMP_HEADER`
(the timestamp) and :data:`SIGNATURE_HEADER` (``v1=<lowercase hex>``). A verifier recomputes the
MAC, compares in constant time, and admits a timestamp within :data:`SKEW_S` of its own clock
(``surface.dispatch.callback-skew``: both sides' system clocks, ``surface.delegate.clocks``).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

KEY_VARIABLE = "CONTEXTFUL_WORKER_KEY"
MIN_KEY_CHARS = 32
SKEW_S = 300
"""``surface.dispatch.callback-skew``: how far a signed timestamp may be from the verifier's clock."""
TIMESTAMP_HEADER = "Contextful-Timestamp"
SIGNATURE_HEADER = "Contextful-Signature"
KINDS = ("submit", "heartbeat", "callback", "call", "answer")

_TIMESTAMP = re.compile(r"0|[1-9][0-9]{0,11}")
_SIGNATURE = re.compile(r"v1=([0-9a-f]{64})")


@dataclass(frozen=True)
class WorkerKey:
    """The shared worker key (never printed: its repr names only its length)."""

    secret: bytes

    def __repr__(self) -> str:
        return f"WorkerKey(<{len(self.secret)} bytes>)"

    def sign(self, kind: str, timestamp: int, body: bytes, bound: str = "") -> str:
        """The :data:`SIGNATURE_HEADER` value for ``body`` signed as ``kind`` at ``timestamp``."""
        return "v1=" + _mac(self.secret, kind, bound, timestamp, body)

    def headers(self, kind: str, timestamp: int, body: bytes, bound: str = "") -> dict[str, str]:
        """Both headers a signed request or answer carries."""
        return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: self.sign(kind, timestamp, body, bound)}

    def problem(self, kind: str, timestamp: str | None, signature: str | None, body: bytes, *, now_s: int,
                bound: str = "") -> str | None:
        """Why ``signature`` over ``body`` at ``timestamp`` is not this key's for ``kind`` within the skew
        (None: it is). The reason never quotes the signature."""
        if timestamp is None or signature is None:
            return f"it carries no {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header"
        if not _TIMESTAMP.fullmatch(timestamp.strip()):
            return f"its {TIMESTAMP_HEADER} is not whole Unix seconds"
        found = _SIGNATURE.fullmatch(signature.strip())
        if found is None:
            return f"its {SIGNATURE_HEADER} is not 'v1=<64 lowercase hex>'"
        stamp = int(timestamp)
        if not hmac.compare_digest(found.group(1), _mac(self.secret, kind, bound, stamp, body)):
            return f"its signature does not verify as a {kind} under the worker key"
        if abs(now_s - stamp) > SKEW_S:
            return f"its timestamp {stamp} is more than {SKEW_S} s from this clock ({now_s})"
        return None


def _mac(secret: bytes, kind: str, bound: str, timestamp: int, body: bytes) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown signed kind {kind!r}")
    if "\n" in bound:
        raise ValueError("a signature's bound value holds no line break")
    head = f"{kind}\n{bound}\n{timestamp}\n".encode()
    return hmac.new(secret, head + body, hashlib.sha256).hexdigest()


def worker_key_problem(text: str | None) -> str | None:
    """Why ``text`` cannot be the worker key (None: it can)."""
    if not text:
        return f"{KEY_VARIABLE} is not set"
    if len(text) < MIN_KEY_CHARS:
        return f"{KEY_VARIABLE} holds {len(text)} characters; a worker key holds at least {MIN_KEY_CHARS}"
    return None


def worker_key(environ: Mapping[str, str] | None = None) -> WorkerKey | None:
    """The worker key ``CONTEXTFUL_WORKER_KEY`` holds (None: unset or unusable; callers that need one
    refuse with their own error naming :func:`worker_key_problem`)."""
    text = (os.environ if environ is None else environ).get(KEY_VARIABLE)
    if worker_key_problem(text) is not None:
        return None
    assert text is not None
    return WorkerKey(text.encode("utf-8"))
