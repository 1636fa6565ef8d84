"""Iceberg exports: the ``[[export]]`` block, the audience preflight, ``export run``/``status`` and
the query gateway (decisions "iceberg-overwrite-commit" and "iceberg-audience"; docs/exports.md).

- ``engine.export.spec``: ``ExportSpec``/``CatalogSpec``/``Template`` and ``parse_export``.
- ``engine.export.preflight``: ``preflight``, ``shared_namespaces``, ``namespace_for``,
  ``template_problems``, ``warehouse_credentials``.
- ``engine.export.catalogs``: ``load_catalog``, ``guard_catalog`` (CatalogUnavailable), ``CatalogCache``.
- ``engine.export.run``: ``run_exports``, ``export_status`` (pyiceberg only where a commit or a catalog
  read is needed: never at import, nor for a quick answer from the state file).
- ``engine.export.state``: the state file ``.contextful/exports/<name>.json`` and its ``TableView``.
- ``engine.export.pointer``: a SQL catalog's metadata pointer for an export table, read without pyiceberg.
- ``engine.export.readers``: reader keys — ``issue``, ``revoke``, ``list_keys``, ``admit``.
- ``engine.export.sql_shape``: whether a template or caller SQL may run, by an allow-list walk of
  DuckDB's parse tree (``sql_vocabulary``: the functions and types it admits).
- ``engine.export.gateway``: ``Gateway`` (admission, the refusals, running) and its HTTP routes.
- ``engine.export.query``: ``NamespaceReader``, DuckDB over a namespace's current snapshots, sealed.
"""

from contextful.engine.export.preflight import namespace_for, preflight

__all__ = ["namespace_for", "preflight"]
