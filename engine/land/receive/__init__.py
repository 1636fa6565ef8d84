"""The ``receive`` source: batches pushed over HTTP, spooled, and landed in groups behind one lock.

Implements the decisions "received-batches-spooled" (``run.land.receive-spool``,
``run.land.receive-group``) and "batch-key-answers" (``run.land.receive-batch-key``,
``run.land.receive-key-expired``). The modules, in the order a batch meets them:

- ``config``: the source's ``[pipeline.source.config]`` (``key_retention_secs`` required; the
  body bounds ``max_body_bytes`` and ``max_decoded_bytes``);
- ``writers``: writer keys, which admit a sender to the pipelines a key names;
- ``server``: the HTTP face (``POST /pipelines/<id>/batches``) and :class:`~.server.Receiver`, the
  flow of one batch: key check, decode alone, spool, wait for the land lock, answer;
- ``body``: the request body on disk, owner-only, gzip/zstd decoded within its bound;
- ``spool``: the per-pipeline queue directory — spooled members written synced — and the key index;
- ``group``: what the land lock's holder does — land spooled members as one run per touched table,
  under run ids fixed by the batch keys, replaying whatever already committed.

docs/receive.md is the user's reference.
"""
