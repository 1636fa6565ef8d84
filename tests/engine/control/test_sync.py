"""Synced control: signed claims in a project with ``[sync]`` (surface.apply.synced-attestation,
receipt-message, receipt-digest, receipt-file, attestation-unavailable).

Through the command (a real child process) against the S3-compatible server the session starts
(moto on loopback); what lands is read back from the snapshot directory and the bucket themselves.
The helpers here (keys, a synced project, reading the bucket) serve the other ``test_sync_*`` modules.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from contextful.engine.control.admin import admin_claims
from contextful.engine.control.apply import apply_manifest, import_manifest
from contextful.engine.control.credentials import b64url_decode, generate_key, issue, load_signing_key
from contextful.engine.control.receipts import KeySigner
from contextful.engine.control.synced import Offered
from contextful.storage.errors import ControlAttestationUnavailable
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from tests.engine.control.test_apply import BASE, SECOND_PIPELINE, default_dir, one_error
from tests.support.cli import contextful_in
from tests.support.s3_server import CREDENTIALS, S3Server

pytestmark = pytest.mark.s3


@dataclass(frozen=True)
class Keys:
    """An issuer key, and the control credentials it issued."""

    pin: str
    pem: Path
    admin: str
    reader: str


def make_keys(directory: Path) -> Keys:
    pin, pem = generate_key(directory / "issuer.pem")
    private = load_signing_key(pem)
    return Keys(pin.text, pem, issue(private, "ops", "control", 3600, claims=admin_claims()),
                issue(private, "viewer", "control", 3600))


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return make_keys(tmp_path / "keys")


@dataclass
class Node:
    """One synced project directory, with the environment its commands run in."""

    root: Path
    env: dict[str, str]
    s3: S3Server
    bucket: str
    """The bucket name (the [sync] bucket is s3://<bucket>/sync)."""

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> Any:
        return contextful_in(None, "--project", str(self.root), *args, env=env if env is not None else self.env,
                             check=check)

    @property
    def snapshots(self) -> Path:
        return default_dir(self.root)

    def write(self, text: str) -> None:
        (self.root / "contextful.toml").write_text(text)


def synced_text(bucket: str, pin: str, body: str = BASE) -> str:
    """``body`` with the issuer key pinned and a ``[sync]`` block naming ``s3://<bucket>/sync``."""
    return body.replace('name = "shop"\n', f'name = "shop"\nissuer_keys = ["{pin}"]\n', 1) + \
        f'\n[sync]\nbucket = "s3://{bucket}/sync"\n'


def make_node(path: Path, s3: S3Server, bucket: str, keys: Keys, body: str = BASE) -> Node:
    path.mkdir(parents=True, exist_ok=True)
    env = {"CONTEXTFUL_S3_ENDPOINT_URL": s3.endpoint, **CREDENTIALS, "CONTEXTFUL_TOKEN": keys.admin,
           "CONTEXTFUL_CONTROL_SIGNING_KEY": str(keys.pem)}
    node = Node(path, env, s3, bucket)
    node.write(synced_text(bucket, keys.pin, body))
    return node


@pytest.fixture
def node(tmp_path: Path, s3_server: S3Server, keys: Keys) -> Node:
    return make_node(tmp_path / "shop-a", s3_server, s3_server.new_bucket(), keys)


class BucketView:
    """What the bucket holds under ``control/shop/``, read with s3fs as any tool would."""

    def __init__(self, s3: S3Server, bucket: str) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(**s3.storage_options)
        self.base = f"{bucket}/sync/control/shop"

    def names(self) -> list[str]:
        self.fs.invalidate_cache()
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.find(self.base))

    def get(self, name: str) -> bytes:
        return bytes(self.fs.cat_file(f"{self.base}/{name}"))

    def put(self, name: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """Write ``name`` unconditionally, as any writer holding the bucket's credentials can."""
        bucket, key, _ = self.fs.split_path(f"{self.base}/{name}")
        self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, Metadata=metadata or {})

    def head(self) -> tuple[bytes, dict[str, str]]:
        self.fs.invalidate_cache()
        return self.get("manifest@current"), dict(self.fs.metadata(f"{self.base}/manifest@current"))


def spec_message(receipt: dict[str, Any]) -> bytes:
    """The message the spec says a receipt signs, spelled out here rather than imported."""
    return (f"contextful-control-v1\n{receipt['project']}\n{receipt['version']}\n{receipt['parent']}\n"
            f"{receipt['snapshot']}\n{receipt['signer']}\n").encode()


def signature_holds(receipt: dict[str, Any]) -> bool:
    from cryptography.exceptions import InvalidSignature

    public = Ed25519PublicKey.from_public_bytes(b64url_decode(receipt["signer"].removeprefix("ed25519:")))
    try:
        public.verify(b64url_decode(receipt["signature"]), spec_message(receipt))
    except InvalidSignature:
        return False
    return True


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- surface.apply.synced-attestation, receipt-message, receipt-digest ----------------------------


@pytest.mark.clause("surface.apply.synced-attestation", "surface.apply.receipt-message",
                    "surface.apply.receipt-digest")
def test_a_synced_import_and_apply_sign_each_version_and_push_it(node: Node, keys: Keys) -> None:
    assert node.run("pipeline", "import").stdout == "claimed v1 (applied)\n"
    first = (node.snapshots / "receipt@v1.json").read_bytes()
    receipt = json.loads(first)
    assert first == rfc8785.dumps(receipt)  # the file holds the canonical bytes
    snapshot = (node.snapshots / "manifest@v1.toml").read_bytes()
    assert receipt == {"format": 1, "project": "shop", "version": 1, "parent": "-", "snapshot": sha256(snapshot),
                       "signer": keys.pin, "signature": receipt["signature"]}
    assert signature_holds(receipt)

    node.write(node.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    assert node.run("pipeline", "apply").stdout == "claimed v2 (applied)\n"
    second = json.loads((node.snapshots / "receipt@v2.json").read_bytes())
    assert second["version"] == 2 and second["parent"] == sha256(first)  # the predecessor, by its digest
    assert second["snapshot"] == sha256((node.snapshots / "manifest@v2.toml").read_bytes())
    assert signature_holds(second)

    bucket = BucketView(node.s3, node.bucket)  # the apply pushed: the bucket head names v2's receipt digest
    assert bucket.names() == ["manifest@current", "manifest@v1.toml", "manifest@v2.toml", "receipt@v1.json",
                              "receipt@v2.json"]
    body, meta = bucket.head()
    assert body == b"2\n" and meta["receipt"] == sha256((node.snapshots / "receipt@v2.json").read_bytes())
    for name in ("manifest@v1.toml", "manifest@v2.toml", "receipt@v1.json", "receipt@v2.json"):
        assert bucket.get(name) == (node.snapshots / name).read_bytes()


@pytest.mark.clause("surface.apply.receipt-message")
def test_a_receipt_whose_parent_or_snapshot_digest_changed_after_signing_does_not_verify(
        node: Node, s3_server: S3Server) -> None:
    """A push verifies every receipt it publishes: one altered after signing is refused, and the
    bucket it would have gone to is left as it was."""
    node.run("pipeline", "import")
    node.write(node.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    node.run("pipeline", "apply")
    first, second = (json.loads((node.snapshots / f"receipt@v{n}.json").read_bytes()) for n in (1, 2))
    fresh = s3_server.new_bucket()  # the same node, now syncing through a bucket holding nothing yet
    node.write(node.root.joinpath("contextful.toml").read_text().replace(node.bucket, fresh))
    path = node.snapshots / "receipt@v2.json"
    for field, value in (("parent", sha256(b"another parent")), ("snapshot", sha256(b"another snapshot"))):
        altered = dict(second, **{field: value})
        assert not signature_holds(altered)
        path.write_bytes(rfc8785.dumps(altered))
        line = one_error(node.run("control", "push", check=False), "ControlSnapshotUntrusted", 9)
        assert "receipt@v2.json" in line and "its signature does not verify" in line
        assert BucketView(s3_server, fresh).names() == []  # nothing published, v1 included
    path.write_bytes(rfc8785.dumps(second))  # the receipt as signed pushes
    assert node.run("control", "push").stdout == "pushed v1, v2: the bucket head is v2\n"
    assert signature_holds(first)


# --- surface.apply.attestation-unavailable ---------------------------------------------------------


@pytest.mark.clause("surface.apply.attestation-unavailable")
def test_a_synced_import_lacking_an_admin_capability_or_signing_port_claims_nothing(
        node: Node, keys: Keys, tmp_path: Path) -> None:
    stranger = make_keys(tmp_path / "stranger")
    lacking = {
        "no credential": {k: v for k, v in node.env.items() if k != "CONTEXTFUL_TOKEN"},
        "a reader's credential": node.env | {"CONTEXTFUL_TOKEN": keys.reader},
        "an Admin credential of an unpinned issuer": node.env | {"CONTEXTFUL_TOKEN": stranger.admin},
        "no signing key": {k: v for k, v in node.env.items() if k != "CONTEXTFUL_CONTROL_SIGNING_KEY"},
        "an unpinned signing key": node.env | {"CONTEXTFUL_CONTROL_SIGNING_KEY": str(stranger.pem)},
        "an unreadable signing key": node.env | {"CONTEXTFUL_CONTROL_SIGNING_KEY": str(tmp_path / "absent.pem")},
    }
    missing = {"no credential": "no Admin capability", "a reader's credential": "no Admin grant over '*'",
               "an Admin credential of an unpinned issuer": "not admitted", "no signing key": "no issuer signing key",
               "an unpinned signing key": "is not a pinned issuer key",
               "an unreadable signing key": "cannot be used"}
    for case, env in lacking.items():
        line = one_error(node.run("pipeline", "import", check=False, env=env), "ControlAttestationUnavailable", 9)
        assert "project 'shop' syncs its control" in line and missing[case] in line, (case, line)
        assert not node.snapshots.exists() or not any(node.snapshots.iterdir()), case
    assert BucketView(node.s3, node.bucket).names() == []
    # --signing-key names the port in place of the variable
    no_variable = {k: v for k, v in node.env.items() if k != "CONTEXTFUL_CONTROL_SIGNING_KEY"}
    assert node.run("pipeline", "import", "--signing-key", str(keys.pem), env=no_variable).stdout == \
        "claimed v1 (applied)\n"


@pytest.mark.clause("surface.apply.attestation-unavailable")
def test_a_synced_apply_lacking_its_signing_port_claims_no_version(node: Node, keys: Keys) -> None:
    node.run("pipeline", "import")
    node.write(node.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    before = sorted(p.name for p in node.snapshots.iterdir())
    env = {k: v for k, v in node.env.items() if k != "CONTEXTFUL_CONTROL_SIGNING_KEY"}
    one_error(node.run("pipeline", "apply", check=False, env=env), "ControlAttestationUnavailable", 9)
    env = node.env | {"CONTEXTFUL_TOKEN": keys.reader}
    one_error(node.run("pipeline", "apply", check=False, env=env), "ControlAttestationUnavailable", 9)
    assert sorted(p.name for p in node.snapshots.iterdir()) == before
    assert (node.snapshots / "manifest@current").read_text() == "1\n"
    assert BucketView(node.s3, node.bucket).head()[0] == b"1\n"


# --- surface.apply.receipt-file ----------------------------------------------------------------------


@dataclass
class WatchingSigner:
    """A signing port over the issuer key that records what the snapshot directory held whenever it
    was asked to sign, and fails when told to (a signer whose key store went away)."""

    inner: KeySigner
    directory: Path
    fail: bool = False
    seen: list[list[str]] | None = None

    @property
    def signer(self) -> str:
        return self.inner.signer

    def sign(self, message: bytes) -> bytes:
        held = sorted(p.name for p in self.directory.iterdir()) if self.directory.exists() else []
        self.seen = (self.seen or []) + [held]
        if self.fail:
            raise OSError("the signing service is unreachable")
        return self.inner.sign(message)


@pytest.mark.clause("surface.apply.receipt-file")
def test_when_signing_fails_during_a_synced_import_neither_snapshot_nor_pointer_names_the_version(
        node: Node, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTFUL_S3_ENDPOINT_URL", node.s3.endpoint)
    watching = WatchingSigner(KeySigner.from_file(keys.pem), node.snapshots, fail=True)
    offered = Offered(token=keys.admin, signer=watching)
    with pytest.raises(OSError, match="the signing service is unreachable"):
        import_manifest(node.root, offered=offered)
    assert not node.snapshots.exists() or sorted(p.name for p in node.snapshots.iterdir()) == []
    assert BucketView(node.s3, node.bucket).names() == []

    watching.fail = False
    outcome = import_manifest(node.root, offered=offered)
    assert outcome.claimed and outcome.version == 1
    node.write(node.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE)
    moments: list[tuple[str, list[str], str]] = []

    def step(what: str, version: int) -> None:
        moments.append((what, sorted(p.name for p in node.snapshots.iterdir() if not p.name.startswith(".")),
                        (node.snapshots / "manifest@current").read_text()))

    assert apply_manifest(node.root, offered=offered, step=step).version == 2
    v1 = ["manifest.lock", "manifest@current", "manifest@v1.toml", "receipt@v1.json"]
    assert watching.seen == [[], [], v1]  # each signature came before anything of its version was written
    # the receipt is beside its snapshot before the pointer names the version
    assert moments == [("claim", v1, "1\n"),
                       ("advance", sorted(v1 + ["manifest@v2.toml", "receipt@v2.json"]), "1\n")]
    watching.fail = True
    node.write(node.root.joinpath("contextful.toml").read_text() + SECOND_PIPELINE.replace("orders", "refunds"))
    with pytest.raises(OSError):
        apply_manifest(node.root, offered=offered)
    assert not (node.snapshots / "manifest@v3.toml").exists() and not (node.snapshots / "receipt@v3.json").exists()
    assert (node.snapshots / "manifest@current").read_text() == "2\n"


def test_a_synced_import_needs_the_admitted_credential_even_in_the_library(node: Node, keys: Keys) -> None:
    with pytest.raises(ControlAttestationUnavailable, match="no Admin grant"):
        import_manifest(node.root, offered=Offered(token=keys.reader, signing_key=keys.pem))


def test_a_sync_block_is_validated(node: Node) -> None:
    text = node.root.joinpath("contextful.toml").read_text()
    node.write(text.replace("[sync]\n", "[sync]\nregion = \"eu\"\n"))
    line = one_error(node.run("pipeline", "import", check=False), "ApplyValidationRefused", 3)
    assert "ManifestKeyUnknown" in line and "region" in line
    node.write(text.replace(f'bucket = "s3://{node.bucket}/sync"', 'bucket = "/tmp/not-a-bucket"'))
    line = one_error(node.run("pipeline", "import", check=False), "ApplyValidationRefused", 3)
    assert "[sync]" in line and "s3://bucket/prefix" in line
