"""Operator attestation: the console's signature that names the person behind an Admin mutation.

Implements ``surface.apply.operator-attestation`` (docs/served.md, "Control routes"). A shared store
capability cannot say who used the console, so every mutating ``/control/*`` request carries::

    Contextful-Attestation: v1;nonce=<32 lowercase hex>;iat=<unix seconds>;sig=<base64url, no padding>

``sig`` is the Ed25519 signature, by the key the Admin credential's ``console_key`` claim names
(``engine.control.admin``), over the UTF-8 message (:func:`attestation_message`)::

    contextful-console-v1\\n<operator>\\n<METHOD> <path>\\n<sha256 hex of the raw body>\\n<nonce>\\n<iat>\\n

where ``<operator>`` is the credential's verified ``on_behalf_of``. :func:`verify_attestation`
refuses with ``ControlOperatorAttestationInvalid`` (401) a missing or malformed header, a
credential binding no console key, a signature that does not verify over this operator, route and
body, an ``iat`` more than :data:`FRESH_S` seconds from the clock, and a nonce accepted before: the
nonce is taken last, in one conditional write of the store's catalog (``cf_control_nonces``), so it
is accepted once ever, across serve restarts and between serves sharing the store. The routes call
it before they read the document they would change.

    >>> message = attestation_message("dana", "POST", "/control/draft", b"{}", "0" * 32, 1_800_000_000)
    >>> message.decode().splitlines()[:3]
    ['contextful-console-v1', 'dana', 'POST /control/draft']
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from contextful.engine.control.admin import console_key
from contextful.engine.control.credentials import Credential, b64url_decode, parse_public_key
from contextful.storage.catalog import Catalog
from contextful.storage.clock import Clock
from contextful.storage.errors import ControlOperatorAttestationInvalid, IssuerKeyInvalid
from cryptography.exceptions import InvalidSignature

HEADER = "Contextful-Attestation"
CONTEXT = "contextful-console-v1"
FRESH_S = 60
"""How far (either way) an attestation's ``iat`` may be from this machine's clock."""
_HEADER = re.compile(r"v1;nonce=(?P<nonce>[0-9a-f]{32});iat=(?P<iat>0|[1-9][0-9]{0,11});"
                     r"sig=(?P<sig>[A-Za-z0-9_-]{86})")


@dataclass(frozen=True)
class Attestation:
    """A verified attestation: the operator it names and the nonce it spent."""

    operator: str
    nonce: str
    issued_at: int


def attestation_message(operator: str, method: str, path: str, body: bytes, nonce: str, iat: int) -> bytes:
    """The bytes a console signs for one request (the module docstring spells them)."""
    digest = hashlib.sha256(body).hexdigest()
    return f"{CONTEXT}\n{operator}\n{method} {path}\n{digest}\n{nonce}\n{iat}\n".encode()


def verify_attestation(header: str | None, credential: Credential, method: str, path: str, body: bytes, *,
                       catalog: Catalog, clock: Clock) -> Attestation:
    """The attestation ``header`` proves for this request by ``credential``'s operator, its nonce
    now spent; ``ControlOperatorAttestationInvalid`` naming why else (nothing spent)."""
    if not header:
        raise ControlOperatorAttestationInvalid(f"the request carries no {HEADER} header")
    found = _HEADER.fullmatch(header.strip())
    if found is None:
        raise ControlOperatorAttestationInvalid(f"the {HEADER} header is not "
                                                "'v1;nonce=<32 lowercase hex>;iat=<unix seconds>;sig=<base64url>'")
    key_text = console_key(credential)
    if key_text is None:
        raise ControlOperatorAttestationInvalid(f"the credential of {credential.on_behalf_of!r} binds no console key "
                                                "(issue it with --console-key)")
    try:
        public = parse_public_key(key_text, "console_key").public
        signature = b64url_decode(found.group("sig"))
    except (IssuerKeyInvalid, ValueError):
        raise ControlOperatorAttestationInvalid("the signature or the console key does not decode") from None
    nonce, iat = found.group("nonce"), int(found.group("iat"))
    operator = credential.on_behalf_of
    try:
        public.verify(signature, attestation_message(operator, method, path, body, nonce, iat))
    except InvalidSignature:
        raise ControlOperatorAttestationInvalid(f"the signature does not verify over operator {operator!r}, "
                                                f"{method} {path} and this body under the credential's console "
                                                "key") from None
    now_us = clock.now_us()
    if abs(now_us // 1_000_000 - iat) > FRESH_S:
        raise ControlOperatorAttestationInvalid(f"it was signed at {iat}, more than {FRESH_S} s from this "
                                                f"machine's clock ({now_us // 1_000_000})")
    if not catalog.accept_nonce(nonce, operator, now_us):
        raise ControlOperatorAttestationInvalid(f"nonce {nonce} was accepted before; sign each request anew")
    return Attestation(operator, nonce, iat)
