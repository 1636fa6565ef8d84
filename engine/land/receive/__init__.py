"""The ``receive`` source: batches pushed over HTTP, spooled, and landed in groups behind one lock.

Implements the decisions "received-batches-spooled" (``run.land.receive-spool``,
``run.land.receive-group``) and "batch-key-answers" (``run.land.receive-batch-key``,
``run.land.receive-key-expired``). The modules, in the order a batch meets them:

- ``config``: the source's ``[pipeline.source.config]`` (``key_retention_secs`` required);
- ``server``: the HTTP face (``POST /pipelines/<id>/batches``) and :class:`~.server.Receiver`, the
  flow of one batch: key check, decode alone, spool, wait for the land lock, answer;
- ``spool``: the per-pipeline queue directory — spooled members written synced — and the key index;
- ``group``: what the land lock's holder does — land spooled members as one run per touched table,
  under run ids fixed by the batch keys, replaying whatever already committed.

docs/receive.md is the user's reference.
"""
