"""Publication holds: ``contextful export group`` holds its publication exclusively, a started serve unit
writing a publication's inputs holds it shared, behind one small port.

Implements the hold half of ``surface.dispatch.export-quiesced``, ``surface.dispatch.export-claim`` and
``surface.dispatch.export-claim-unread`` (seed-control-plane "dispatch"; docs/exports.md "Publication
holds"):

* an exporter takes the publication's EXCLUSIVE hold (:meth:`PublicationHolds.hold_exclusive`); the
  hold is writer-preferring: once it stands no new shared claim is admitted, and the exporter waits,
  with a deadline and a progress line, until no shared holder remains before it reads anything
  (:func:`exclusive_hold`);
* a serve unit claims every publication whose inputs it writes SHARED, all or none
  (:meth:`PublicationHolds.claim_shared`), from its start until it ends; a claim refused by a
  standing exclusive hold starts nothing (the unit stays due);
* every hold carries a lease, renewed while held (:class:`Renewer`): a holder SIGKILLed mid-hold
  blocks the others only until its lease expires.

Each adapter is a module beside this one (``holds_sqlite``: the local profile's catalog database),
picked by :func:`open_holds` from the store; D1's (the durable per-publication lease of
``run.export.group-d1-lease``) is an adapter beside it. A profile with no adapter (postgres:
publications are unsupported there) answers None: there is nothing to hold.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from contextful.storage.errors import ExecutionHeld
from contextful.storage.holders import default_holder, holder_is_dead

if TYPE_CHECKING:
    from contextful.storage.store import Store

log = logging.getLogger(__name__)

EXCLUSIVE = "exclusive"
SHARED = "shared"

LEASE_S = 30.0
"""How long a hold outlives its holder's last renewal (a SIGKILLed holder blocks others this long at most)."""
RENEW_S = LEASE_S / 3
"""How often a live holder renews."""
EXPORT_WAIT_S = 600.0
"""How long ``export group`` waits for the shared holders of its publication before giving up."""


@dataclass(frozen=True)
class Hold:
    """One standing hold on a publication."""

    publication: str
    holder: str
    """Who holds it: :func:`holder_id` (an exporter) or a serve unit's claim id."""
    mode: str
    """``exclusive`` or ``shared``."""
    version: int
    """Bumped at every take and renewal (an adapter may predicate writes on it: D1's group lease)."""
    expires_us: int
    """When it lapses unless renewed (microseconds since the epoch, the adapter's clock)."""


class PublicationHolds(Protocol):
    """Where publication holds persist."""

    def hold_exclusive(self, publication: str, holder: str, lease_s: float) -> Hold | None:
        """Take (or, for the same holder, renew) ``publication``'s exclusive hold. None while another
        holder's unexpired exclusive hold stands. Once taken, :meth:`claim_shared` admits no new shared
        claim on it; shared claims already standing stay until released or expired."""

    def claim_shared(self, publications: Sequence[str], holder: str, lease_s: float) -> tuple[Hold, ...]:
        """Claim every one of ``publications`` shared for ``holder``, all or none, in one transaction.
        Answers the unexpired exclusive holds that refused it (empty: every claim is taken)."""

    def shared_holders(self, publication: str) -> tuple[Hold, ...]:
        """The unexpired shared claims on ``publication``."""

    def renew(self, holder: str, lease_s: float) -> tuple[Hold, ...]:
        """Extend every unexpired hold of ``holder`` by ``lease_s`` from now; answers those renewed (a
        hold that expired, and perhaps passed to another holder, is not renewed)."""

    def release(self, holder: str) -> None:
        """Drop every hold of ``holder`` (none: nothing)."""


def open_holds(store: Store) -> PublicationHolds | None:
    """The store's holds adapter, by its catalog's profile (None: the profile keeps none)."""
    from contextful.storage.catalog.sqlite import SqliteCatalog

    if isinstance(store.catalog, SqliteCatalog) and store.container is None:
        from contextful.engine.export.publications.holds_sqlite import SqliteHolds

        return SqliteHolds(store.catalog.path)
    from contextful.storage.d1.catalog import D1Catalog

    if isinstance(store.catalog, D1Catalog):
        from contextful.engine.export.publications.d1 import D1Holds

        return D1Holds(store.catalog.client, store.clock)
    return None


def holder_id(kind: str) -> str:
    """A holder identity naming what holds, its host and process, unique per take; the parenthesized
    tail is the process's holder id (``storage.holders``), so :func:`holder_dead` can tell it died."""
    return f"{kind} pid {os.getpid()} on {socket.gethostname()} ({default_holder()})"


_PROCESS = re.compile(r"\(([^()\s]+)\)$")


def holder_dead(holder: str | None) -> bool:
    """Whether the process holding as ``holder`` is provably dead (same host and PID namespace, that
    process gone): an exclusive hold of a SIGKILLed exporter then holds nothing, as it did no work
    after it died. A shared claim of serve's is never taken over this way (its unit's child may
    outlive serve): it lapses with its lease."""
    if holder is None:
        return False
    found = _PROCESS.search(holder)
    return holder_is_dead(found.group(1) if found else holder)


class Renewer:
    """Renews ``holder``'s holds every :data:`RENEW_S` on a daemon thread until :meth:`stop`."""

    def __init__(self, holds: PublicationHolds, holder: str, lease_s: float = LEASE_S) -> None:
        self.holds, self.holder, self.lease_s = holds, holder, lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renew {holder}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(RENEW_S, self.lease_s / 3)):
            try:
                self.holds.renew(self.holder, self.lease_s)
            except Exception as exc:  # noqa: BLE001 — a failed renewal retries at the next beat; the lease bounds the rest
                log.warning("renewing the publication holds of %s failed (retried in %.0f s): %s", self.holder,
                            RENEW_S, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


Progress = Callable[[tuple[Hold, ...], float], None]
"""Told, while an exporter waits, the shared holders still standing and the seconds waited."""


@contextmanager
def exclusive_hold(holds: PublicationHolds | None, publication: str, *, deadline_s: float = EXPORT_WAIT_S,
                   progress: Progress | None = None, poll_s: float = 0.2) -> Iterator[Hold | None]:
    """Hold ``publication`` exclusively for the ``with`` body, released at its end (None: the
    profile keeps no holds). Waits for another exporter's exclusive hold, then (admitting no new
    shared claim) for every shared holder to end, up to ``deadline_s``; past it raises
    ``ExecutionHeld`` naming the holders (the ``held`` category: run it again once they end), having
    read nothing."""
    if holds is None:
        yield None
        return
    holder = holder_id(f"export group {publication}")
    start = time.monotonic()
    waited = threading.Event()
    renewer: Renewer | None = None
    try:
        while True:
            hold = holds.hold_exclusive(publication, holder, LEASE_S)
            standing = () if hold is None else holds.shared_holders(publication)
            if hold is not None and renewer is None:
                renewer = Renewer(holds, holder)
            if hold is not None and not standing:
                break
            elapsed = time.monotonic() - start
            if elapsed > deadline_s:
                who = ", ".join(h.holder for h in standing) or "another export group"
                until_us = max((h.expires_us for h in standing), default=int((time.time() + LEASE_S) * 1e6))
                raise ExecutionHeld(f"export group {publication}", f"publication {publication}", who, None, None,
                                    None, until_us)
            if progress is not None:
                progress(standing, elapsed)
            waited.wait(poll_s)
        yield hold
    finally:
        if renewer is not None:
            renewer.stop()
        try:
            holds.release(holder)
        except Exception as exc:  # noqa: BLE001 — the hold's lease ends it regardless
            log.warning("releasing %s's hold on publication %r failed (it lapses within %.0f s): %s", holder,
                        publication, LEASE_S, exc)


@contextmanager
def held(store: Store, publication: str, *, deadline_s: float = EXPORT_WAIT_S) -> Iterator[Hold | None]:
    """``contextful export group``'s hold: :func:`exclusive_hold` over the store's adapter, its
    progress line on stderr (once when the wait starts, then as the holders change or every 10 s)."""
    shown: list[tuple[tuple[str, ...], int]] = []

    def progress(standing: tuple[Hold, ...], elapsed: float) -> None:
        now = (tuple(h.holder for h in standing), int(elapsed // 10))
        if shown and shown[-1] == now:
            return
        shown.append(now)
        who = ", ".join(now[0]) or "another export group"
        print(f"{publication}: waiting for {who} to end before reading anything ({elapsed:.0f} s of "
              f"{deadline_s:.0f} s)", file=sys.stderr, flush=True)

    with exclusive_hold(open_holds(store), publication, deadline_s=deadline_s, progress=progress) as hold:
        yield hold
