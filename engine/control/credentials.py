"""Signed credentials: Ed25519 tokens an operator issues and a served route admits.

Implements the credential half of ``run.suspend.resume-authenticates`` (decision
"awakeable-resumes-credentialed"): the resume route admits a request's credential, verified
against an issuer public key pinned in configuration, and passes its verified ``on_behalf_of`` on
as the caller subject. The control plane's fire credentials (``surface.dispatch.fire-credential*``:
``CONTEXTFUL_TOKEN`` admitted under ``CONTEXTFUL_ISSUER_PUBKEY`` and ``CONTEXTFUL_AUDIENCE``)
reuse this module: a fire credential is a token of this format carrying extra claims.

The token (docs/served.md shows it)::

    cfc1.<claims>.<signature>

- ``claims``: base64url (no padding) of the claims as canonical JSON (keys sorted, no whitespace,
  UTF-8): ``iss`` (the issuer key id), ``sub`` (who holds the credential), ``on_behalf_of`` (whom
  it acts for; the caller subject a route passes on), ``aud`` (what it admits, e.g. ``awake``),
  ``iat`` and ``exp`` (Unix seconds), ``jti`` (a random id), and any further claims an issuer adds
  (a fire credential's zone and grants);
- ``signature``: base64url (no padding) of the Ed25519 signature over the ASCII bytes
  ``cfc1.<claims>``.

A public key is spelled ``ed25519:<base64url of its 32 raw bytes>``; its key id is the first 16
hex digits of the SHA-256 of those bytes. A private key is a PKCS#8 PEM file of mode 0600, outside
the project (a private key never sits in the project; a group- or world-readable file is refused).

Verification reads nothing it has not authenticated: the signature is checked against each pinned
key (at most :data:`MAX_PINS`; OpenSSL's Ed25519 verification does not branch on secrets) before
the claims are parsed, and the verifying key's id must be the token's ``iss``. Then ``aud`` must be
the route's audience, ``iat`` at most :data:`CLOCK_SKEW_S` ahead of the clock and ``exp`` after it.
Every refusal is ``CredentialUnadmitted`` (``CredentialExpired`` for a passed ``exp``), a 401 whose
detail never echoes the token. The clock is injectable (``storage.clock``).

Pins (:func:`pinned_issuers`), first to last: ``CONTEXTFUL_ISSUER_PUBKEY`` (machine configuration:
one key or several, separated by commas or spaces; what the control plane hands a child), else the
manifest's ``[project] issuer_keys`` list. Public keys are not secrets: pinning one in the
manifest is how a project says whom it trusts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import (
    ArgumentInvalid,
    CredentialExpired,
    CredentialUnadmitted,
    IssuerKeyInvalid,
)
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

if TYPE_CHECKING:
    from contextful.engine.project import Project

FORMAT = "cfc1"
"""The token's first segment: the format's name and version."""
KEY_SPELLING = "ed25519:"
PIN_VARIABLE = "CONTEXTFUL_ISSUER_PUBKEY"
MAX_TOKEN_CHARS = 4096
"""A longer bearer token is refused before it is decoded."""
MAX_PINS = 16
CLOCK_SKEW_S = 60
"""How far ahead of this machine's clock a credential's ``iat`` may be (the issuer's clock drifts)."""
RESERVED_CLAIMS = ("iss", "sub", "on_behalf_of", "aud", "iat", "exp", "jti")
MAX_SUBJECT_CHARS = 256

_PUBLIC = re.compile(r"ed25519:([A-Za-z0-9_-]{43})")
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
_SUBJECT = re.compile(rf"[^\x00-\x1f\x7f]{{1,{MAX_SUBJECT_CHARS}}}")


@dataclass(frozen=True)
class IssuerKey:
    """A pinned issuer public key: its id, its spelling and the key itself."""

    key_id: str
    text: str
    """``ed25519:<base64url raw bytes>``, as pinned."""
    public: Ed25519PublicKey = field(compare=False, repr=False)


@dataclass(frozen=True)
class Credential:
    """A verified credential: who it names and what it admits."""

    issuer: str
    """The id of the pinned key that signed it (its ``iss``)."""
    subject: str
    """Who holds it (``sub``)."""
    on_behalf_of: str
    """Whom it acts for (``on_behalf_of``, else ``sub``): the caller subject a route passes on."""
    audience: str
    issued_at: int
    expires_at: int
    token_id: str
    claims: Mapping[str, Any] = field(compare=False, repr=False)
    """Every claim, the issuer's extra ones included."""


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Unpadded base64url; ValueError when it is not."""
    if not _SEGMENT.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:
        raise ValueError("not base64url") from exc


def key_id(raw_public: bytes) -> str:
    """The first 16 hex digits of the SHA-256 of a public key's raw bytes."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def issuer_key(public: Ed25519PublicKey) -> IssuerKey:
    """The pin of a public key."""
    raw = _raw(public)
    return IssuerKey(key_id(raw), KEY_SPELLING + b64url_encode(raw), public)


def public_key_problem(text: object) -> str | None:
    """Why ``text`` is not a public key spelled ``ed25519:<43 base64url characters>`` (None: it is)."""
    match = _PUBLIC.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return f"{text!r} is not spelled ed25519:<43 base64url characters>"
    try:
        raw = b64url_decode(match.group(1))
        Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return f"{text!r} does not decode to a 32-byte Ed25519 public key"
    return None


def parse_public_key(text: str, source: str) -> IssuerKey:
    """The pin spelled ``text``; IssuerKeyInvalid naming ``source`` (where it was read) else."""
    problem = public_key_problem(text)
    if problem is not None:
        raise IssuerKeyInvalid(source, problem)
    raw = b64url_decode(text[len(KEY_SPELLING):])
    return IssuerKey(key_id(raw), text, Ed25519PublicKey.from_public_bytes(raw))


def pinned_issuers(project: Project | None, environ: Mapping[str, str] | None = None) -> tuple[IssuerKey, ...]:
    """The issuer keys pinned here: ``CONTEXTFUL_ISSUER_PUBKEY`` when set, else ``[project] issuer_keys``."""
    env = os.environ if environ is None else environ
    variable = env.get(PIN_VARIABLE, "").strip()
    if variable:
        texts, source = re.split(r"[,\s]+", variable), PIN_VARIABLE
    else:
        texts, source = list(project.issuer_keys) if project is not None else [], "[project] issuer_keys"
    if len(texts) > MAX_PINS:
        raise IssuerKeyInvalid(source, f"{len(texts)} keys are pinned; pin at most {MAX_PINS}")
    return tuple(parse_public_key(text, source) for text in texts)


# --- private keys ---------------------------------------------------------------------------


def default_key_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where ``contextful key generate`` writes a private key by default: the user's configuration
    directory (``$XDG_CONFIG_HOME``, else ``~/.config``) under ``contextful/keys/``."""
    env = os.environ if environ is None else environ
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "contextful" / "keys"


def generate_key(path: Path | None = None) -> tuple[IssuerKey, Path]:
    """Write a new Ed25519 private key (PKCS#8 PEM, mode 0600, never over an existing file) at
    ``path`` (default: ``issuer-<key id>.pem`` under :func:`default_key_path`); its pin and path.

    A path inside a project (a directory at or above it holds contextful.toml) is refused, whether
    or not its folders exist yet, through symlinks too: a private key never sits in the project.
    """
    from contextful.engine.project import find_project

    private = Ed25519PrivateKey.generate()
    pin = issuer_key(private.public_key())
    target = path if path is not None else default_key_path() / f"issuer-{pin.key_id}.pem"
    target = target.expanduser().absolute()
    # Decide on where the key would land, not on the folders that exist now: the parent is created
    # below, so a missing folder inside the project is still the project. A non-strict resolve
    # follows every symlink of the nearest existing ancestor (a dangling one too, as mkdir and open
    # would) and keeps the missing tail, so find_project walks up from the real location.
    project = find_project(target.resolve(strict=False).parent)
    if project is not None:
        raise IssuerKeyInvalid(str(target), f"it is inside the project at {project}; a private key never sits in "
                                            "a project: write it elsewhere (--out) and pin only its public key")
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    try:
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise IssuerKeyInvalid(str(target), "a file is already there; a key is never overwritten: name another "
                                            "path with --out") from exc
    except OSError as exc:
        raise IssuerKeyInvalid(str(target), f"cannot write it: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    return pin, target


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path``; IssuerKeyInvalid when it cannot be read, is readable by
    others than its owner, or holds no unencrypted Ed25519 key."""
    source = str(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise IssuerKeyInvalid(source, f"cannot read it: {exc.strerror or exc}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IssuerKeyInvalid(source, f"others than its owner may read it (mode {stat.S_IMODE(mode):04o}); "
                                       f"chmod 600 {path}")
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IssuerKeyInvalid(source, f"it holds no unencrypted PEM private key ({exc})") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise IssuerKeyInvalid(source, f"it holds a {type(private).__name__}, not an Ed25519 key")
    return private


# --- issuing and verifying -------------------------------------------------------------------


def _text(name: str, value: str) -> str:
    if not isinstance(value, str) or not _SUBJECT.fullmatch(value):
        raise ArgumentInvalid(name, value, f"give 1 to {MAX_SUBJECT_CHARS} printable characters")
    return value


def issue(private: Ed25519PrivateKey, subject: str, audience: str, ttl_s: int, *, on_behalf_of: str | None = None,
          claims: Mapping[str, Any] | None = None, clock: Clock | None = None) -> str:
    """One signed credential for ``subject`` admitting ``audience`` for ``ttl_s`` seconds from now.

    ``on_behalf_of`` (default: ``subject``) is whom it acts for; ``claims`` adds the issuer's own
    claims (a name in :data:`RESERVED_CLAIMS` is ArgumentInvalid).
    """
    if ttl_s <= 0:
        raise ArgumentInvalid("ttl", ttl_s, "give a lifetime of one second or more")
    reserved = sorted(set(claims or {}) & set(RESERVED_CLAIMS))
    if reserved:
        raise ArgumentInvalid("claims", ", ".join(reserved), "these claims are the format's own")
    now_s = (clock or SystemClock()).now_us() // 1_000_000
    body = {**(claims or {}), "iss": issuer_key(private.public_key()).key_id, "sub": _text("subject", subject),
            "on_behalf_of": _text("on_behalf_of", on_behalf_of if on_behalf_of is not None else subject),
            "aud": _text("audience", audience), "iat": now_s, "exp": now_s + int(ttl_s),
            "jti": secrets.token_urlsafe(16)}
    signed = f"{FORMAT}.{b64url_encode(json.dumps(body, sort_keys=True, separators=(',', ':'), ensure_ascii=False).encode())}"
    return f"{signed}.{b64url_encode(private.sign(signed.encode('ascii')))}"


def _instant(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="seconds")


def verify(token: str, pins: Sequence[IssuerKey], audience: str, *, clock: Clock | None = None) -> Credential:
    """The credential ``token`` proves under ``pins`` for ``audience``; CredentialUnadmitted
    (CredentialExpired past its ``exp``) else. See the module docstring for the order of checks."""
    if not pins:
        raise CredentialUnadmitted(audience, "no issuer key is pinned here, so no credential is admitted")
    if len(token) > MAX_TOKEN_CHARS:
        raise CredentialUnadmitted(audience, f"the bearer token is longer than {MAX_TOKEN_CHARS} characters")
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != FORMAT:
        raise CredentialUnadmitted(audience, f"the bearer token is not a signed credential ({FORMAT}.<claims>.<signature>)")
    try:
        claims_bytes, signature = b64url_decode(parts[1]), b64url_decode(parts[2])
    except ValueError:
        raise CredentialUnadmitted(audience, "the bearer token's segments are not base64url") from None
    signed = f"{parts[0]}.{parts[1]}".encode("ascii")
    signer = next((pin for pin in pins if _signed_by(pin, signature, signed)), None)
    if signer is None:
        raise CredentialUnadmitted(audience, "the credential is signed by no issuer key pinned here")
    claims = _claims(claims_bytes, audience)
    if claims["iss"] != signer.key_id:
        raise CredentialUnadmitted(audience, f"the credential names issuer {claims['iss']!r} but key "
                                             f"{signer.key_id} signed it")
    if claims["aud"] != audience:
        raise CredentialUnadmitted(audience, f"the credential is for audience {claims['aud']!r}")
    now_s = (clock or SystemClock()).now_us() // 1_000_000
    if claims["iat"] > now_s + CLOCK_SKEW_S:
        raise CredentialUnadmitted(audience, f"the credential is issued at {_instant(claims['iat'])}, ahead of "
                                             f"this machine's clock ({_instant(now_s)})")
    if claims["exp"] <= now_s:
        raise CredentialExpired(audience, _instant(claims["exp"]))
    return Credential(signer.key_id, claims["sub"], claims.get("on_behalf_of") or claims["sub"], claims["aud"],
                      claims["iat"], claims["exp"], claims["jti"], claims)


def _signed_by(pin: IssuerKey, signature: bytes, signed: bytes) -> bool:
    try:
        pin.public.verify(signature, signed)
    except InvalidSignature:
        return False
    return True


def _claims(data: bytes, audience: str) -> dict[str, Any]:
    """The (authenticated) claims, each reserved one of its type; CredentialUnadmitted else."""
    try:
        claims = json.loads(data)
    except ValueError:
        claims = None
    if not isinstance(claims, dict):
        raise CredentialUnadmitted(audience, "the credential's claims are not a JSON object")
    types = {"iss": str, "sub": str, "aud": str, "iat": int, "exp": int, "jti": str}
    for name, kind in types.items():
        value = claims.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) or value == "":
            raise CredentialUnadmitted(audience, f"the credential's {name!r} claim is missing or not a {kind.__name__}")
    if not isinstance(claims.get("on_behalf_of", ""), str):
        raise CredentialUnadmitted(audience, "the credential's 'on_behalf_of' claim is not a string")
    return claims


def admit(authorization: str | None, pins: Sequence[IssuerKey], audience: str, *,
          clock: Clock | None = None) -> Credential:
    """The credential an ``Authorization: Bearer <token>`` header proves (:func:`verify`)."""
    if not authorization:
        raise CredentialUnadmitted(audience, "the request carries no Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise CredentialUnadmitted(audience, "the Authorization header is not 'Bearer <credential>'")
    return verify(token.strip(), pins, audience, clock=clock)
