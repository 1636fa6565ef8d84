"""Everything ``contextful pipeline serve`` hosts for one project, on one served face or several.

- the receive source, when a ``[[pipeline]]`` has a source of kind ``receive`` (docs/receive.md);
- the Iceberg query gateway, when the manifest declares an ``[[export]]`` (docs/exports.md);
- the resume route of awakeables, when an issuer key is pinned (``[project] issuer_keys`` or
  ``CONTEXTFUL_ISSUER_PUBKEY``; docs/served.md);
- the control routes (``GET /control/document``, ``POST /control/draft``, ``POST /control/apply``;
  ``engine.served.control``) on the shared address, beside whatever else it serves: with no
  issuer key pinned they answer ``ConfigOwnerUnconfigured``;
- the connection routes (``POST /connections``, ``POST /connections/{id}/pause``,
  ``DELETE /connections/{id}``; ``engine.served.connections``) beside them, outside ``/control/*``;
- the operator console (``GET /console/``, ``engine.served.console_routes``; docs/console.md) on the
  shared address, when an issuer key is pinned: every reader of it proves a signed credential.

:func:`serve_project` serves each service on its own address when given one (``receive_address``,
``gateway_address``, ``awake_address``) and the others on the shared ``address``; a service with no address is not
served. Writer keys admit only receive routes and reader keys only the gateway's, wherever they
are served, and signed credentials only the resume route; separate addresses let a deployment
expose one and not the other.
:meth:`Served.shutdown` stops accepting, lets requests in flight answer, and closes the services.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.engine.served.face import SHUTDOWN_GRACE_S, ServedFace, bind_face, parse_address
from contextful.storage.errors import SpecInvalid

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.control.fire import ControlPlane
    from contextful.engine.export.gateway import Gateway
    from contextful.engine.land.decode import Decoder
    from contextful.engine.land.receive.server import ReceiveServer
    from contextful.engine.served.awake import AwakeService
    from contextful.engine.served.console_routes import ConsoleService
    from contextful.engine.served.control import ControlService
    from contextful.storage import Store

Address = str | tuple[str, int]


@dataclass
class Served:
    faces: dict[str, ServedFace]
    """Each face by what it serves: ``""`` for the shared address, else the service's name."""
    urls: dict[str, str]
    """Each served service (``receive``, ``gateway``, ``awake``) -> the URL it answers on."""
    receive: ReceiveServer | None
    gateway: Gateway | None
    awake: AwakeService | None = None
    control: ControlService | None = None
    console: ConsoleService | None = None

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
        if self.awake is not None:
            self.awake.close()
        if self.control is not None:
            self.control.close()


OPTIONS = {"": "--http", "receive": "--receive-http", "gateway": "--gateway-http", "awake": "--awake-http"}
"""Each address's option, as ``contextful pipeline serve`` spells it: what an address error names."""


def serve_project(manifest: Manifest, store_factory: Callable[[], Store], address: Address | None, *,
                  decoder: Decoder, queue_root: str | Path, receive_address: Address | None = None,
                  gateway_address: Address | None = None, awake_address: Address | None = None,
                  awake_store: Callable[[], Store] | None = None, wake: ControlPlane | None = None,
                  store_url: str | None = None) -> Served:
    """Serve the manifest's receive pipelines, its exports' query gateway, the resume route, the
    control routes and the console (see the module docstring). The resume route, the control routes
    and the console open their store with ``awake_store`` (default ``store_factory``); ``contextful
    pipeline serve`` passes one that never creates a store. ``store_url`` is the ``--store`` root a
    control draft's validation reads.

    Every address given is read first and every face bound before the store or the receive queues
    open, so an address that cannot be served (ArgumentInvalid, AddressInUse) leaves nothing behind.
    """
    from contextful.engine.control.credentials import pinned_issuers
    from contextful.engine.export.gateway import Gateway, gateway_routes
    from contextful.engine.land.receive.server import open_receivers
    from contextful.engine.served.awake import AwakeService, awake_routes
    from contextful.engine.served.connections import connection_routes
    from contextful.engine.served.console_routes import ConsoleService, console_routes
    from contextful.engine.served.control import ControlService, control_routes
    from contextful.engine.served.wake import wake_routes

    given = {"": address, "receive": receive_address, "gateway": gateway_address, "awake": awake_address,
             "wake": None, "console": None}
    for label, at in given.items():
        if at is not None:
            parse_address(at, OPTIONS[label])
    receiving = any(p.source.kind == "receive" for p in manifest.pipelines) and (receive_address or address) is not None
    gateway = Gateway(manifest) if manifest.exports and (gateway_address or address) is not None else None
    pins = pinned_issuers(manifest.project) if (awake_address or address) is not None else ()
    if awake_address is not None and not pins:
        raise SpecInvalid("nothing to serve on --awake-http: no issuer key is pinned ([project] issuer_keys or "
                          "CONTEXTFUL_ISSUER_PUBKEY; `contextful key generate` makes one)")
    awake = AwakeService(awake_store or store_factory, pins) if pins else None
    waking = wake is not None and address is not None  # the external trigger's route, on the shared face
    console = ConsoleService(manifest, awake_store or store_factory, pins) if pins and address is not None else None
    if not receiving and gateway is None and awake is None and not waking:
        raise SpecInvalid("nothing to serve: no [[pipeline]] of kind 'receive', [[export]] or pinned issuer key "
                          "has an address (--http, --receive-http, --gateway-http, --awake-http)")
    wanted: dict[str, list[str]] = {}  # face label -> the services it serves
    for name, serving in (("receive", receiving), ("gateway", gateway is not None), ("awake", awake is not None),
                          ("wake", waking), ("console", console is not None)):
        if serving:
            wanted.setdefault(name if given[name] is not None else "", []).append(name)
    control = (ControlService(manifest.root, manifest.project.name, awake_store or store_factory, pins,
                              store_url=store_url) if "" in wanted else None)
    faces: dict[str, ServedFace] = {}
    receive: ReceiveServer | None = None
    try:
        for label in wanted:
            at = given[label]
            assert at is not None, f"{label or 'the shared face'} is served only with an address"
            faces[label] = bind_face(at, OPTIONS[label])
        receive = open_receivers(store_factory, manifest, queue_root=queue_root, decoder=decoder) if receiving else None
        routes = {"receive": receive.routes() if receive else [], "gateway": gateway_routes(gateway) if gateway else [],
                  "awake": awake_routes(awake) if awake else [], "wake": wake_routes(wake) if waking and wake else [],
                  "control": control_routes(control) if control else [],
                  "connections": connection_routes(control) if control else [],
                  "console": console_routes(console) if console else []}
        urls: dict[str, str] = {}
        if control is not None:
            wanted[""] += ["control", "connections"]
        for label, names in wanted.items():
            faces[label].serve([route for name in names for route in routes[name]])
            urls.update(dict.fromkeys(names, faces[label].url))
    except BaseException:
        for face in faces.values():
            face.shutdown(0)
        if receive is not None:
            receive.close(0)
        raise
    if receive is not None:
        receive.start()
    return Served(faces, urls, receive, gateway, awake, control, console)
