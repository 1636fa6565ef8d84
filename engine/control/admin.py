"""The Admin capability: a signed credential that may edit, apply and sign the control document.

Implements the grant half of ``surface.apply.served-admin-grant`` and the capability
``surface.apply.synced-attestation`` admits (docs/control.md "Who may change the control document").

An Admin credential is a ``cfc1`` credential (``engine.control.credentials``) for the audience
:data:`AUDIENCE` carrying the claim ``"admin": ["*"]``: an Admin grant over ``*`` (every table and
tenant of the store). A credential that also carries a ``tenant`` claim is tenant-scoped and holds
no Admin grant over ``*``. A ``control`` credential without the claim is a **reader**: the console
shows it status and nothing it may change.

The console's attestation key (``surface.apply.operator-attestation``) rides in the claim
``console_key`` (``ed25519:<43 base64url>``): the issuer binds the operator to the key their browser
holds, so a mutation signed by that key is the operator's.

``contextful key issue --audience control --admin [--console-key ed25519:…]`` issues one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from contextful.engine.control.credentials import Credential, IssuerKey, public_key_problem, verify
from contextful.storage.clock import Clock
from contextful.storage.errors import ControlAdminGrantMissing

AUDIENCE = "control"
"""The audience of every control-plane credential (Admin and reader)."""
ADMIN_CLAIM = "admin"
TENANT_CLAIM = "tenant"
CONSOLE_KEY_CLAIM = "console_key"
EVERYTHING = "*"


def admin_claims(console_key: str | None = None) -> dict[str, Any]:
    """The extra claims of an Admin credential (an Admin grant over ``*``, and its console key)."""
    claims: dict[str, Any] = {ADMIN_CLAIM: [EVERYTHING]}
    if console_key is not None:
        claims[CONSOLE_KEY_CLAIM] = console_key
    return claims


def admin_grant_problem(claims: Mapping[str, Any]) -> str | None:
    """Why a credential with ``claims`` holds no Admin grant over ``*`` without a tenant scope (None: it does)."""
    if TENANT_CLAIM in claims:
        return f"it is scoped to tenant {claims[TENANT_CLAIM]!r}; an Admin grant is over '*' without a tenant scope"
    grant = claims.get(ADMIN_CLAIM)
    if not isinstance(grant, list) or EVERYTHING not in grant:
        return "it holds no Admin grant over '*'"
    return None


def is_admin(credential: Credential) -> bool:
    return admin_grant_problem(credential.claims) is None


def require_admin(credential: Credential) -> Credential:
    """``credential`` when it holds an Admin grant over ``*``; ``ControlAdminGrantMissing`` else."""
    problem = admin_grant_problem(credential.claims)
    if problem is not None:
        raise ControlAdminGrantMissing(credential.on_behalf_of, problem)
    return credential


def admit_admin(token: str, pins: Sequence[IssuerKey], *, clock: Clock | None = None) -> Credential:
    """The Admin credential ``token`` proves under ``pins``: ``CredentialUnadmitted`` when it is not a
    valid ``control`` credential, ``ControlAdminGrantMissing`` when it holds no Admin grant over ``*``."""
    return require_admin(verify(token, pins, AUDIENCE, clock=clock))


def console_key(credential: Credential) -> str | None:
    """The console key the credential binds its operator to (None: none, or not a public key)."""
    key = credential.claims.get(CONSOLE_KEY_CLAIM)
    return key if isinstance(key, str) and public_key_problem(key) is None else None
