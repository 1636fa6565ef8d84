"""Derive pipelines: the third tier of the data path (landing -> derive -> models).

A derive pipeline turns each row of a parent table (a unit: a document, an audio or video file, a
URL) into derived rows (passages) by running an engine on it, and keeps its output current as
parents change, paying only for the units that are outstanding (docs/derive.md).

- ``select``: the work set, an anti-join of parent rows against the output table under the
  current derivation key; parent scans streamed in bounded batches.
- ``keys``: derivation keys (lowercase hex SHA-256).
- ``emit``: passages and marker rows, and the output table's supersede rule.
- ``bind``: the machine configuration (``[derive.<name>]`` engine bindings).
- ``exec``: engine children (argv only, own process group, cleared environment, deadline, cap).
- ``tasks``: the host task registry.
- ``engines``: the built-in tasks' engines (transcribe, link_preview).
"""
