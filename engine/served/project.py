"""Everything ``contextful pipeline serve`` hosts for one project, on one served face or several.

- the receive source, when a ``[[pipeline]]`` has a source of kind ``receive`` (docs/receive.md);
- the Iceberg query gateway, when the manifest declares an ``[[export]]`` (docs/exports.md).

:func:`serve_project` serves each service on its own address when given one (``receive_address``,
``gateway_address``) and the others on the shared ``address``; a service with no address is not
served. Writer keys admit only receive routes and reader keys only the gateway's, wherever they
are served; separate addresses let a deployment expose one and not the other.
:meth:`Served.shutdown` stops accepting, lets requests in flight answer, and closes the services.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.engine.served.face import SHUTDOWN_GRACE_S, Route, ServedFace, serve_face
from contextful.storage.errors import SpecInvalid

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.export.gateway import Gateway
    from contextful.engine.land.decode import Decoder
    from contextful.engine.land.receive.server import ReceiveServer
    from contextful.storage import Store

Address = str | tuple[str, int]


@dataclass
class Served:
    faces: dict[str, ServedFace]
    """Each face by what it serves: ``""`` for the shared address, else the service's name."""
    urls: dict[str, str]
    """Each served service (``receive``, ``gateway``) -> the URL it answers on."""
    receive: ReceiveServer | None
    gateway: Gateway | None

    @property
    def url(self) -> str:
        """The shared face's URL (the first face's when every service has its own)."""
        face = self.faces.get("") or next(iter(self.faces.values()))
        return face.url

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        idle = True
        for face in self.faces.values():  # every face stops, whether or not an earlier one went idle
            idle = face.shutdown(grace_s) and idle
        if self.receive is not None:
            self.receive.close(grace_s, idle=idle)


def serve_project(manifest: Manifest, store_factory: Callable[[], Store], address: Address | None, *,
                  decoder: Decoder, queue_root: str | Path, receive_address: Address | None = None,
                  gateway_address: Address | None = None) -> Served:
    """Serve the manifest's receive pipelines and its exports' query gateway (see the module docstring)."""
    from contextful.engine.export.gateway import Gateway, gateway_routes
    from contextful.engine.land.receive.server import open_receivers

    receive_at = receive_address or address
    gateway_at = gateway_address or address
    receiving = any(p.source.kind == "receive" for p in manifest.pipelines) and receive_at is not None
    gateway = Gateway(manifest) if manifest.exports and gateway_at is not None else None
    if not receiving and gateway is None:
        raise SpecInvalid("nothing to serve: no [[pipeline]] of kind 'receive' or [[export]] has an address "
                          "(--http, --receive-http, --gateway-http)")
    receive = open_receivers(store_factory, manifest, queue_root=queue_root, decoder=decoder) if receiving else None
    wanted: dict[str, tuple[Address, list[Route], list[str]]] = {}
    for name, own, routes in (("receive", receive_address, receive.routes() if receive else None),
                              ("gateway", gateway_address, gateway_routes(gateway) if gateway else None)):
        if routes is None:
            continue
        at = own or address
        assert at is not None, f"{name} is served only with an address"
        _, gathered, names = wanted.setdefault(name if own else "", (at, [], []))
        gathered += routes
        names.append(name)
    faces: dict[str, ServedFace] = {}
    urls: dict[str, str] = {}
    try:
        for label, (at, routes, names) in wanted.items():
            faces[label] = serve_face(at, routes)
            urls.update(dict.fromkeys(names, faces[label].url))
    except BaseException:
        for face in faces.values():
            face.shutdown(0)
        if receive is not None:
            receive.close(0)
        raise
    if receive is not None:
        receive.start()
    return Served(faces, urls, receive, gateway)
