"""Synthetic credentials and decoys for the guard's fixtures and benchmark, made up deterministically.

The fixture files (``fixtures/positives.tsv``, ``fixtures/negatives.tsv``) hold templates in which
``<<key>>`` stands for a value drawn here from a seeded ``random.Random``: a credential-shaped string
of random characters (``CREDENTIALS``, keyed ``family`` or ``family:variant``) or a near miss that
must stay unmasked (``DECOYS``). No credential-shaped literal is committed, so secret scanners and
push protection do not trip on the repository; every value is random characters in the right shape.

    >>> text, expected = render("key=<<aws-access-key-id>>;", random.Random("doc"))
    >>> expected == [Finding("aws-access-key-id", 4, 24)] and text[4:8] in ("AKIA", "ASIA")
    True
"""

from __future__ import annotations

import base64
import json
import random
import string
import uuid
from collections.abc import Callable
from pathlib import Path

from contextful.engine.guard.catalogue import AwsKeyFamily, Family, Finding, LlmKeyFamily, PrivateKeyFamily

FIXTURES = Path(__file__).parent / "fixtures"
UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"
_OPEN, _CLOSE = "<<", ">>"

Draw = Callable[[random.Random], str]


def chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _b64url_json(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


def _jwt(rng: random.Random, signature: int = 43) -> str:
    header = {"alg": rng.choice(["HS256", "RS256", "ES256"]), "typ": "JWT"}
    payload = {"sub": str(rng.randrange(10**6)), "iat": 1736899200 + rng.randrange(10**6), "scope": "read"}
    return f"{_b64url_json(header)}.{_b64url_json(payload)}.{chars(rng, B64URL, signature)}"


_PEM_LABELS = ("RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY",
               "ENCRYPTED PRIVATE KEY", "DSA PRIVATE KEY", "PGP PRIVATE KEY BLOCK")


def _pem_lines(rng: random.Random, label: str, headers: tuple[str, ...] = (), *, end: bool = True) -> list[str]:
    body = [chars(rng, ALNUM + "+/", 64) for _ in range(rng.randint(3, 12))]
    body.append(chars(rng, ALNUM + "+/", rng.randint(8, 60)) + "==")
    lines = [f"-----BEGIN {label}-----", *headers, *body]
    return [*lines, f"-----END {label}-----"] if end else lines


def _pem(rng: random.Random, newline: str = "\n", headers: tuple[str, ...] = (), *, end: bool = True) -> str:
    label = "RSA PRIVATE KEY" if headers else rng.choice(_PEM_LABELS)
    return newline.join(_pem_lines(rng, label, headers, end=end))


def _llm(prefix: str, extra: int) -> Draw:
    """``sk-`` + an admitted prefix + a base64url tail long enough to admit the whole."""
    return lambda rng: f"sk-{prefix}{chars(rng, B64URL, extra)}{chars(rng, ALNUM, 4)}"


CREDENTIALS: dict[str, Draw] = {
    "aws-access-key-id": lambda r: r.choice(("AKIA", "ASIA")) + chars(r, UPPER_DIGITS, 16),
    "github-token": lambda r: r.choice(("ghp_", "gho_", "ghu_", "ghs_", "ghr_")) + chars(r, ALNUM, 36),
    "github-fine-grained-pat": lambda r: f"github_pat_{chars(r, ALNUM, 22)}_{chars(r, ALNUM, 59)}",
    "gitlab-token": lambda r: "glpat-" + chars(r, B64URL, 19) + chars(r, ALNUM, 1),
    "gitlab-token:long": lambda r: "glpat-" + chars(r, B64URL, r.randint(27, 60)) + chars(r, ALNUM, 1),
    "slack-token": lambda r: (r.choice(("xoxb-", "xoxa-", "xoxr-", "xoxs-")) + chars(r, string.digits, 12)
                              + "-" + chars(r, string.digits, 13) + "-" + chars(r, ALNUM, 24)),
    "slack-token:xoxp": lambda r: "xoxp-" + "-".join(chars(r, string.digits, 12) for _ in range(3)) + "-"
    + chars(r, HEX, 32),
    "slack-webhook": lambda r: (f"hooks.slack.com/services/T{chars(r, UPPER_DIGITS, 10)}"
                                f"/B{chars(r, UPPER_DIGITS, 10)}/{chars(r, ALNUM, 24)}"),
    "stripe-secret-key": lambda r: (r.choice(("sk_live_", "rk_live_", "sk_test_", "rk_test_"))
                                    + chars(r, ALNUM, r.choice((24, 34, 99)))),
    "google-api-key": lambda r: "AIza" + chars(r, B64URL, 34) + chars(r, ALNUM, 1),
    "llm-api-key": lambda r: "sk-" + chars(r, ALNUM, 48),
    "llm-api-key:exact32": lambda r: "sk-" + chars(r, ALNUM, 32),
    "llm-api-key:alnum-then-hyphens": lambda r: f"sk-{chars(r, ALNUM, 32)}-{chars(r, ALNUM, 6)}-{chars(r, ALNUM, 9)}",
    "llm-api-key:long": lambda r: "sk-" + chars(r, ALNUM, 40) + chars(r, B64URL, 160) + chars(r, ALNUM, 1),
    "llm-api-key:proj": _llm("proj-", 150),
    "llm-api-key:svcacct": _llm("svcacct-", 150),
    "llm-api-key:service": _llm("service-", 40),
    "llm-api-key:admin": _llm("admin-", 60),
    "llm-api-key:ant": lambda r: f"sk-ant-api03-{chars(r, B64URL, 93)}AA",
    "llm-api-key:ant-short": lambda r: "sk-ant-" + chars(r, B64URL, 26) + chars(r, ALNUM, 2),  # a tail of 32
    "sendgrid-api-key": lambda r: f"SG.{chars(r, B64URL, 22)}.{chars(r, B64URL, 43)}",
    "twilio-api-key": lambda r: "SK" + chars(r, HEX, 32),
    "npm-token": lambda r: "npm_" + chars(r, ALNUM, 36),
    "pypi-token": lambda r: "pypi-AgEIcHlwaS5vcmc" + chars(r, B64URL, r.randint(150, 220)) + chars(r, ALNUM, 1),
    "huggingface-token": lambda r: "hf_" + chars(r, string.ascii_letters, 34),
    "private-key": _pem,
    "private-key:json": lambda r: _pem(r, "\\n"),
    "private-key:crlf": lambda r: _pem(r, "\r\n"),
    "private-key:encrypted": lambda r: _pem(r, headers=("Proc-Type: 4,ENCRYPTED",
                                                        f"DEK-Info: AES-128-CBC,{chars(r, HEX, 32).upper()}", "")),
    "private-key:truncated": lambda r: _pem(r, end=False),
    "jwt": _jwt,
    "alibaba-access-key-id": lambda r: "LTAI" + chars(r, ALNUM, 20),
    "cloudflare-origin-ca-key": lambda r: f"v1.0-{chars(r, HEX, 24)}-{chars(r, HEX, 146)}",
    "digitalocean-token": lambda r: r.choice(("dop_v1_", "doo_v1_", "dor_v1_")) + chars(r, HEX, 64),
    "heroku-api-key": lambda r: "HRKU-AA" + chars(r, B64URL, 57) + chars(r, ALNUM, 1),
    "flyio-access-token": lambda r: "fo1_" + chars(r, B64URL, 42) + chars(r, ALNUM, 1),
    "flyio-macaroon": lambda r: (r.choice(("fm1a_", "fm1r_", "fm2_")) + chars(r, ALNUM + "+/", r.randint(100, 300))
                                 + chars(r, ALNUM, 1)),
    "scalingo-api-token": lambda r: "tk-us-" + chars(r, B64URL, 47) + chars(r, ALNUM, 1),
    "databricks-api-token": lambda r: "dapi" + chars(r, HEX, 32),
    "vault-token": lambda r: (r.choice(("hvs.", "hvb.")) + chars(r, B64URL, r.randint(90, 200))
                              + chars(r, ALNUM, 1)),
    "pulumi-api-token": lambda r: "pul-" + chars(r, HEX, 40),
    "planetscale-token": lambda r: (r.choice(("pscale_tkn_", "pscale_oauth_", "pscale_pw_"))
                                    + chars(r, B64URL + "=", r.randint(31, 63)) + chars(r, ALNUM, 1)),
    "doppler-api-token": lambda r: "dp.pt." + chars(r, ALNUM, 43),
    "dynatrace-api-token": lambda r: f"dt0c01.{chars(r, UPPER_DIGITS, 24)}.{chars(r, ALNUM, 64)}",
    "grafana-api-key": lambda r: "eyJrIjoi" + chars(r, ALNUM, r.randint(70, 120)),
    "grafana-cloud-api-token": lambda r: "glc_" + chars(r, ALNUM + "+/", r.randint(32, 150)) + chars(r, ALNUM, 1),
    "grafana-service-account-token": lambda r: f"glsa_{chars(r, ALNUM, 32)}_{chars(r, HEX, 8)}",
    "new-relic-user-api-key": lambda r: "NRAK-" + chars(r, UPPER_DIGITS, 27),
    "new-relic-insert-key": lambda r: "NRII-" + chars(r, ALNUM + "-", 31) + chars(r, ALNUM, 1),
    "sentry-user-token": lambda r: "sntryu_" + chars(r, HEX, 64),
    "sentry-org-token": lambda r: (f"sntrys_eyJpYXQiO{chars(r, ALNUM + '+/', r.randint(40, 160))}"
                                   f"_{chars(r, ALNUM + '+/', 42)}{chars(r, ALNUM, 1)}"),
    "openshift-user-token": lambda r: "sha256~" + chars(r, B64URL, 42) + chars(r, ALNUM, 1),
    "octopus-deploy-api-key": lambda r: "API-" + chars(r, UPPER_DIGITS, 26),
    "clickhouse-cloud-api-secret-key": lambda r: "4b1d" + chars(r, ALNUM, 38),
    "harness-api-key": lambda r: (r.choice(("pat.", "sat.")) + chars(r, B64URL, 22) + "." + chars(r, ALNUM, 24)
                                  + "." + chars(r, ALNUM, 20)),
    "infracost-api-token": lambda r: "ico-" + chars(r, ALNUM, 32),
    "defined-networking-api-token": lambda r: (f"dnkey-{chars(r, B64URL + '=', 26)}-{chars(r, B64URL + '=', 51)}"
                                               + chars(r, ALNUM, 1)),
    "gitlab-token:other": lambda r: (r.choice(("gldt-", "glrt-", "glffct-", "glft-", "glimt-", "glagent-", "gloas-",
                                               "glsoat-", "GR1348941")) + chars(r, B64URL, r.randint(20, 63))
                                     + chars(r, ALNUM, 1)),
    "gitlab-token:cbt": lambda r: f"glcbt-{chars(r, ALNUM, r.randint(1, 5))}_{chars(r, B64URL, 19)}{chars(r, ALNUM, 1)}",
    "gitlab-token:ptt": lambda r: "glptt-" + chars(r, HEX, 40),
    "gitlab-session-cookie": lambda r: "_gitlab_session=" + chars(r, string.ascii_lowercase + string.digits, 32),
    "sourcegraph-access-token": lambda r: r.choice((
        lambda: "sgp_" + chars(r, HEX, 40), lambda: f"sgp_{chars(r, HEX, 16)}_{chars(r, HEX, 40)}",
        lambda: "sgp_local_" + chars(r, HEX, 40)))(),
    "atlassian-api-token": lambda r: "ATATT3" + chars(r, B64URL + "=", 185) + chars(r, ALNUM, 1),
    "linear-api-key": lambda r: "lin_api_" + chars(r, ALNUM, 40),
    "notion-api-token": lambda r: "ntn_" + chars(r, string.digits, 11) + chars(r, ALNUM, 35),
    "postman-api-token": lambda r: f"PMAK-{chars(r, HEX, 24)}-{chars(r, HEX, 34)}",
    "prefect-api-token": lambda r: "pnu_" + chars(r, ALNUM, 36),
    "readme-api-token": lambda r: "rdme_" + chars(r, string.ascii_lowercase + string.digits, 70),
    "typeform-api-token": lambda r: "tfp_" + chars(r, B64URL + "=", 58) + chars(r, ALNUM, 1),
    "frameio-api-token": lambda r: "fio-u-" + chars(r, B64URL + "=", 63) + chars(r, ALNUM, 1),
    "1password-secret-key": lambda r: "A3-" + "-".join(chars(r, UPPER_DIGITS, n) for n in r.choice(
        ((6, 11, 5, 5, 5), (6, 6, 5, 5, 5, 5)))),
    "1password-service-account-token": lambda r: "ops_eyJ" + chars(r, ALNUM + "+/", r.randint(250, 400)) + chars(r, ALNUM, 1),
    "adobe-client-secret": lambda r: "p8e-" + chars(r, ALNUM, 32),
    "age-secret-key": lambda r: "AGE-SECRET-KEY-1" + chars(r, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58),
    "artifactory-api-key": lambda r: "AKCp" + chars(r, ALNUM, 69),
    "artifactory-reference-token": lambda r: "cmVmd" + chars(r, ALNUM, 59),
    "intra42-client-secret": lambda r: r.choice(("s-s4t2ud-", "s-s4t2af-")) + chars(r, HEX, 64),
    "slack-token:app": lambda r: (f"xapp-{r.randint(1, 9)}-A{chars(r, UPPER_DIGITS, 10)}-{chars(r, string.digits, 13)}-"
                                  f"{chars(r, HEX, 64)}"),
    "slack-token:config": lambda r: (r.choice(("xoxe.xoxb-", "xoxe.xoxp-", "xoxe-")) + f"{r.randint(1, 9)}-"
                                     + chars(r, UPPER_DIGITS, 146)),
    "slack-token:legacy": lambda r: (r.choice(("xoxo-", "xoxs-")) + "-".join(chars(r, string.digits, 10)
                                                                          for _ in range(3)) + "-" + chars(r, HEX, 64)),
    "slack-workflow-webhook": lambda r: (r.choice(("hooks.slack.com/workflows/", "hooks.slack.com/triggers/"))
                                         + chars(r, ALNUM + "+/", r.randint(42, 55)) + chars(r, ALNUM, 1)),
    "discord-webhook": lambda r: (r.choice(("discord.com/api/webhooks/", "discordapp.com/api/webhooks/"))
                                  + chars(r, string.digits, r.randint(17, 20)) + "/" + chars(r, B64URL, 67)
                                  + chars(r, ALNUM, 1)),
    "microsoft-teams-webhook": lambda r: (f"webhook.office.com/webhookb2/{uuid.UUID(int=r.getrandbits(128))}"
                                          f"@{uuid.UUID(int=r.getrandbits(128))}/IncomingWebhook/"
                                          f"{chars(r, HEX, 32)}/{uuid.UUID(int=r.getrandbits(128))}"),
    "sendinblue-api-token": lambda r: f"xkeysib-{chars(r, HEX, 64)}-{chars(r, ALNUM, 16)}",
    "square-access-token": lambda r: (r.choice(("sq0atp-", "EAAA")) + chars(r, B64URL, r.randint(21, 59))
                                      + chars(r, ALNUM, 1)),
    "facebook-page-access-token": lambda r: r.choice(("EAAM", "EAAC")) + chars(r, ALNUM, r.randint(100, 200)),
    "shopify-token": lambda r: r.choice(("shpat_", "shpca_", "shppa_", "shpss_")) + chars(r, HEX, 32),
    "flutterwave-secret-key": lambda r: "FLWSECK_TEST-" + chars(r, "abcdefgh0123456789", r.choice((12, 32))),
    "duffel-api-token": lambda r: r.choice(("duffel_test_", "duffel_live_")) + chars(r, B64URL + "=", 42) + "x",
    "easypost-api-token": lambda r: r.choice(("EZAK", "EZTK")) + chars(r, ALNUM, 54),
    "shippo-api-token": lambda r: r.choice(("shippo_live_", "shippo_test_")) + chars(r, HEX, 40),
    "plaid-access-token": lambda r: (r.choice(("access-sandbox-", "access-development-", "access-production-"))
                                     + str(uuid.UUID(int=r.getrandbits(128)))),
    "settlemint-token": lambda r: r.choice(("sm_aat_", "sm_pat_", "sm_sat_")) + chars(r, ALNUM, 16),
    "rubygems-api-token": lambda r: "rubygems_" + chars(r, HEX, 48),
    "clojars-api-token": lambda r: r.choice(("CLOJARS_", "clojars_")) + chars(r, ALNUM, 60),
    "huggingface-token:org": lambda r: "api_org_" + chars(r, string.ascii_letters, 34),
    "perplexity-api-key": lambda r: "pplx-" + chars(r, ALNUM, 48),
    "aws-access-key-id:other": lambda r: (r.choice(("ABIA", "ACCA", "A3T" + chars(r, UPPER_DIGITS, 1)))
                                          + chars(r, UPPER_DIGITS, 16)),
    "jwt-base64": lambda r: base64.b64encode(_jwt(r).encode()).decode().rstrip("="),
    "stripe-secret-key:prod": lambda r: r.choice(("sk_prod_", "rk_prod_")) + chars(r, ALNUM, r.randint(24, 99)),
    "contextful-key": lambda r: r.choice(("cfr_", "cfw_")) + chars(r, HEX, 16) + "_" + chars(r, B64URL, 43),
    "contextful-signed-credential": lambda r: (f"cfc1.eyJ{chars(r, B64URL, r.randint(100, 300))}"
                                               f".{chars(r, B64URL, 86)}"),
}
"""Credential-shaped values: a ``<<key>>`` placeholder in a positive expects one finding of ``key``'s family."""

DECOYS: dict[str, Draw] = {
    "stripe-publishable-key": lambda r: r.choice(("pk_live_", "pk_test_")) + chars(r, ALNUM, r.choice((24, 99))),
    "twilio-account-sid": lambda r: "AC" + chars(r, HEX, 32),
    "twilio-near": lambda r: "SK" + chars(r, HEX, r.choice((31, 33))),
    "twilio-in-word": lambda r: chars(r, ALNUM, 1) + "SK" + chars(r, HEX, 32),
    "llm-tail-31": lambda r: "sk-" + chars(r, ALNUM, 31),
    "llm-hyphen-in-32": lambda r: f"sk-{chars(r, ALNUM, r.randint(0, 31))}-{chars(r, ALNUM, 40)}",
    "llm-underscore-in-32": lambda r: f"sk-{chars(r, ALNUM, r.randint(1, 31))}_{chars(r, ALNUM, 40)}",
    "llm-proj-short": lambda r: "sk-proj-" + chars(r, ALNUM, 26),  # tail of 31
    "llm-after-word": lambda r: r.choice(("task-", "ask", "mask_", "disk", "risk-", "X")) + "sk-" + chars(r, ALNUM, 48),
    "llm-uuid": lambda r: f"sk-{uuid.UUID(int=r.getrandbits(128), version=4)}",
    "aws-short": lambda r: "AKIA" + chars(r, UPPER_DIGITS, 15),
    "aws-long": lambda r: "AKIA" + chars(r, UPPER_DIGITS, 17),
    "aws-in-word": lambda r: chars(r, ALNUM, 1) + "AKIA" + chars(r, UPPER_DIGITS, 16),
    "aws-lowercase-tail": lambda r: "AKIA" + chars(r, string.ascii_lowercase, 16),
    "github-short": lambda r: "ghp_" + chars(r, ALNUM, 35),
    "github-long": lambda r: "ghp_" + chars(r, ALNUM, 37),
    "github-pat-short": lambda r: "github_pat_" + chars(r, ALNUM, 60),
    "gitlab-short": lambda r: "glpat-" + chars(r, ALNUM, 19),
    "google-short": lambda r: "AIza" + chars(r, ALNUM, 34),
    "sendgrid-short": lambda r: f"SG.{chars(r, B64URL, 22)}.{chars(r, ALNUM, 42)}",
    "npm-short": lambda r: "npm_" + chars(r, ALNUM, 35),
    "hf-short": lambda r: "hf_" + chars(r, string.ascii_letters, 33),
    "pypi-short": lambda r: "pypi-AgEIcHlwaS5vcmc" + chars(r, B64URL, 30),
    "stripe-short": lambda r: "sk_live_" + chars(r, ALNUM, 23),
    "jwt-unsigned": lambda r: _jwt(r, 0),
    "jwt-short-signature": lambda r: _jwt(r, 15),
    "base64-json": lambda r: _b64url_json({"user": r.randrange(10**6), "tags": ["a", "b"]}),
    "sha1": lambda r: chars(r, HEX, 40),
    "sha256": lambda r: chars(r, HEX, 64),
    "uuid": lambda r: str(uuid.UUID(int=r.getrandbits(128), version=4)),
    "base64": lambda r: base64.b64encode(r.randbytes(r.randint(60, 400))).decode(),
    "base64url": lambda r: base64.urlsafe_b64encode(r.randbytes(r.randint(60, 400))).decode(),
    "public-key-pem": lambda r: "\n".join(_pem_lines(r, r.choice(("PUBLIC KEY", "CERTIFICATE", "RSA PUBLIC KEY")))),
    "pem-header-no-body": lambda r: "-----BEGIN RSA PRIVATE KEY-----\n" + "...\n-----END RSA PRIVATE KEY-----",
}
"""Near misses and look-alikes: a ``<<key>>`` placeholder in a negative must stay unmasked."""


def near_misses(family: Family, rng: random.Random) -> dict[str, str]:
    """Near misses generated from one family's grammar, each of which must stay unmasked.

    ``short``: a prefix and a first run one character short of its minimum; ``long``: a fixed-length
    tail one character too long (where every tail character is also a right-boundary one);
    ``in-word``: a valid credential glued to a preceding letter (where the left boundary refuses it).
    The bare ``sk-`` candidate and PEM blocks have grammars of their own, with decoys in ``DECOYS``.
    """
    if isinstance(family, (LlmKeyFamily, PrivateKeyFamily)):
        return {}
    out: dict[str, str] = {}
    prefix = rng.choice(family.prefixes)
    if isinstance(family, AwsKeyFamily) and prefix == "A3T":  # A3T and one key character make the prefix
        prefix += chars(rng, UPPER_DIGITS, 1)
    if family.min_tail >= 2:
        out["short"] = prefix + chars(rng, family.alphabet, family.min_tail - 1)
    if (family.max_tail is not None and not family.segments and family.max_tail == family.min_tail
            and set(family.alphabet) <= set(family.right_boundary)):
        out["long"] = prefix + chars(rng, family.alphabet, family.max_tail + 1)
    if "Q" in family.left_boundary:
        out["in-word"] = "Q" + CREDENTIALS[family.name](rng)
    return out


def render(template: str, rng: random.Random, *, decoys: bool = False) -> tuple[str, list[Finding]]:
    """``template`` with each ``<<key>>`` drawn from ``rng``, and the findings a scan must report.

    ``decoys=False`` reads the keys from ``CREDENTIALS`` (each expects its family's finding);
    ``decoys=True`` from ``DECOYS`` (none expected).
    """
    table = DECOYS if decoys else CREDENTIALS
    parts: list[str] = []
    expected: list[Finding] = []
    size = 0
    pos = 0
    while (open_at := template.find(_OPEN, pos)) >= 0:
        close_at = template.index(_CLOSE, open_at)
        literal = template[pos:open_at]
        key = template[open_at + len(_OPEN):close_at]
        value = table[key](rng)
        start = size + len(literal)
        parts += [literal, value]
        size = start + len(value)
        if not decoys:
            expected.append(Finding(key.split(":")[0], start, size))
        pos = close_at + len(_CLOSE)
    parts.append(template[pos:])
    return "".join(parts), expected


def placeholders(template: str) -> list[str]:
    """The keys of the ``<<key>>`` placeholders in ``template``, in order."""
    keys = []
    pos = 0
    while (open_at := template.find(_OPEN, pos)) >= 0:
        close_at = template.index(_CLOSE, open_at)
        keys.append(template[open_at + len(_OPEN):close_at])
        pos = close_at + len(_CLOSE)
    return keys


def read_fixture(name: str) -> list[tuple[int, str, str]]:
    """``(line number, first column, template)`` per line of a fixture; ``#`` lines are comments."""
    rows = []
    for number, line in enumerate((FIXTURES / name).read_text(encoding="utf-8").splitlines(), start=1):
        if line and not line.startswith("#"):
            label, template = line.split("\t", 1)
            rows.append((number, label, template))
    return rows
