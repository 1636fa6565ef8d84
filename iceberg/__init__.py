"""Iceberg export: hand-written create and overwrite commits through pyiceberg's catalog client,
one namespace per audience (decisions "iceberg-overwrite-commit" and "iceberg-audience").

The package depends on ``storage`` only; its modules arrive with the export work.
"""
