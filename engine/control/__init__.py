"""The control plane: schedules, fires, dispatch, applied versions and their credentials.

It will hold one module per section of the control-plane spec (DESIGN.md, "Where the coming
capabilities live"). What is here now:

- ``engine.control.schedule``: the schedule grammar (``every <n><unit>`` or five-field UTC cron)
  and the instants a schedule admits (``surface.arm.grammar``, ``surface.arm.unreadable-schedule``);
- ``engine.control.arm``: the armed set, each entry's next fire from its history and the due
  entries of a tick in admission order (``surface.arm.*``, ``surface.dispatch.admission-order``);
- ``engine.control.credentials``: signed credentials (Ed25519 tokens) an operator issues with
  ``contextful key issue`` and a served route admits against an issuer public key pinned in
  configuration; the control plane's fire credentials reuse it.
"""
