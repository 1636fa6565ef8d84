"""The audience preflight (decision "iceberg-audience"): one credential, one namespace, per export.

A reader of an export runs outside the read face, so the grant applied at export time is the only
one it holds, and a catalog token reads every namespace of its warehouse. Hence each export
publishes for exactly one admitted credential, mapped to exactly one namespace (a catalog plus a
namespace name), and the mapping credential -> namespace is one-to-one
(``run.export-iceberg.audience``). :func:`shared_namespaces` finds every pair of exports breaking
it (``run.export-iceberg.namespace-shared``):

- one namespace under two credentials,
- one credential under two namespaces,
- one Iceberg table (catalog + namespace + table) written by two exports.

It runs when the manifest is parsed (so ``contextful pipeline validate`` reports it) and again
before any export run (:func:`preflight`). :func:`namespace_for` answers a reader's namespace from
its credential alone; a reader never names one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contextful.storage.errors import ExportNamespaceShared, ManifestValueInvalid

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.export.spec import CatalogSpec, ExportSpec


@dataclass(frozen=True)
class Audience:
    credential: str
    """The admitted credential (audience key)."""
    catalog: CatalogSpec
    """The catalog holding the namespace."""
    namespace: str
    """The one namespace the credential reads."""
    exports: tuple[str, ...]
    """The exports publishing into it."""


def shared_namespaces(exports: Sequence[ExportSpec]) -> list[ExportNamespaceShared]:
    """Every pair of exports sharing a namespace, a credential or a table (first pair per clash)."""
    found: list[ExportNamespaceShared] = []
    by_namespace: dict[tuple[object, str], ExportSpec] = {}
    by_credential: dict[str, ExportSpec] = {}
    by_table: dict[tuple[object, str, str], ExportSpec] = {}
    for spec in exports:  # bounded by the manifest's export count
        place = (spec.catalog.key, spec.namespace)
        first = by_table.setdefault((*place, spec.table), spec)
        if first is not spec:
            found.append(ExportNamespaceShared(first.name, spec.name, f"the Iceberg table {spec.identifier}"))
        first = by_namespace.setdefault(place, spec)
        if first.credential != spec.credential:
            found.append(ExportNamespaceShared(
                first.name, spec.name, f"the namespace {spec.namespace!r} under two credentials "
                f"({first.credential!r} and {spec.credential!r})"))
        first = by_credential.setdefault(spec.credential, spec)
        if (first.catalog.key, first.namespace) != place:
            found.append(ExportNamespaceShared(
                first.name, spec.name, f"the credential {spec.credential!r} under two namespaces "
                f"({first.namespace!r} and {spec.namespace!r}"
                + (", in different catalogs)" if first.catalog.key != spec.catalog.key else ")")))
    return found


def preflight(manifest: Manifest) -> dict[str, Audience]:
    """The credential -> namespace mapping; the first ExportNamespaceShared when it is not one-to-one."""
    found = shared_namespaces(manifest.exports)
    if found:
        raise found[0]
    audiences: dict[str, Audience] = {}
    for spec in manifest.exports:
        known = audiences.get(spec.credential)
        names = (known.exports if known else ()) + (spec.name,)
        audiences[spec.credential] = Audience(spec.credential, spec.catalog, spec.namespace, names)
    return audiences


def namespace_for(manifest: Manifest, credential: str) -> str | None:
    """The namespace a reader holding ``credential`` reads (None for a credential no export admits)."""
    audience = preflight(manifest).get(credential)
    return audience.namespace if audience else None


def template_problems(exports: Sequence[ExportSpec]) -> list[ManifestValueInvalid]:
    """Templates reading a table no export publishes into their entry's namespace."""
    published: dict[tuple[object, str], set[str]] = {}
    for spec in exports:
        published.setdefault((spec.catalog.key, spec.namespace), set()).add(spec.table)
    found = []
    for spec in exports:
        tables = published[(spec.catalog.key, spec.namespace)]
        for template in spec.templates.values():
            for table in template.tables:
                if table not in tables:
                    found.append(ManifestValueInvalid(
                        f"[[export]] {spec.name!r}", f"templates.{template.name}",
                        f"reads {table!r}, which no export publishes into the namespace {spec.namespace!r} "
                        f"(it holds {', '.join(sorted(tables))})"))
    return found


def warehouse_credentials(exports: Sequence[ExportSpec], spec: ExportSpec) -> set[str]:
    """Every credential publishing into ``spec``'s warehouse (one catalog token reads all of them)."""
    return {e.credential for e in exports if e.catalog.warehouse_key == spec.catalog.warehouse_key}


def caller_sql_warnings(exports: Sequence[ExportSpec]) -> list[str]:
    """Exports declaring ``caller_sql`` on a warehouse serving several audiences: the gateway will
    refuse their caller SQL (``run.export-iceberg.caller-sql``), so ``validate`` says so early."""
    found = []
    for spec in exports:
        audiences = warehouse_credentials(exports, spec)
        if spec.caller_sql and len(audiences) > 1:
            found.append(f"[[export]] {spec.name!r} declares caller_sql, but its warehouse serves "
                         f"{len(audiences)} credentials ({', '.join(sorted(audiences))}); the query gateway "
                         f"refuses its caller SQL and runs its templates only")
    return found
