"""Fire credentials: what serve gives each job child to admit (``surface.dispatch.fire-credential*``).

Under ``contextful pipeline serve --issuer-key PATH`` serve mints, per fire of a store-driven or
synthesize job, one cfc1 credential (``engine.control.credentials``):

- subject ``svc://job/<name>``, audience :data:`FIRE_AUDIENCE`, claims ``zone`` (the project's
  ``[project.zone] default``) and ``grants`` (:func:`fire_reach`: ``surface.dispatch.fire-reach``
  and ``fire-individual``);
- lifetime :data:`FIRE_LIFETIME_S`, or ``[project.zone] ceiling`` when lower
  (``fire-credential-lifetime``);
- delivered in the child's ``CONTEXTFUL_TOKEN``, with ``CONTEXTFUL_ISSUER_PUBKEY`` (the key's
  public spelling) and ``CONTEXTFUL_AUDIENCE`` replacing what serve inherited
  (``fire-credential-pins``). The private key reaches no child argument or variable.

Without ``--issuer-key`` a child inherits serve's environment, its ``CONTEXTFUL_TOKEN`` with it
(``fire-credential-inherited``). :func:`serve_fire_issuer` is serve's start check: an applied
version scheduling a store-driven or synthesize job with neither a key nor a token is
``FireCredentialMissing`` (``fire-credential-missing``); a key and no default zone is
``FireCredentialZoneUnset`` (``fire-credential-zone``). :func:`child_environment` is the one place
a child's environment is built; the launcher calls it per fire. The child's side (admit once at
start, open the store within the reach) is ``engine.jobs.admission``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.engine.control.credentials import PIN_VARIABLE, IssuerKey, issue, issuer_key, load_signing_key
from contextful.engine.project import MANIFEST
from contextful.storage.errors import FireCredentialMissing, FireCredentialZoneUnset, ManifestValueInvalid
from contextful.storage.reach import Reach

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.clock import Clock
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

TOKEN_VARIABLE = "CONTEXTFUL_TOKEN"
AUDIENCE_VARIABLE = "CONTEXTFUL_AUDIENCE"
FIRE_AUDIENCE = "store"
"""The issuance policy's default audience: what a fire credential admits (a job's store)."""
FIRE_LIFETIME_S = 600
FIRE_KINDS = ("store-driven", "synthesize")
"""The kinds whose fires carry a minted credential."""


def fire_subject(job: JobSpec) -> str:
    return f"svc://job/{job.name}"


def fire_reach(job: JobSpec) -> Reach:
    """``surface.dispatch.fire-reach`` and ``fire-individual``: a store-driven fire reads its
    statement's relations (DuckDB's parse of it) and writes its tables; a synthesize fire reads its
    source, target and entities and writes its target, reading individual rows of its source and
    target only under ``read_individual = true``. No other fire reaches anything."""
    read: set[str] = set()
    write: set[str] = set()
    individual: set[str] = set()
    if job.kind == "store-driven":
        from contextful.engine.model.spec import referenced_tables

        found = referenced_tables(job.statement or "")
        if isinstance(found, str):
            raise ManifestValueInvalid(f"[[job]] {job.name!r}", "statement", f"does not parse: {found}")
        read, write = set(found), set(job.tables)
    elif job.kind == "synthesize":
        read = {t for t in (job.source, job.entities, *job.target) if t}
        write = set(job.target)
        if job.read_individual:
            individual = {t for t in (job.source, *job.target) if t}
    return Reach.from_grants(fire_subject(job), {"read": read, "write": write, "read-individual": individual})


@dataclass(frozen=True)
class FireIssuer:
    """Serve's minting of fire credentials under ``--issuer-key``. The zone and the ceiling are read
    from the applied version each fire belongs to."""

    private: Ed25519PrivateKey = field(repr=False)
    clock: Clock | None = None

    @property
    def pin(self) -> IssuerKey:
        return issuer_key(self.private.public_key())

    def mint(self, job: JobSpec, manifest: Manifest) -> str:
        """One credential for a fire of ``job`` of ``manifest`` (``FireCredentialZoneUnset`` when its
        ``[project.zone]`` declares no default)."""
        project = manifest.project
        if project.default_zone is None:
            raise FireCredentialZoneUnset((job.name,), str(manifest.root / MANIFEST))
        lifetime = min(FIRE_LIFETIME_S, project.credential_ceiling_s or FIRE_LIFETIME_S)
        return issue(self.private, fire_subject(job), FIRE_AUDIENCE, lifetime,
                     claims={"zone": project.default_zone, "grants": fire_reach(job).grants()}, clock=self.clock)


def credentialed_jobs(manifest: Manifest) -> tuple[str, ...]:
    """The scheduled jobs of ``manifest`` whose fires carry a credential."""
    return tuple(job.name for job in manifest.jobs if job.kind in FIRE_KINDS and job.schedule is not None)


def check_fire_credentials(manifest: Manifest, issuer: FireIssuer | None, *, version: int | None = None,
                           environ: Mapping[str, str] | None = None) -> None:
    """``FireCredentialMissing`` / ``FireCredentialZoneUnset`` when serve (holding ``issuer``, or
    the ``CONTEXTFUL_TOKEN`` of ``environ``) cannot give each credentialed fire of ``manifest``
    (applied ``version``) a credential: at start, and before arming a newly applied version."""
    jobs = credentialed_jobs(manifest)
    if not jobs:
        return
    if issuer is None and not (os.environ if environ is None else environ).get(TOKEN_VARIABLE, "").strip():
        raise FireCredentialMissing(jobs, version)
    if issuer is not None and manifest.project.default_zone is None:
        raise FireCredentialZoneUnset(jobs, str(manifest.root / MANIFEST))


def serve_fire_issuer(manifest: Manifest, issuer_key_path: Path | None, *, version: int | None = None,
                      environ: Mapping[str, str] | None = None, clock: Clock | None = None) -> FireIssuer | None:
    """Serve's start check over its applied ``manifest`` (``version``), and its issuer under
    ``--issuer-key`` (None: children inherit serve's own ``CONTEXTFUL_TOKEN``)."""
    issuer = FireIssuer(load_signing_key(issuer_key_path), clock) if issuer_key_path is not None else None
    check_fire_credentials(manifest, issuer, version=version, environ=environ)
    return issuer


def child_environment(job: JobSpec | None, manifest: Manifest, issuer: FireIssuer | None,
                      environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of the child running one fire of ``job`` of ``manifest`` (None: a pipeline
    unit): serve's own, with a freshly minted credential and its pins in place of inherited ones
    when ``issuer`` mints for ``job``'s kind."""
    env = dict(os.environ if environ is None else environ)
    if issuer is not None and job is not None and job.kind in FIRE_KINDS:
        env[TOKEN_VARIABLE] = issuer.mint(job, manifest)
        env[PIN_VARIABLE] = issuer.pin.text
        env[AUDIENCE_VARIABLE] = FIRE_AUDIENCE
    return env


def unit_environment(manifest: Manifest | None, head: str, issuer: FireIssuer | None) -> dict[str, str] | None:
    """:func:`child_environment` for the unit ``head`` of ``manifest`` (``job:<name>`` names a job);
    None (inherit serve's environment) when serve mints nothing."""
    if issuer is None or manifest is None:
        return None
    job = next((j for j in manifest.jobs if head in (j.identity, j.name)), None)
    return child_environment(job, manifest, issuer)
