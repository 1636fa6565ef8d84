"""The control plane: schedules, fires, dispatch, applied versions and their credentials.

It will hold one module per section of the control-plane spec (DESIGN.md, "Where the coming
capabilities live"). What is here now:

- ``engine.control.credentials``: signed credentials (Ed25519 tokens) an operator issues with
  ``contextful key issue`` and a served route admits against an issuer public key pinned in
  configuration; the control plane's fire credentials reuse it.
"""
