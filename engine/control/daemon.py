"""``contextful pipeline serve``'s control loop: the trigger adapters and the daemon's drain.

Implements:

- ``surface.arm.trigger-select``: ``[control] trigger`` selects ``in-process`` (the default) or
  ``external``; under ``external`` serve answers ``POST /wake`` on its ``--http`` face
  (``engine.served.wake``) and runs no tick of its own.
- ``surface.arm.unknown-trigger``: any other value raises ``TriggerAdapterUnknown`` at startup, is
  logged, and serve downgrades onto no adapter: it serves its faces and fires nothing.
- ``surface.arm.trigger-face-missing``: ``external`` on a serve with no HTTP face raises
  ``TriggerFaceMissing`` at startup.
- ``surface.arm.tick-interval``: the in-process adapter evaluates the armed set every 500 ms
  (:data:`TICK_S`), measured on the plane's clock from the previous beat's start.
- ``surface.fire.daemon-drain``, ``daemon-drain-retry``: while it holds the cadence lease, the
  daemon drains the queue as a cycle does, beside its ticks, each drain starting 5 s
  (:data:`DRAIN_GAP_S`) after the previous one ends; a failed drain is logged, its deliveries stay
  queued, and the daemon keeps serving and drains again on its next pass.

Under ``external`` the loop still beats: it renews the cadence lease and reaps ended units (their
outcomes logged), it just evaluates nothing due.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from contextful.storage.errors import TriggerAdapterUnknown, TriggerFaceMissing

if TYPE_CHECKING:
    from contextful.engine.control.fire import ControlPlane

log = logging.getLogger(__name__)

TRIGGERS = ("in-process", "external")
TICK_S = 0.5
DRAIN_GAP_S = 5.0


def select_trigger(trigger: str, *, serves_http: bool, say: Callable[[str], None]) -> str | None:
    """The trigger adapter serve runs: ``in-process``, ``external``, or None (an unknown value,
    logged as ``TriggerAdapterUnknown``: no adapter). ``external`` with no HTTP face raises."""
    if trigger not in TRIGGERS:
        say(f"error: {TriggerAdapterUnknown(trigger, TRIGGERS)}")
        return None
    if trigger == "external" and not serves_http:
        raise TriggerFaceMissing()
    return trigger


class Daemon:
    """The beat of one serve process until ``stop`` is set."""

    def __init__(self, plane: ControlPlane, trigger: str | None, stop: threading.Event, *,
                 sleep: Callable[[float], object] | None = None, drain: bool = True,
                 say: Callable[[str], None] | None = None) -> None:
        self.plane = plane
        self.trigger = trigger
        self.stop = stop
        self.sleep = sleep or stop.wait
        self.drain = drain and trigger is not None
        self.say = say or log.info
        self.beats = 0
        self._failing: str | None = None

    def run(self) -> None:
        """Beat every :data:`TICK_S` of the plane's clock, drain beside, until ``stop``; then stop
        every unit in flight and give the lease back."""
        drainer = threading.Thread(target=self._drain_loop, name="contextful-drain", daemon=True) if self.drain else None
        if drainer is not None:
            drainer.start()
        try:
            while not self.stop.is_set():
                began = self.plane.clock.now_us()
                self.beat()
                left = TICK_S - (self.plane.clock.now_us() - began) / 1e6
                self.sleep(max(left, 0.0))
        finally:
            self.stop.set()
            if drainer is not None:
                drainer.join()
            self.plane.close()

    def beat(self) -> None:
        self.beats += 1
        try:
            if self.trigger == "in-process":
                self.plane.tick()
            elif self.trigger == "external":
                self.plane.keep()
        except Exception as exc:  # noqa: BLE001 - one bad beat (a catalog hiccup) must not end the daemon
            text = str(exc)
            if text != self._failing:  # once per distinct failure, not every 500 ms
                self.say(f"error: beat failed: {text}; serve keeps beating")
            self._failing = text
            return
        if self._failing is not None:
            self.say("beats recovered")
            self._failing = None

    def _drain_loop(self) -> None:
        while not self.stop.is_set():
            self.drain_once()
            self.sleep(DRAIN_GAP_S)

    def drain_once(self) -> None:
        """One drain pass, when this process holds the cadence lease and an applied version."""
        from contextful.engine.control.drain import drain_queues

        plane = self.plane
        if not plane.lease.held or plane.manifest is None:
            return
        try:
            store = plane.open_store()  # the drain's own handle: the beat keeps using the plane's
            try:
                result = drain_queues(store, plane.manifest)
            finally:
                store.close()
        except Exception as exc:  # noqa: BLE001 - daemon-drain-retry: logged, drained again next pass
            self.say(f"error: drain failed: {exc}; its deliveries stay queued")
            return
        if result.settled:
            self.say(f"drained {result.settled} queued batch(es)")
        for line in result.failures:
            self.say(f"error: drain: {line}; drained again on the next pass")
