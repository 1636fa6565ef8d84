"""A run's staging lease: the catalog knows a run is writing parts before its first part exists.

Collection (``storage.collect``) keeps the objects of a run holding a lease, however long it
stages: only a commit (which ends the lease in its own transaction), an abort, a lapsed lease or a
provably dead holder lets them become orphans. The lease renews as the run stages, so it lapses
only for a run that stopped making progress. A run that resumes after collection ended its lease
learns it at its next renewal (StagingLeaseLost) or at its commit (``AssertStaging``, checked in
the commit transaction), and lands nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from contextful.storage.errors import StagingLeaseLost
from contextful.storage.holders import default_holder

if TYPE_CHECKING:
    from contextful.storage.store import Store

log = logging.getLogger(__name__)

STAGING_LEASE_S = 3600.0
"""How long a staging run stays known to collection without staging anything new."""


class StagingLease:
    """Taken at construction; :meth:`renew` as the run stages; :meth:`end` when it gives up."""

    def __init__(self, store: Store, table: str, run_id: str, lease_s: float = STAGING_LEASE_S) -> None:
        self.store = store
        self.table = table
        self.run_id = run_id
        self.holder = default_holder()
        self._lease_us = int(lease_s * 1_000_000)
        now = store.clock.now_us()
        store.catalog.begin_staging(table, run_id, self.holder, now, self._lease_us)
        self.expires_us = now + self._lease_us

    def renew(self) -> None:
        """Extend the lease once half of it has run (one catalog write per half lease). A lease
        collection ended meanwhile raises StagingLeaseLost: the run stops before it stages or commits
        more (its commit would be refused anyway, ``AssertStaging``)."""
        now = self.store.clock.now_us()
        if now >= self.expires_us - self._lease_us // 2:
            if not self.store.catalog.renew_staging(self.table, self.run_id, now + self._lease_us):
                raise StagingLeaseLost(self.table, self.run_id)
            self.expires_us = now + self._lease_us

    def end(self) -> None:
        """Forget the run (after its objects are deleted); a failure leaves the lease to lapse."""
        try:
            self.store.catalog.end_staging(self.table, self.run_id)
        except Exception as exc:  # noqa: BLE001 - the lease lapses by itself; nothing of the run is left
            log.warning("run %s could not end its staging lease: %s", self.run_id, exc)
