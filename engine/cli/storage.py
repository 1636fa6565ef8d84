"""``contextful storage reconcile-guard``: an operator's release of a D1 callback guard.

Implements ``run.callback-guard.manual`` (decision "d1-execution-state"): apart from its holder's
release and a replay, a durable callback guard goes only through this command, which deletes it
and appends an audit row naming the token, the evidence and the operator in one D1 batch
(``storage.d1.guards.CallbackGuards.reconcile``). The binding is the D1 profile's
(``CONTEXTFUL_D1_URL``, ``CONTEXTFUL_D1_TOKEN``, ``CONTEXTFUL_D1_NAMESPACE``; docs/store.md).
"""

from __future__ import annotations

import click
from contextful.engine.cli.output import emit_json


@click.group("storage")
def storage() -> None:
    """Storage profile upkeep (the D1 profile's callback guards)."""


@storage.command("reconcile-guard")
@click.argument("token")
@click.option("--evidence", required=True, help="What shows the guarded callback's outcome (a receipt, a log).")
@click.option("--operator", required=True, help="Who decides; named in the audit row.")
@click.pass_context
def reconcile_guard(ctx: click.Context, token: str, evidence: str, operator: str) -> None:
    """Delete callback guard TOKEN and record the audit row naming it, EVIDENCE and OPERATOR."""
    from contextful.storage.clock import SystemClock
    from contextful.storage.d1.client import D1Binding
    from contextful.storage.d1.guards import CallbackGuards
    from contextful.storage.errors import StorageCapabilityMissing

    binding = D1Binding.from_environment()
    if binding is None:
        raise StorageCapabilityMissing("cloudflare-d1", (("CONTEXTFUL_D1_URL and CONTEXTFUL_D1_TOKEN (the Worker's "
                                                         "binding)"),))
    now_us = SystemClock().now_us()
    guard = CallbackGuards(binding.client()).reconcile(token, evidence, operator, now_us)
    if ctx.obj["json"]:
        emit_json({"token": guard.token, "execution": guard.execution_id, "attempt": guard.attempt,
                   "holder": guard.holder, "journal_entry": guard.journal_entry,
                   "idempotency_key": guard.idempotency_key, "evidence_class": guard.evidence_class(now_us),
                   "evidence": evidence, "operator": operator})
    else:
        click.echo(f"released callback guard {guard.token} of execution {guard.execution_id} (attempt "
                   f"{guard.attempt}, entry {guard.journal_entry}, {guard.evidence_class(now_us)}); audited: "
                   f"operator {operator}")
