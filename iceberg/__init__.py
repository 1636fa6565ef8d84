"""Iceberg export: hand-written create, overwrite and snapshot-expiry commits through pyiceberg's
catalog client, one namespace per audience (decisions "iceberg-overwrite-commit" and "iceberg-audience").

The package depends on ``storage`` only. Modules:

- ``iceberg.commit``: ``export_table(catalog, identifier, data)`` replaces an Iceberg table's rows
  with one snapshot built by hand (``append`` on creation, ``overwrite`` after), committed through
  ``catalog.commit_table`` with explicit requirements, retried at most 3 times on a conflict;
  ``ExportResult`` says what landed.
- ``iceberg.outcome``: ``send_commit`` sends one commit and learns its outcome (reload, resend)
  before anything is deleted; ``CommitOutcomeUnknown`` when it cannot.
- ``iceberg.expire``: ``expire_snapshots(catalog, identifier, Retention(...))`` removes snapshots
  past retention through the catalog, then deletes the files only they referenced.
- ``iceberg.retention``: ``Retention`` and the rule it applies (``past_retention_ids``), free of
  pyiceberg, so an unchanged export learns nothing expires without loading it.
- ``iceberg.files``: Arrow batches -> Parquet data files with field ids and column statistics.
- ``iceberg.schema``: Arrow schema -> Iceberg schema, nested types included.

The ``[[export]]`` block, ``contextful export run|status`` and the audience preflight live in
``engine.export``; the query gateway comes next (docs/exports.md). Nothing is imported here, so
importing the package stays cheap.
"""
