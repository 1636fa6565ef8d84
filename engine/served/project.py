"""Everything ``contextful pipeline serve --http`` hosts for one project, on one served face.

- the receive source, when a ``[[pipeline]]`` has a source of kind ``receive`` (docs/receive.md);
- the Iceberg query gateway, when the manifest declares an ``[[export]]`` (docs/exports.md).

:func:`serve_project` starts both on one address; :meth:`Served.shutdown` stops accepting, lets
requests in flight answer, and closes the services.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.served.face import SHUTDOWN_GRACE_S, Route, ServedFace, serve_face
from storage.errors import SpecInvalid

if TYPE_CHECKING:
    from engine.config.manifest import Manifest
    from engine.export.gateway import Gateway
    from engine.land.decode import Decoder
    from engine.land.receive.server import ReceiveServer
    from storage import Store


@dataclass
class Served:
    face: ServedFace
    receive: ReceiveServer | None
    gateway: Gateway | None

    @property
    def url(self) -> str:
        return self.face.url

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        idle = self.face.shutdown(grace_s)
        if self.receive is not None:
            self.receive.close(grace_s, idle=idle)


def serve_project(manifest: Manifest, store_factory: Callable[[], Store], address: str | tuple[str, int], *,
                  decoder: Decoder, queue_root: str | Path) -> Served:
    """Serve the manifest's receive pipelines and its exports' query gateway on ``address``."""
    from engine.export.gateway import Gateway, gateway_routes
    from engine.land.receive.server import open_receivers

    receive = None
    if any(p.source.kind == "receive" for p in manifest.pipelines):
        receive = open_receivers(store_factory, manifest, queue_root=queue_root, decoder=decoder)
    gateway = Gateway(manifest) if manifest.exports else None
    if receive is None and gateway is None:
        raise SpecInvalid("nothing to serve: no [[pipeline]] has a source of kind 'receive' and no [[export]] is "
                          "declared")
    routes: list[Route] = []
    if receive is not None:
        routes += receive.routes()
    if gateway is not None:
        routes += gateway_routes(gateway)

    def health() -> dict[str, Any]:
        doc: dict[str, Any] = receive.health() if receive is not None else {"pipelines": []}
        doc["gateway"] = gateway is not None
        return doc

    try:
        face = serve_face(address, routes, health)
    except BaseException:
        if receive is not None:
            receive.close(0)
        raise
    if receive is not None:
        receive.start()
    return Served(face, receive, gateway)
