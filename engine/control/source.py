"""The control source a node's ``[control]`` block configures, and whether it resolves
(``surface.fire.cycle-control-source``; docs/control.md, "The control source").

A node reads its applied versions from its control source: a snapshot directory (``[control]
snapshot_dir``) or a control URL (``[control] url``) serving ``manifest@current`` and each
``manifest@v<N>.toml`` directly beneath its path (``surface.reconcile.url-layout``). ``pipeline
serve --cycle`` runs once, from cron or CI, where nobody watches a log: a configured source that
does not resolve raises ``CycleControlSourceUnresolved`` naming it before anything is armed, rather
than a cycle answering "nothing due". A directory resolves when it exists; a URL when its host is a
loopback address (``surface.reconcile.loopback-only``) and its pointer answers 200 or 404 (no
applied version yet), fetched with no redirect followed and no proxy. The default snapshot
directory is no configured source: before the first import it is ``StoreNotInitialized``.
"""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from contextful.engine.control.snapshots import POINTER
from contextful.storage.errors import CycleControlSourceUnresolved

if TYPE_CHECKING:
    from contextful.engine.config.manifest import ControlSpec

ANSWER_TIMEOUT_S = 10.0
"""How long a control URL has to answer before it does not resolve."""


def resolve_source(control: ControlSpec) -> None:
    """Raise ``CycleControlSourceUnresolved`` when ``control`` configures a source that does not resolve."""
    if control.url is not None:
        _resolve_url(control.url)
    elif control.source is not None and control.snapshot_dir is not None and "://" not in control.snapshot_dir \
            and not Path(control.snapshot_dir).is_dir():
        raise CycleControlSourceUnresolved(f"[control] snapshot_dir {control.source!r}",
                                           f"no directory {control.snapshot_dir} exists")


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost`` or a loopback address)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None  # a 3xx is answered as it is: a poll follows no redirect


def _resolve_url(url: str) -> None:
    where = f"[control] url {url!r}"
    host = urlsplit(url).hostname or ""
    if not is_loopback(host):
        raise CycleControlSourceUnresolved(where, f"its host {host!r} is not a loopback address")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    try:
        with opener.open(f"{url}/{POINTER}", timeout=ANSWER_TIMEOUT_S) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CycleControlSourceUnresolved(where, f"it does not answer ({getattr(exc, 'reason', exc)})") from exc
    if status not in (200, 404):
        raise CycleControlSourceUnresolved(where, f"its pointer {POINTER} answered HTTP {status}")
