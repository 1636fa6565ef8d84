"""Iceberg exports: the ``[[export]]`` block, the audience preflight, ``export run``/``status``
(issue 6; decisions "iceberg-overwrite-commit" and "iceberg-audience"; docs/exports.md).

- ``engine.export.spec``: ``ExportSpec``/``CatalogSpec`` and ``parse_export``.
- ``engine.export.preflight``: ``preflight``, ``shared_namespaces``, ``namespace_for``.
- ``engine.export.run``: ``run_exports``, ``export_status`` (imports pyiceberg; import it lazily).
"""

from engine.export.preflight import namespace_for, preflight

__all__ = ["namespace_for", "preflight"]
