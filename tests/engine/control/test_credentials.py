"""Signed credentials (engine.control.credentials): the token format, every refusal, the pins, the
key files and the operator's ``contextful key`` commands.

Real Ed25519 keys through ``cryptography``; the clock is a ManualClock, so expiry is an instant, not
a sleep. The route that admits these credentials is tested in tests/engine/served/test_awake.py.
"""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.control.credentials import (
    CLOCK_SKEW_S,
    MAX_TOKEN_CHARS,
    PIN_VARIABLE,
    Credential,
    admit,
    generate_key,
    issue,
    issuer_key,
    load_signing_key,
    parse_public_key,
    pinned_issuers,
    verify,
)
from contextful.storage.clock import ManualClock
from contextful.storage.errors import (
    ArgumentInvalid,
    CredentialExpired,
    CredentialUnadmitted,
    IssuerKeyInvalid,
    ManifestInvalid,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tests.support.cli import contextful_in

T0 = 1_800_000_000


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signed(private: Ed25519PrivateKey, claims: dict[str, object]) -> str:
    """A token built by hand from the documented format (what a third-party issuer would write)."""
    head = "cfc1." + _b64(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode())
    return f"{head}.{_b64(private.sign(head.encode()))}"


def _claims(private: Ed25519PrivateKey, **changes: object) -> dict[str, object]:
    base: dict[str, object] = {"iss": issuer_key(private.public_key()).key_id, "sub": "relay",
                               "on_behalf_of": "alice", "aud": "awake", "iat": T0, "exp": T0 + 600, "jti": "j1"}
    return {**base, **changes}


def test_a_token_is_the_documented_format_and_verifies_under_its_pin() -> None:
    private = Ed25519PrivateKey.generate()
    pin = issuer_key(private.public_key())
    clock = ManualClock(T0 * 1_000_000)
    token = issue(private, "relay", "awake", 600, on_behalf_of="alice", claims={"zone": "eu"}, clock=clock)

    prefix, claims_b64, signature_b64 = token.split(".")
    assert prefix == "cfc1"
    raw = _unb64(claims_b64)
    claims = json.loads(raw)
    assert raw == json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()  # canonical JSON
    assert claims["iss"] == pin.key_id and claims["sub"] == "relay" and claims["on_behalf_of"] == "alice"
    assert (claims["aud"], claims["iat"], claims["exp"], claims["zone"]) == ("awake", T0, T0 + 600, "eu")
    assert len(claims["jti"]) >= 16
    # the signature is Ed25519 over the ASCII of "cfc1.<claims>", checkable with nothing but the pin
    raw_public = _unb64(pin.text.removeprefix("ed25519:"))
    Ed25519PublicKey.from_public_bytes(raw_public).verify(_unb64(signature_b64), f"cfc1.{claims_b64}".encode())

    credential = verify(token, [pin], "awake", clock=clock)
    assert credential == Credential(pin.key_id, "relay", "alice", "awake", T0, T0 + 600, claims["jti"], claims)
    assert credential.claims["zone"] == "eu"
    assert admit(f"Bearer {token}", [pin], "awake", clock=clock).on_behalf_of == "alice"
    # without on_behalf_of the subject acts for itself
    assert verify(issue(private, "bob", "awake", 60, clock=clock), [pin], "awake", clock=clock).on_behalf_of == "bob"
    # a hand-built token of the documented format verifies the same (an issuer elsewhere can mint them)
    assert verify(_signed(private, _claims(private)), [pin], "awake", clock=clock).on_behalf_of == "alice"


def test_every_refusal_is_credential_unadmitted_and_never_echoes_the_token() -> None:
    private, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    pin, other_pin = issuer_key(private.public_key()), issuer_key(other.public_key())
    clock = ManualClock(T0 * 1_000_000)
    good = _signed(private, _claims(private))
    head, claims_b64, signature = good.split(".")
    array = _b64(b"[1]")
    tampered = ".".join((head, _b64(json.dumps(_claims(private, on_behalf_of="mallory"), sort_keys=True,
                                                separators=(",", ":")).encode()), signature))
    refused = {
        "no header": (None, [pin]),
        "another scheme": (f"Basic {good}", [pin]),
        "empty bearer": ("Bearer ", [pin]),
        "not the format": ("Bearer cfr_0123456789abcdef_secret", [pin]),
        "another version": ("Bearer cfc2." + good.split(".", 1)[1], [pin]),
        "not base64url": (f"Bearer cfc1.{claims_b64}.!!!", [pin]),
        "too long": ("Bearer " + "a" * (MAX_TOKEN_CHARS + 1), [pin]),
        "unpinned signer": (f"Bearer {_signed(other, _claims(other))}", [pin]),
        "no pins at all": (f"Bearer {good}", []),
        "claims changed after signing": (f"Bearer {tampered}", [pin]),
        "iss naming another key": (f"Bearer {_signed(private, _claims(private, iss=other_pin.key_id))}", [pin, other_pin]),
        "another audience": (f"Bearer {_signed(private, _claims(private, aud='fire'))}", [pin]),
        "issued in the future": (f"Bearer {_signed(private, _claims(private, iat=T0 + CLOCK_SKEW_S + 1))}", [pin]),
        "exp not an int": (f"Bearer {_signed(private, _claims(private, exp='soon'))}", [pin]),
        "no sub": (f"Bearer {_signed(private, {k: v for k, v in _claims(private).items() if k != 'sub'})}", [pin]),
        "claims not an object": (f"Bearer cfc1.{array}.{_b64(private.sign(f'cfc1.{array}'.encode()))}", [pin]),
    }
    for case, (header, pins) in refused.items():
        with pytest.raises(CredentialUnadmitted) as caught:
            admit(header, pins, "awake", clock=clock)
        assert caught.value.category == "unauthenticated" and caught.value.http_status == 401, case
        assert caught.value.exit_code == 9, case
        assert signature not in str(caught.value) and claims_b64 not in str(caught.value), case
        assert type(caught.value) is CredentialUnadmitted, case
    # within the skew an issuer's clock may run ahead
    assert verify(_signed(private, _claims(private, iat=T0 + CLOCK_SKEW_S)), [pin], "awake", clock=clock)


def test_a_credential_expires_at_its_exp_instant() -> None:
    private = Ed25519PrivateKey.generate()
    pin = issuer_key(private.public_key())
    clock = ManualClock(T0 * 1_000_000)
    token = issue(private, "relay", "awake", 60, clock=clock)
    clock.advance(59.999)
    assert verify(token, [pin], "awake", clock=clock).expires_at == T0 + 60
    clock.advance(0.001)
    with pytest.raises(CredentialExpired) as caught:
        verify(token, [pin], "awake", clock=clock)
    assert caught.value.http_status == 401 and "expired at" in caught.value.detail


def test_issue_refuses_what_cannot_be_a_credential() -> None:
    private = Ed25519PrivateKey.generate()
    for call in (lambda: issue(private, "s", "awake", 0), lambda: issue(private, "", "awake", 60),
                 lambda: issue(private, "s\nx", "awake", 60), lambda: issue(private, "s", "awake", 60, claims={"sub": "x"})):
        with pytest.raises(ArgumentInvalid):
            call()


def test_pins_come_from_the_environment_else_the_manifest(tmp_path: Path) -> None:
    first, second = (issuer_key(Ed25519PrivateKey.generate().public_key()) for _ in range(2))
    (tmp_path / "contextful.toml").write_text(f'[project]\nissuer_keys = ["{first.text}"]\n')
    project = load_manifest(tmp_path).project
    assert project.issuer_keys == (first.text,)
    assert pinned_issuers(project, {}) == (first,)
    assert pinned_issuers(project, {PIN_VARIABLE: f" {second.text} "}) == (second,)  # the machine's pin replaces
    assert pinned_issuers(project, {PIN_VARIABLE: f"{first.text},{second.text}"}) == (first, second)
    assert pinned_issuers(None, {}) == ()
    with pytest.raises(IssuerKeyInvalid) as caught:
        pinned_issuers(project, {PIN_VARIABLE: "ed25519:short"})
    assert caught.value.source == PIN_VARIABLE
    assert parse_public_key(first.text, "x") == first

    (tmp_path / "contextful.toml").write_text('[project]\nissuer_keys = ["ssh-ed25519 AAAA"]\n')
    with pytest.raises(ManifestInvalid) as invalid:
        load_manifest(tmp_path)
    assert [(p.name, p.key) for p in invalid.value.problems] == [("ManifestValueInvalid", "issuer_keys")]


def test_a_private_key_is_written_owner_only_outside_any_project_and_never_over_a_file(tmp_path: Path) -> None:
    pin, path = generate_key(tmp_path / "keys" / "issuer.pem")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert issuer_key(load_signing_key(path).public_key()) == pin
    with pytest.raises(IssuerKeyInvalid, match="already there"):
        generate_key(path)
    project = tmp_path / "project"
    (project / "secrets").mkdir(parents=True)
    (project / "contextful.toml").write_text("[project]\n")
    with pytest.raises(IssuerKeyInvalid, match="inside the project"):
        generate_key(project / "secrets" / "issuer.pem")
    assert not (project / "secrets" / "issuer.pem").exists()
    os.chmod(path, 0o640)
    with pytest.raises(IssuerKeyInvalid, match="chmod 600"):
        load_signing_key(path)
    (tmp_path / "not-a-key.pem").write_text("hello")
    os.chmod(tmp_path / "not-a-key.pem", 0o600)
    with pytest.raises(IssuerKeyInvalid, match="no unencrypted PEM"):
        load_signing_key(tmp_path / "not-a-key.pem")


def _tree_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_key_path_inside_a_project_is_refused_before_its_folders_exist_and_through_symlinks(tmp_path: Path) -> None:
    """Where the key would land decides, not which folders exist now: a missing folder (or chain of
    them) inside the project, and a path whose existing ancestor is a symlink into the project (a
    dangling one too), are refused with the error an existing folder gets, and nothing is written."""
    project = tmp_path / "project"
    (project / "secrets").mkdir(parents=True)
    (project / "contextful.toml").write_text("[project]\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "into-project").symlink_to(project, target_is_directory=True)
    (outside / "dangling").symlink_to(project / "not-yet", target_is_directory=True)
    before = _tree_of(project)
    refused = f"issuer key from {{}}: it is inside the project at {project.resolve()}; a private key never sits"
    for path in (project / "secrets" / "issuer.pem", project / "keys" / "issuer.pem",
                 project / "keys" / "deeper" / "issuer.pem", outside / "into-project" / "keys" / "issuer.pem",
                 outside / "dangling" / "issuer.pem"):
        with pytest.raises(IssuerKeyInvalid) as caught:
            generate_key(path)
        assert f"IssuerKeyInvalid: {refused.format(path)}" in str(caught.value), path
        assert _tree_of(project) == before, path

    # The command a user runs, from inside the project, with a relative --out.
    cli = contextful_in(project, "key", "generate", "--out", "keys/issuer.pem", check=False)
    assert cli.returncode != 0 and cli.stdout == ""
    assert f"error: IssuerKeyInvalid: {refused.format(project / 'keys' / 'issuer.pem')}" in cli.stderr
    cli = contextful_in(outside, "key", "generate", "--out", "into-project/keys/issuer.pem", check=False)
    assert cli.returncode != 0 and "IssuerKeyInvalid" in cli.stderr and "inside the project" in cli.stderr
    assert _tree_of(project) == before
    # Outside any project a missing folder is created as before.
    _, written = generate_key(outside / "keys" / "deeper" / "issuer.pem")
    assert written.is_file() and stat.S_IMODE(written.stat().st_mode) == 0o600


def test_the_key_commands_generate_show_and_issue(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    generated = contextful_in(tmp_path, "key", "generate", env=env)
    public = generated.stdout.strip()
    assert public.startswith("ed25519:") and "private key written to" in generated.stderr
    [key_file] = (tmp_path / "config" / "contextful" / "keys").glob("issuer-*.pem")
    pin = parse_public_key(public, "stdout")
    assert key_file.name == f"issuer-{pin.key_id}.pem" and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert contextful_in(tmp_path, "key", "public", "--key", str(key_file)).stdout.strip() == public

    issued = json.loads(contextful_in(tmp_path, "--json", "key", "issue", "--subject", "relay", "--on-behalf-of",
                                      "alice", "--audience", "awake", "--ttl", "15m", "--key", str(key_file)).stdout)
    credential = verify(issued["token"], [pin], "awake")
    assert (issued["on_behalf_of"], issued["exp"], issued["jti"]) == ("alice", credential.expires_at, credential.token_id)
    assert (credential.subject, credential.on_behalf_of, credential.expires_at - credential.issued_at) == \
        ("relay", "alice", 900)
    bad_ttl = contextful_in(tmp_path, "key", "issue", "--subject", "s", "--audience", "awake", "--ttl", "soon",
                            "--key", str(key_file), check=False)
    assert bad_ttl.returncode == 3 and "ArgumentInvalid: --ttl" in bad_ttl.stderr
