"""``POST /wake``: the external trigger's route (``surface.arm.trigger-select``, ``wake-answer``).

Under ``[control] trigger = "external"`` serve runs no tick of its own; a caller (a platform's
scheduler, cron with curl) posts ``/wake`` and serve evaluates due-ness once through the cadence
lease, dispatches, and answers within 25 s (``engine.control.fire.ControlPlane.wake``)::

    {"fired": [...], "failed": [...], "pending": [...], "armed": 14, "next_due": "<RFC 3339 UTC>"}

plus ``unarmed`` and ``version``, and ``lease_held_by`` when another process holds the cadence
lease (then nothing fired). The body, if any, is ignored: a wake asks for nothing but a beat. The
route admits no credential: it exposes what is armed, never data, and starts only what is due anyway.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from contextful.engine.served.face import Exchange, Route

if TYPE_CHECKING:
    from contextful.engine.control.fire import ControlPlane

MAX_WAKE_BODY = 64 * 1024


def wake_routes(plane: ControlPlane) -> list[Route]:
    def post(exchange: Exchange, _match: re.Match[str]) -> None:
        exchange.read_body(MAX_WAKE_BODY, "a wake's body")
        exchange.send_json(200, plane.wake().to_json())

    return [Route("POST", re.compile(r"/wake"), post, "POST /wake")]
