"""``contextful key generate|public|issue``: the operator's issuer keys and the signed credentials
they issue (``engine.control.credentials``, docs/served.md).

``generate`` writes an Ed25519 private key (mode 0600, outside any project) and prints its public
key, the pin a project or machine configures; ``public`` prints that pin again from the private key;
``issue`` prints one signed credential. None of them opens a project or a store. (The gateway's
reader keys are ``contextful export key``; the receive routes' writer keys ``contextful pipeline key``.)
"""

from __future__ import annotations

from pathlib import Path

import click
from contextful.engine.cli.output import emit_json
from contextful.engine.cli.values import duration_seconds

_KEY_FILE = click.Path(dir_okay=False, path_type=Path)


@click.group("key")
def key() -> None:
    """Issuer keys and the signed credentials they issue (the resume route's, docs/served.md)."""


@key.command("generate")
@click.option("--out", type=_KEY_FILE, default=None,
              help="Where to write the private key (default: issuer-<key id>.pem under "
                   "$XDG_CONFIG_HOME/contextful/keys, else ~/.config/contextful/keys). Never inside a project.")
@click.pass_context
def key_generate(ctx: click.Context, out: Path | None) -> None:
    """Write a new Ed25519 issuer key (mode 0600) and print its public key, the pin to configure."""
    from contextful.engine.control.credentials import generate_key

    pin, path = generate_key(out)
    if ctx.obj["json"]:
        emit_json({"key_id": pin.key_id, "public_key": pin.text, "private_key": str(path)})
        return
    click.echo(pin.text)
    click.echo(f"issuer key {pin.key_id}: private key written to {path} (mode 0600; keep it off the project). "
               f"Pin the public key in [project] issuer_keys or CONTEXTFUL_ISSUER_PUBKEY", err=True)


@key.command("public")
@click.option("--key", "key_path", type=_KEY_FILE, required=True, help="The issuer's private key file.")
@click.pass_context
def key_public(ctx: click.Context, key_path: Path) -> None:
    """Print the public key (the pin) of a private key file."""
    from contextful.engine.control.credentials import issuer_key, load_signing_key

    pin = issuer_key(load_signing_key(key_path).public_key())
    if ctx.obj["json"]:
        emit_json({"key_id": pin.key_id, "public_key": pin.text})
        return
    click.echo(pin.text)


@key.command("issue")
@click.option("--subject", required=True, help="Who holds the credential (its sub claim).")
@click.option("--on-behalf-of", default=None,
              help="Whom it acts for (default: the subject): the caller subject a route records.")
@click.option("--audience", required=True, help="What it admits: 'awake' for the resume route, 'connections' for "
                                                "the connection routes.")
@click.option("--ttl", default="1h", show_default=True, callback=duration_seconds,
              help="Lifetime: seconds, or a number with s, m, h or d.")
@click.option("--key", "key_path", type=_KEY_FILE, required=True, help="The issuer's private key file.")
@click.option("--admin", is_flag=True, help="An Admin grant over '*' (audience 'control'): may edit, apply and sign "
                                            "the control document (docs/control.md).")
@click.option("--console-key", default=None, help="The operator's console public key (ed25519:...), which signs "
                                                  "each console mutation (with --admin).")
@click.option("--tenant", default=None, help="A connection write credential's tenant (audience 'connections', "
                                             "with --principal; docs/served.md, \"Connections\").")
@click.option("--principal", default=None, help="A connection write credential's principal (with --tenant).")
@click.pass_context
def key_issue(ctx: click.Context, subject: str, on_behalf_of: str | None, audience: str, ttl: int,
              key_path: Path, admin: bool, console_key: str | None, tenant: str | None,
              principal: str | None) -> None:
    """Print one signed credential; send it as 'Authorization: Bearer <credential>'."""
    from contextful.engine.control.admin import AUDIENCE, admin_claims
    from contextful.engine.control.connection import AUDIENCE as CONNECTIONS
    from contextful.engine.control.credentials import (
        issue,
        issuer_key,
        load_signing_key,
        parse_public_key,
        verify,
    )
    from contextful.storage.errors import ArgumentInvalid

    if (admin or console_key is not None) and audience != AUDIENCE:
        raise ArgumentInvalid("--audience", audience, f"an Admin credential is for audience {AUDIENCE!r}")
    if console_key is not None and not admin:
        raise ArgumentInvalid("--console-key", console_key, "a console key is bound only by an Admin credential "
                                                            "(--admin)")
    if console_key is not None:
        parse_public_key(console_key, "--console-key")
    if (tenant is None) != (principal is None) or (tenant is not None and audience != CONNECTIONS):
        raise ArgumentInvalid("--tenant" if tenant is not None else "--principal", tenant or principal,
                              f"a connection write credential names both --tenant and --principal, for audience "
                              f"{CONNECTIONS!r}")
    private = load_signing_key(key_path)
    claims = admin_claims(console_key) if admin else (
        {"tenant": tenant, "principal": principal} if tenant is not None else None)
    token = issue(private, subject, audience, ttl, on_behalf_of=on_behalf_of, claims=claims)
    if ctx.obj["json"]:
        credential = verify(token, [issuer_key(private.public_key())], audience)
        emit_json({"token": token, "key_id": credential.issuer, "sub": credential.subject,
                   "on_behalf_of": credential.on_behalf_of, "aud": credential.audience,
                   "iat": credential.issued_at, "exp": credential.expires_at, "jti": credential.token_id})
        return
    click.echo(token)
    click.echo(f"credential for {subject!r} (audience {audience!r}) valid {ttl} s; send it as "
               "'Authorization: Bearer <credential>'", err=True)
