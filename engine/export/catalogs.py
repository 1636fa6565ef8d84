"""pyiceberg catalogs for exports and the gateway: loading one from its ``CatalogSpec``, and
mapping a catalog that cannot be reached to the error catalogue (``CatalogUnavailable``).

A catalog whose database or endpoint refuses the connection (a bad host or port, a down server, a
locked or unreadable SQLite file) raises ``CatalogUnavailable`` naming the catalog; errors that
say something about a table (``NoSuchTableError`` ...) pass through for the caller to map.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import CatalogUnavailable, ContextfulError, first_line

if TYPE_CHECKING:
    from contextful.engine.export.spec import CatalogSpec
    from pyiceberg.catalog import Catalog


def load_catalog(spec: CatalogSpec) -> Catalog:
    """The pyiceberg catalog an export commits through; a local SQLite catalog gets its directory."""
    from pyiceberg.catalog import load_catalog as load

    if spec.uri.startswith("sqlite:///"):
        Path(spec.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return guard_catalog(spec, lambda: load(spec.name, **spec.pyiceberg_properties()))


def guard_catalog(spec: CatalogSpec, call: Callable[[], Any]) -> Any:
    """Run a catalog call, mapping a catalog that cannot be reached to CatalogUnavailable."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return call()
    except (NoSuchTableError, NoSuchNamespaceError, ContextfulError):
        raise
    except Exception as exc:
        if _unreachable(exc):
            raise CatalogUnavailable(f"Iceberg catalog {spec.name!r} ({spec.type})", first_line(exc)) from exc
        raise


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the catalog's database or endpoint cannot be reached."""
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"OperationalError", "InterfaceError", "ConnectionError", "Timeout", "ServerError",
                         "ServiceUnavailableError", "OSError"})


class CatalogCache:
    """pyiceberg catalogs by configuration, loaded once and shared across requests (thread-safe)."""

    def __init__(self, load: Callable[[CatalogSpec], Catalog] | None = None) -> None:
        self._load = load or load_catalog
        self._lock = threading.Lock()
        self._catalogs: dict[tuple[str, str, str, str | None], Catalog] = {}

    def get(self, spec: CatalogSpec) -> Catalog:
        with self._lock:
            catalog = self._catalogs.get(spec.key)
            if catalog is None:
                catalog = guard_catalog(spec, lambda: self._load(spec))
                self._catalogs[spec.key] = catalog
            return catalog
