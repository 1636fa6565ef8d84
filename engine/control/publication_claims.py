"""Serve's publication claims: the pool's gate (``engine.control.dispatch.Gate``).

Implements, from the control-plane spec's "dispatch" section:

- ``surface.dispatch.export-quiesced``: before a due unit starts, serve claims shared every
  publication whose inputs it writes (``engine.control.publication_inputs``); while ``contextful
  export group`` holds one of them exclusively the claim is refused, so the unit starts nothing,
  stays due and reports pending (the log names the publication and its holder, once per hold).
- ``surface.dispatch.export-claim``: a started unit keeps its claims (renewed under their lease,
  ``engine.export.publications.holds``) until it ends, so an export of those publications waits
  for it.
- ``surface.dispatch.export-claim-unread``: a unit whose inputs cannot be computed claims every
  declared publication (logged); a unit whose claim cannot be taken (the holds store unreachable or
  erroring) starts nothing and stays due, the error logged.

The pool's half (no slot, no dispatch record for a deferred unit: ``export-deferred-slot``) is
``engine.control.dispatch.Pool.admit``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from contextful.engine.control.publication_inputs import UnitInputs, unit_inputs
from contextful.engine.export.publications.holds import LEASE_S, PublicationHolds, Renewer, holder_id

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest


class PublicationClaims:
    """Takes and drops the claims of serve's units over ``holds`` (None: the profile keeps no holds,
    so there is nothing to claim and every unit may start)."""

    def __init__(self, holds: PublicationHolds | None, manifest: Callable[[], Manifest | None],
                 members: Callable[[str], tuple[str, ...]], say: Callable[[str], None]) -> None:
        self.holds = holds
        self.manifest = manifest
        """The applied version's manifest, as armed now."""
        self.members = members
        """What one fire of a head runs (``ControlPlane.members``)."""
        self.say = say
        self._held: dict[str, tuple[str, Renewer]] = {}
        self._said: dict[str, str] = {}
        """The last line logged for each deferred head (a hold is named once, not every beat)."""
        self._lock = threading.Lock()
        self._inputs: tuple[Manifest | None, dict[str, UnitInputs]] = (None, {})
        """Each head's publication inputs, computed once per armed manifest."""

    def _note(self, head: str, line: str) -> None:
        if self._said.get(head) != line:
            self._said[head] = line
            self.say(line)

    def _inputs_of(self, manifest: Manifest, head: str) -> UnitInputs:
        armed, found = self._inputs
        if armed is not manifest:
            found = {}
            self._inputs = (manifest, found)
        if head not in found:
            found[head] = unit_inputs(manifest, self.members(head))
        return found[head]

    def claim(self, head: str) -> bool:
        manifest = self.manifest()
        if self.holds is None or manifest is None:
            return True
        inputs = self._inputs_of(manifest, head)
        if inputs.unreadable is not None:
            self._note(f"{head} inputs", f"{head}: its publication inputs cannot be computed ({inputs.unreadable}): "
                                         "it claims every declared publication")
        if not inputs.publications:
            return True
        holder = holder_id(f"serve unit {head}")
        try:
            refused = self.holds.claim_shared(inputs.publications, holder, LEASE_S)
        except Exception as exc:  # noqa: BLE001 — any failure to claim starts nothing; the unit stays due
            self._note(head, f"{head}: pending: error: its claim on publication(s) {', '.join(inputs.publications)} "
                             f"could not be taken, so it starts nothing and stays due: {exc}")
            return False
        if refused:
            held = "; ".join(f"publication {h.publication!r} by {h.holder}" for h in refused)
            self._note(head, f"{head}: pending: contextful export group holds {held}; it starts nothing and "
                             "stays due")
            return False
        self._said.pop(head, None)
        with self._lock:
            self._held[head] = (holder, Renewer(self.holds, holder))
        return True

    def release(self, head: str) -> None:
        with self._lock:
            entry = self._held.pop(head, None)
        if entry is None or self.holds is None:
            return
        holder, renewer = entry
        renewer.stop()
        try:
            self.holds.release(holder)
        except Exception as exc:  # noqa: BLE001 — the claim's lease ends it regardless
            self.say(f"{head}: warning: its publication claim could not be released (it lapses within "
                     f"{LEASE_S:.0f} s): {exc}")
