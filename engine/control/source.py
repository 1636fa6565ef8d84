"""The control source a node's ``[control]`` block configures, how it is read, and whether it
resolves (``surface.fire.cycle-control-source``, ``surface.reconcile.url-layout``,
``surface.reconcile.loopback-only``; docs/control.md, "The control source").

A node reads its applied versions from its control source: a snapshot directory (``[control]
snapshot_dir``) or a control URL (``[control] url``) serving ``manifest@current`` and each
``manifest@v<N>.toml`` directly beneath its path (``surface.reconcile.url-layout``). ``pipeline
serve --cycle`` runs once, from cron or CI, where nobody watches a log: a configured source that
does not resolve raises ``CycleControlSourceUnresolved`` naming it before anything is armed, rather
than a cycle answering "nothing due". A directory resolves when it exists; a URL when its host is a
loopback address (``surface.reconcile.loopback-only``) and its pointer answers 200 or 404 (no
applied version yet), fetched with no redirect followed and no proxy. The default snapshot
directory is no configured source: before the first import it is ``StoreNotInitialized``.

Two :class:`~contextful.engine.control.adopt.ChainSource` adapters read the layout by name:
:class:`UrlSource` (a GET of ``<url>/<name>`` with no redirect followed and no proxy: 200 is the
file, 404 is absent, so a pointer answered 404 is no applied version, and any other status, a
refused connection or a timeout is ``ControlSnapshotUnreadable``; a host that is not a loopback
address is refused before anything is sent, ``ControlSourceNotLoopback``) and
:class:`DirectorySource` (a snapshot directory read as files).
"""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from contextful.engine.control.snapshots import POINTER
from contextful.storage.errors import (
    ControlSnapshotUnreadable,
    ControlSourceNotLoopback,
    CycleControlSourceUnresolved,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import ControlSpec

ANSWER_TIMEOUT_S = 10.0
"""How long a control URL has to answer before it does not resolve (or a read of it is unreadable)."""
MAX_FILE_BYTES = 64 * 1024 * 1024
"""A file of the layout longer than this is unreadable rather than held in memory."""


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


class UrlSource:
    """A control URL read as the layout: ``<url>/<name>`` over loopback HTTP."""

    def __init__(self, url: str) -> None:
        host = urlsplit(url).hostname or ""
        if not is_loopback(host):
            raise ControlSourceNotLoopback(url)
        self.location = url.rstrip("/")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())

    def status(self, name: str) -> int:
        """The HTTP status ``<url>/<name>`` answers; ``ControlSnapshotUnreadable`` when nothing answers."""
        return self._get(name)[0]

    def read(self, name: str) -> bytes | None:
        status, body = self._get(name)
        if status == 404:
            return None
        if status != 200:
            raise ControlSnapshotUnreadable(f"{self.location}/{name}", f"the control URL answered HTTP {status}")
        return body

    def _get(self, name: str) -> tuple[int, bytes]:
        where = f"{self.location}/{name}"
        try:
            with self._opener.open(where, timeout=ANSWER_TIMEOUT_S) as answer:
                body = answer.read(MAX_FILE_BYTES + 1)
                if len(body) > MAX_FILE_BYTES:
                    raise ControlSnapshotUnreadable(where, f"the answer is over {MAX_FILE_BYTES} bytes")
                return int(answer.status), body
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, b""
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ControlSnapshotUnreadable(where, f"it does not answer ({getattr(exc, 'reason', exc)})") from exc


class DirectorySource:
    """A snapshot directory read as the layout, its files by name."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.location = str(self.path)

    def read(self, name: str) -> bytes | None:
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ControlSnapshotUnreadable(str(self.path / name), f"cannot be read: {exc}") from exc


def _resolve_url(url: str) -> None:
    where = f"[control] url {url!r}"
    try:
        status = UrlSource(url).status(POINTER)
    except ControlSourceNotLoopback:
        host = urlsplit(url).hostname or ""
        raise CycleControlSourceUnresolved(where, f"its host {host!r} is not a loopback address") from None
    except ControlSnapshotUnreadable as exc:
        raise CycleControlSourceUnresolved(where, exc.reason) from exc
    if status not in (200, 404):
        raise CycleControlSourceUnresolved(where, f"its pointer {POINTER} answered HTTP {status}")
