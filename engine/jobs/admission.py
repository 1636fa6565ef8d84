"""A job child's side of its fire credential: admit it once at start, open the store within its reach.

Implements the child's half of ``surface.dispatch.fire-credential-lifetime`` ("the child admits it
once at start") and ``fire-reach``: :func:`open_fire_store` is how the process running one fire of
a job (``contextful job fire``, started by serve) opens its store. It reads ``CONTEXTFUL_TOKEN``
and verifies it ONCE, before the store opens, against the pins (``CONTEXTFUL_ISSUER_PUBKEY``,
else ``[project] issuer_keys``) and the audience (``CONTEXTFUL_AUDIENCE``, else the fire
audience): a bad, foreign or expired credential is ``CredentialUnadmitted`` / ``CredentialExpired``
and the fire reads nothing. The store then opens under the credential's reach
(``storage.reach``): every read and write beyond it is ``ReachRefused`` where the store does it.
The credential is not checked again while the fire runs: a fire that started in time finishes.

- A credential carrying ``grants`` is a fire credential: it must name this job
  (``sub = svc://job/<name>``), and its grants are the reach.
- A credential without ``grants`` (serve's own ``CONTEXTFUL_TOKEN``, passed on without
  ``--issuer-key``: ``fire-credential-inherited``) is an operator's: admitted, it limits nothing.
- No ``CONTEXTFUL_TOKEN`` at all (a person running ``job fire`` by hand): the store opens as any
  command's does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from contextful.engine.control.fire_credentials import (
    AUDIENCE_VARIABLE,
    FIRE_AUDIENCE,
    TOKEN_VARIABLE,
    fire_subject,
)
from contextful.storage.errors import CredentialUnadmitted
from contextful.storage.reach import Reach, grants_problem

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.storage.clock import Clock
    from contextful.storage.store import Store


def admitted_reach(job: JobSpec, manifest: Manifest, *, environ: Mapping[str, str] | None = None,
                   clock: Clock | None = None) -> Reach | None:
    """The reach the fire credential in ``environ`` admits ``job`` (None: no limit: no credential,
    or an operator's); CredentialUnadmitted (CredentialExpired) when it is not admitted."""
    from contextful.engine.control.credentials import pinned_issuers, verify

    env = os.environ if environ is None else environ
    token = env.get(TOKEN_VARIABLE, "").strip()
    if not token:
        return None
    audience = env.get(AUDIENCE_VARIABLE, "").strip() or FIRE_AUDIENCE
    credential = verify(token, pinned_issuers(manifest.project, env), audience, clock=clock)
    grants = credential.claims.get("grants")
    if grants is None:
        return None
    problem = grants_problem(grants)
    if problem is not None:
        raise CredentialUnadmitted(audience, problem)
    if credential.subject != fire_subject(job):
        raise CredentialUnadmitted(audience, f"the fire credential is {credential.subject!r}'s, not "
                                             f"{fire_subject(job)!r}'s")
    return Reach.from_grants(credential.subject, grants)


def open_fire_store(job: JobSpec, manifest: Manifest, store_url: str | None = None, *,
                    environ: Mapping[str, str] | None = None, clock: Clock | None = None) -> Store:
    """The store one fire of ``job`` works in: its credential admitted once, here, and the store
    opened within its reach (a writer's open: it creates the store when new) on ``clock``."""
    from contextful.engine.project import open_project_store

    reach = admitted_reach(job, manifest, environ=environ, clock=clock)
    return open_project_store(manifest.root, store_url, project=manifest.project, create=True, reach=reach,
                              clock=clock)
