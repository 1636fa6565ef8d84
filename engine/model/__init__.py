"""Models: ``[[model]]`` SQL built by DuckDB over pinned store snapshots and published as one
``replace`` commit on the model's store table (spec decisions "model-declared-sql" and
"minor-contract-bump"; docs/models.md).

``spec`` reads the block, ``contract`` compares a contract with the published build's, ``build``
runs builds in dependency order; holds live in ``storage.holds`` because collection reads them.
"""
