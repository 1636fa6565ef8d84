"""The D1 profile's adapters: catalog, journal, awakeables, blobs and export state over a private Worker.

Decisions "d1-execution-state" and "run-substrate-storage" (run.journal.d1-profile): a deployment on
Cloudflare keeps its catalog, journal, awakeables and export state in D1 and its blob content in R2,
reached only through the Worker in ``worker/`` (``worker.js``; ``miniflare.mjs`` runs it locally,
``wrangler.toml`` deploys it). One module per port, each beside the client it speaks through:

- ``client``: the Worker's Python client (one D1 batch per transaction, conditional R2 puts);
- ``catalog``, ``journal``, ``awakeables``, ``blobs``, ``outbox``: the ports' D1 adapters.

docs/store.md, "The D1 profile".
"""
