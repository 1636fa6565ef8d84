"""The credential catalogue: one literal-anchored, regex-free matcher per credential family.

Implements decision ``secret-guard-has`` (clauses ``run.guard-secrets.matchers``,
``run.guard-secrets.llm-candidate`` and ``run.guard-secrets.llm-admission``). The catalogue lives in
code, so a manifest edit cannot change what the host considers a secret; a change here carries a
fixture review (``tests/engine/guard/fixtures``, scored by ``test_precision_recall.py``).

A family is a literal prefix followed by a tail: one or more segments, each a run of one alphabet
with a minimum and maximum length, later segments introduced by a literal (``SG.`` + 22 + ``.`` +
43). A match needs a left boundary (the character before the prefix is not in ``left_boundary``, so
a prefix inside a longer word does not fire) and, for fixed-length families, a right boundary (the
character after the tail is not in ``right_boundary``). A variable-length segment takes its whole
maximal run. Two families need a grammar of their own: ``llm-api-key`` (the bare ``sk-`` candidate
and its admission rule) and ``private-key`` (a PEM block, masked whole).

Linear time: every prefix is found with ``str.find`` moving forward only; a failed candidate
resumes one character later, and a prefix occurrence inside a run an earlier candidate already
scanned is rejected in O(1) by its left boundary (``__post_init__`` checks that every
variable-length alphabet is inside its family's left boundary). Fixed-length segments read at most
their maximum. So the work per family is a constant times the text length, whatever the text.

A masked span becomes ``[masked:<family>]``, the rest of the text stays::

    >>> key = "AKIA" + "Q" * 16
    >>> mask_text(f"aws_access_key_id={key}\\n")
    ('aws_access_key_id=[masked:aws-access-key-id]\\n', 1)
    >>> scan_text("pip install sk-learn-intelex-extension-helpers-2024")
    []

Decisions beyond the spec (the family list is ``FAMILIES`` below):

- Stripe: secret and restricted keys (``sk_live_``, ``rk_live_``, ``sk_test_``, ``rk_test_``) are
  masked; publishable keys (``pk_live_``, ``pk_test_``) are not: Stripe designs them to be embedded
  in public web pages, so masking them would only damage data.
- Twilio: ``SK`` + 32 hex (an API key SID, which travels with its secret and which secret scanners
  treat as the credential's anchor) is masked; ``AC`` + 32 hex (an account SID, an identifier that
  appears in every API URL) is not.
- JWT: header and payload both start ``eyJ`` (base64url of ``{"``); the signature needs at least 16
  characters, so an unsigned ``alg: none`` token (no bearer proof) is not masked.
- Slack tokens need their numeric first part (``xoxb-<digits>-...``), so documentation
  placeholders such as ``xoxb-your-bot-token-goes-here`` stay.
- GitLab tokens take ``glpat-`` plus at least 20 characters of ``[A-Za-z0-9_-]`` (the classic token
  is exactly 20; newer ones are longer), the whole run masked.
- A PEM block runs from ``-----BEGIN <label>PRIVATE KEY-----`` (or ``PRIVATE KEY BLOCK``, PGP)
  through its ``-----END ...-----`` line, across real or JSON-escaped newlines; a block cut before
  its END line is masked through the end of its body. A header needs a body with a 40-character
  base64 line, so prose that merely names the header is not masked.
- AWS key ids: ``AKIA``/``ASIA``/``ABIA``/``ACCA`` + 16, or ``A3T`` + 17 (:class:`AwsKeyFamily`).
- Breadth: every family of gitleaks' default rule set whose credential starts with a literal
  prefix, grouped by issuer (cloud, source hosts, chat and webhooks, payments, registries, AI);
  ``docs/guard.md`` lists each family beside its gitleaks rule ids, and the rules not covered
  (keyword-anchored bare runs, prefixes too short to anchor alone, infix or suffix anchors).
- Not covered, having no literal prefix: AWS secret access keys, Twilio auth tokens, bare passwords.
"""

from __future__ import annotations

import base64
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

DIGITS = string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
WORD = ALNUM + "_"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdefABCDEF"
LOWER_DIGITS = string.ascii_lowercase + string.digits
BECH32 = "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L"
BASE64 = ALNUM + "+/="
B64STD = ALNUM + "+/"

_RUN_CHUNK = 256
"""Characters examined per C-level ``lstrip`` when measuring an unbounded run."""


class Finding(NamedTuple):
    """One credential span: ``text[start:end]`` belongs to ``family``."""

    family: str
    start: int
    end: int


def _run_end(text: str, i: int, chars: str, limit: int | None = None) -> int:
    """The end of the run of ``chars`` starting at ``i``, reading at most ``limit`` characters."""
    if limit is not None:
        chunk = text[i:i + limit]
        return i + len(chunk) - len(chunk.lstrip(chars))
    n = len(text)
    while i < n:
        chunk = text[i:i + _RUN_CHUNK]
        rest = len(chunk.lstrip(chars))
        if rest:
            return i + len(chunk) - rest
        i += len(chunk)
    return n


@dataclass(frozen=True)
class Segment:
    """A later part of a tail: the literal ``lead`` and then a run of ``alphabet``."""

    lead: str
    """The literal between the previous part and this run (``.`` in ``SG.<22>.<43>``)."""
    alphabet: str
    """The characters the run may hold."""
    min_len: int
    """The fewest characters the run must hold."""
    max_len: int | None
    """The most characters the run may hold; ``None`` takes the whole maximal run."""


@dataclass(frozen=True)
class Family:
    """A credential family: literal prefixes, then a tail of one alphabet and further segments."""

    name: str
    """The family's name; a masked span becomes ``[masked:<name>]``."""
    prefixes: tuple[str, ...]
    """The literals a credential starts with; every match is anchored on one of them."""
    alphabet: str
    """The characters of the tail's first run (right after the prefix)."""
    min_tail: int
    """The fewest characters of that first run."""
    max_tail: int | None
    """The most characters of that first run; ``None`` takes the whole maximal run."""
    left_boundary: str
    """Characters that must not stand right before the prefix ("" for no rule)."""
    right_boundary: str = ""
    """Characters that must not stand right after the tail (fixed-length families)."""
    segments: tuple[Segment, ...] = ()
    """The tail's further parts, in order, each introduced by its literal lead."""
    _left: frozenset[str] = field(init=False, repr=False, compare=False)
    _right: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_left", frozenset(self.left_boundary))
        object.__setattr__(self, "_right", frozenset(self.right_boundary))
        if not self.prefixes or not all(self.prefixes):
            raise ValueError(f"family {self.name} needs non-empty literal prefixes")
        runs = [(self.alphabet, self.max_tail), *((s.alphabet, s.max_len) for s in self.segments)]
        # The linear-time argument: a prefix occurrence inside an unbounded run already scanned
        # must be rejected by the left boundary in O(1).
        for alphabet, max_len in runs:
            if max_len is None and not set(alphabet) <= self._left:
                raise ValueError(f"family {self.name}: an unbounded run escapes the left boundary")
        # Greedy runs need no backtracking: a run never swallows the literal that follows it.
        for (alphabet, _), segment in zip(runs, self.segments):
            if not segment.lead or segment.lead[0] in alphabet:
                raise ValueError(f"family {self.name}: lead {segment.lead!r} is inside the run before it")

    @property
    def token(self) -> str:
        """The text a masked span of this family becomes."""
        return f"[masked:{self.name}]"

    def match(self, text: str, start: int, prefix: str) -> int:
        """The end of the credential whose ``prefix`` sits at ``text[start]``, or -1 for none."""
        if start and text[start - 1] in self._left:
            return -1
        end = self._tail_end(text, start + len(prefix))
        if end < 0 or (self._right and end < len(text) and text[end] in self._right):
            return -1
        return end

    def _tail_end(self, text: str, i: int) -> int:
        end = _run_end(text, i, self.alphabet, self.max_tail)
        if end - i < self.min_tail:
            return -1
        for segment in self.segments:
            if not text.startswith(segment.lead, end):
                return -1
            i = end + len(segment.lead)
            end = _run_end(text, i, segment.alphabet, segment.max_len)
            if end - i < segment.min_len:
                return -1
        return end


LLM_ADMITTED_PREFIXES = ("proj-", "svcacct-", "service-", "admin-", "ant-")
LLM_MIN_TAIL = 32


@dataclass(frozen=True)
class LlmKeyFamily(Family):
    """The bare ``sk-`` candidate, whose admission is narrower than a tagged family's.

    ``run.guard-secrets.llm-candidate``: a candidate starts with ``sk-`` at input start or after a
    character outside ``[A-Za-z0-9_-]``, and its tail is the maximal run of that alphabet.
    ``run.guard-secrets.llm-admission``: the tail holds at least 32 bytes; a tail starting with an
    admitted prefix (``proj-``, ``svcacct-``, ``service-``, ``admin-``, ``ant-``) is admitted
    whole, any other needs its first 32 bytes ASCII alphanumeric. Admission masks the whole
    candidate, so ``sk-my-long-hyphenated-package-name`` stays and ``sk-`` + 48 alnum goes.
    """

    def _tail_end(self, text: str, i: int) -> int:
        end = _run_end(text, i, self.alphabet)
        if end - i < LLM_MIN_TAIL:
            return -1
        if text.startswith(LLM_ADMITTED_PREFIXES, i) or _run_end(text, i, ALNUM, LLM_MIN_TAIL) - i == LLM_MIN_TAIL:
            return end
        return -1


@dataclass(frozen=True)
class AwsKeyFamily(Family):
    """AWS access key ids: a four-letter prefix and 16 characters, or ``A3T``, one key character
    and 16 (the older form), so every prefix stays a literal the prefilter can search."""

    def match(self, text: str, start: int, prefix: str) -> int:
        if len(prefix) == 3:
            if not text.startswith(tuple(UPPER_DIGITS), start + 3):
                return -1
            prefix = text[start:start + 4]
        return super().match(text, start, prefix)


_PEM_LABEL = string.ascii_uppercase + string.digits + " "
_PEM_LABEL_MAX = 40
_PEM_ENDINGS = ("PRIVATE KEY", "PRIVATE KEY BLOCK")
_PEM_SEPARATORS = " \t\r\n\\:,"
_PEM_MIN_LINE = 40
_DASHES = "-----"


@dataclass(frozen=True)
class PrivateKeyFamily(Family):
    """A PEM private key block, from its BEGIN line through its END line, masked whole.

    The body is read forward over base64, whitespace, backslashes (JSON-escaped newlines) and the
    ``Proc-Type:``/``DEK-Info:`` header characters; a single ``-`` inside it (``AES-128-CBC``) is
    body, five dashes end it. Each character is read once, by the one block whose body holds it.
    """

    def _tail_end(self, text: str, i: int) -> int:
        label_end = _run_end(text, i, _PEM_LABEL, _PEM_LABEL_MAX)
        label = text[i:label_end]
        if not label.endswith(_PEM_ENDINGS) or not text.startswith(_DASHES, label_end):
            return -1
        j = label_end + len(_DASHES)
        longest = 0
        while True:  # a turn per base64 run: bounded by this body, which no other block reads
            body_end = _run_end(text, j, BASE64)
            longest = max(longest, body_end - j)
            j = _run_end(text, body_end, _PEM_SEPARATORS)
            if j == body_end:
                if not text.startswith("-", j) or text.startswith(_DASHES, j):
                    break
                j += 1
        if longest < _PEM_MIN_LINE:
            return -1
        if text.startswith("-----END ", body_end):
            close = _run_end(text, body_end + 9, _PEM_LABEL, _PEM_LABEL_MAX)
            return close + len(_DASHES) if text.startswith(_DASHES, close) else close
        return body_end


_JOSE_HEADER_NAMES = ("alg", "apu", "apv", "aud", "b64", "crit", "cty", "epk", "enc", "jku", "jwk", "iss", "iv",
                      "kid", "key_ops", "kty", "nonce", "p2c", "p2s", "ppt", "sub", "svt", "tag", "typ", "url",
                      "use", "ver", "version", "x", "x5c", "x5t", "x5t#S256", "x5u", "zip")
"""The JOSE header parameters a JWT header may start with (RFC 7515, 7516, 7518, 7797, 8225)."""


def _stable_base64(data: bytes, *, url: bool) -> str:
    """The leading characters of the base64 of ``data`` that no byte after ``data`` can change."""
    encoded = (base64.urlsafe_b64encode if url else base64.b64encode)(data).decode("ascii")
    return encoded[:len(data) * 8 // 6]


_JWT_BASE64_PREFIXES = tuple(dict.fromkeys(
    _stable_base64(_stable_base64(f'{{"{name}":'.encode(), url=True).encode(), url=False)
    for name in _JOSE_HEADER_NAMES))
"""A JWT base64-encoded once more: the base64 of the base64url of ``{"<header parameter>":``."""

_GITLAB_PREFIXES = ("glpat-", "gldt-", "glrt-", "glcbt-", "glffct-", "glft-", "glimt-", "glagent-", "gloas-",
                    "glptt-", "glsoat-", "GR1348941")

FAMILIES: tuple[Family, ...] = (
    # Cloud providers
    AwsKeyFamily("aws-access-key-id", ("AKIA", "ASIA", "ABIA", "ACCA", "A3T"), UPPER_DIGITS, 16, 16,
                 left_boundary=ALNUM, right_boundary=ALNUM),
    Family("google-api-key", ("AIza",), B64URL, 35, 35, left_boundary=B64URL, right_boundary=B64URL),
    Family("alibaba-access-key-id", ("LTAI",), ALNUM, 20, 20, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("cloudflare-origin-ca-key", ("v1.0-",), HEX, 24, 24, left_boundary=ALNUM, right_boundary=ALNUM,
           segments=(Segment("-", HEX, 146, 146),)),
    Family("digitalocean-token", ("dop_v1_", "doo_v1_", "dor_v1_"), HEX, 64, 64,
           left_boundary=ALNUM, right_boundary=ALNUM),
    Family("heroku-api-key", ("HRKU-AA",), B64URL, 58, 58, left_boundary=ALNUM, right_boundary=B64URL),
    Family("flyio-access-token", ("fo1_",), B64URL, 43, 43, left_boundary=ALNUM, right_boundary=B64URL),
    Family("flyio-macaroon", ("fm1a_", "fm1r_", "fm2_"), B64STD, 100, None, left_boundary=B64STD),
    Family("scalingo-api-token", ("tk-us-",), B64URL, 48, 48, left_boundary=ALNUM, right_boundary=B64URL),
    Family("databricks-api-token", ("dapi",), HEX, 32, 32, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("vault-token", ("hvs.", "hvb."), B64URL, 90, None, left_boundary=B64URL),
    Family("pulumi-api-token", ("pul-",), HEX, 40, 40, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("planetscale-token", ("pscale_tkn_", "pscale_oauth_", "pscale_pw_"), B64URL + "=", 32, 64,
           left_boundary=ALNUM, right_boundary=B64URL + "="),
    Family("doppler-api-token", ("dp.pt.",), ALNUM, 43, 43, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("dynatrace-api-token", ("dt0c01.",), ALNUM, 24, 24, left_boundary=ALNUM, right_boundary=ALNUM,
           segments=(Segment(".", ALNUM, 64, 64),)),
    Family("grafana-api-key", ("eyJrIjoi",), ALNUM, 70, None, left_boundary=B64STD + "-_"),
    Family("grafana-cloud-api-token", ("glc_",), B64STD, 32, None, left_boundary=B64STD),
    Family("grafana-service-account-token", ("glsa_",), ALNUM, 32, 32, left_boundary=ALNUM,
           right_boundary=ALNUM, segments=(Segment("_", HEX, 8, 8),)),
    Family("new-relic-user-api-key", ("NRAK-",), ALNUM, 27, 27, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("new-relic-insert-key", ("NRII-",), ALNUM + "-", 32, 32, left_boundary=ALNUM,
           right_boundary=ALNUM + "-"),
    Family("sentry-user-token", ("sntryu_",), HEX, 64, 64, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("sentry-org-token", ("sntrys_eyJpYXQiO",), BASE64, 20, 500, left_boundary=ALNUM,
           right_boundary=B64STD, segments=(Segment("_", B64STD, 43, 43),)),
    Family("openshift-user-token", ("sha256~",), B64URL, 43, 43, left_boundary=ALNUM, right_boundary=B64URL),
    Family("octopus-deploy-api-key", ("API-",), UPPER_DIGITS, 26, 26, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("clickhouse-cloud-api-secret-key", ("4b1d",), ALNUM, 38, 38, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("harness-api-key", ("pat.", "sat."), B64URL, 22, 22, left_boundary=ALNUM, right_boundary=ALNUM,
           segments=(Segment(".", ALNUM, 24, 24), Segment(".", ALNUM, 20, 20))),
    Family("infracost-api-token", ("ico-",), ALNUM, 32, 32, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("defined-networking-api-token", ("dnkey-",), B64URL + "=", 79, 79, left_boundary=ALNUM,
           right_boundary=B64URL + "="),
    # Source hosts and CI
    Family("github-token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), ALNUM, 36, 36,
           left_boundary=ALNUM, right_boundary=ALNUM),
    Family("github-fine-grained-pat", ("github_pat_",), WORD, 82, 82, left_boundary=WORD, right_boundary=WORD),
    Family("gitlab-token", _GITLAB_PREFIXES, B64URL, 20, None, left_boundary=B64URL),
    Family("gitlab-session-cookie", ("_gitlab_session=",), LOWER_DIGITS, 32, 32, left_boundary="",
           right_boundary=ALNUM),
    Family("sourcegraph-access-token", ("sgp_",), HEX + "_lo", 40, 62, left_boundary=ALNUM,
           right_boundary=WORD),
    Family("atlassian-api-token", ("ATATT3",), B64URL + "=", 186, 186, left_boundary=ALNUM,
           right_boundary=B64URL + "="),
    Family("linear-api-key", ("lin_api_",), ALNUM, 40, 40, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("notion-api-token", ("ntn_",), ALNUM, 46, 46, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("postman-api-token", ("PMAK-",), HEX, 24, 24, left_boundary=ALNUM, right_boundary=ALNUM,
           segments=(Segment("-", HEX, 34, 34),)),
    Family("prefect-api-token", ("pnu_",), ALNUM, 36, 36, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("readme-api-token", ("rdme_",), LOWER_DIGITS, 70, 70, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("typeform-api-token", ("tfp_",), B64URL + "=", 59, 59, left_boundary=ALNUM,
           right_boundary=B64URL + "="),
    Family("frameio-api-token", ("fio-u-",), B64URL + "=", 64, 64, left_boundary=ALNUM,
           right_boundary=B64URL + "="),
    Family("1password-secret-key", ("A3-",), UPPER_DIGITS, 6, 6, left_boundary=ALNUM,
           right_boundary=ALNUM + "-", segments=(Segment("-", UPPER_DIGITS + "-", 29, 30),)),
    Family("1password-service-account-token", ("ops_eyJ",), B64STD, 250, None, left_boundary=B64STD),
    Family("adobe-client-secret", ("p8e-",), ALNUM, 32, 32, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("age-secret-key", ("AGE-SECRET-KEY-1",), BECH32, 58, 58, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("artifactory-api-key", ("AKCp",), ALNUM, 69, 69, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("artifactory-reference-token", ("cmVmd",), ALNUM, 59, 59, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("intra42-client-secret", ("s-s4t2ud-", "s-s4t2af-"), HEX, 64, 64, left_boundary=ALNUM,
           right_boundary=ALNUM),
    # Chat, webhooks and bots
    Family("slack-token", ("xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xoxo-", "xoxe-", "xoxe.xoxb-",
                           "xoxe.xoxp-", "xapp-"), DIGITS, 1, None,
           left_boundary=ALNUM + "-", segments=(Segment("-", ALNUM + "-", 20, None),)),
    Family("slack-webhook", ("hooks.slack.com/services/",), ALNUM, 8, None, left_boundary=ALNUM,
           segments=(Segment("/", ALNUM, 8, None), Segment("/", ALNUM, 16, None))),
    Family("slack-workflow-webhook", ("hooks.slack.com/workflows/", "hooks.slack.com/triggers/"),
           ALNUM + "+/", 43, 56, left_boundary=ALNUM, right_boundary=ALNUM + "+/"),
    Family("discord-webhook", ("discord.com/api/webhooks/", "discordapp.com/api/webhooks/"), DIGITS, 17, 20,
           left_boundary=B64URL, segments=(Segment("/", B64URL, 60, None),)),
    Family("microsoft-teams-webhook", ("webhook.office.com/webhookb2/",), ALNUM + "-", 36, 36,
           left_boundary=ALNUM, right_boundary=ALNUM,
           segments=(Segment("@", ALNUM + "-", 36, 36), Segment("/IncomingWebhook/", ALNUM, 32, 32),
                     Segment("/", ALNUM + "-", 36, 36))),
    Family("twilio-api-key", ("SK",), HEX, 32, 32, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("sendgrid-api-key", ("SG.",), B64URL, 22, 22, left_boundary=B64URL, right_boundary=B64URL,
           segments=(Segment(".", B64URL, 43, 43),)),
    Family("sendinblue-api-token", ("xkeysib-",), HEX, 64, 64, left_boundary=ALNUM, right_boundary=ALNUM,
           segments=(Segment("-", ALNUM, 16, 16),)),
    # Payments and commerce
    Family("stripe-secret-key", ("sk_live_", "rk_live_", "sk_test_", "rk_test_", "sk_prod_", "rk_prod_"),
           ALNUM, 24, None, left_boundary=ALNUM),
    Family("square-access-token", ("sq0atp-", "EAAA"), B64URL, 22, 60, left_boundary=ALNUM,
           right_boundary=B64URL),
    Family("facebook-page-access-token", ("EAAM", "EAAC"), ALNUM, 100, None, left_boundary=ALNUM),
    Family("shopify-token", ("shpat_", "shpca_", "shppa_", "shpss_"), HEX, 32, 32, left_boundary=ALNUM,
           right_boundary=ALNUM),
    Family("flutterwave-secret-key", ("FLWSECK_TEST-",), "abcdefghABCDEFGH0123456789", 12, None,
           left_boundary=ALNUM),
    Family("duffel-api-token", ("duffel_test_", "duffel_live_"), B64URL + "=", 43, 43, left_boundary=ALNUM,
           right_boundary=B64URL + "="),
    Family("easypost-api-token", ("EZAK", "EZTK"), ALNUM, 54, 54, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("shippo-api-token", ("shippo_live_", "shippo_test_"), HEX, 40, 40, left_boundary=ALNUM,
           right_boundary=ALNUM),
    Family("plaid-access-token", ("access-sandbox-", "access-development-", "access-production-"), HEX + "-",
           36, 36, left_boundary=ALNUM, right_boundary=ALNUM + "-"),
    Family("settlemint-token", ("sm_aat_", "sm_pat_", "sm_sat_"), ALNUM, 16, 16, left_boundary=ALNUM,
           right_boundary=ALNUM),
    # Package registries
    Family("npm-token", ("npm_",), ALNUM, 36, 36, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("pypi-token", ("pypi-AgEIcHlwaS5vcmc",), B64URL, 50, None, left_boundary=B64URL),
    Family("rubygems-api-token", ("rubygems_",), HEX, 48, 48, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("clojars-api-token", ("CLOJARS_", "clojars_"), ALNUM, 60, 60, left_boundary=ALNUM,
           right_boundary=ALNUM),
    # AI providers
    LlmKeyFamily("llm-api-key", ("sk-",), B64URL, LLM_MIN_TAIL, None, left_boundary=B64URL),
    Family("huggingface-token", ("hf_", "api_org_"), ALNUM, 34, 34, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("perplexity-api-key", ("pplx-",), ALNUM, 48, 48, left_boundary=ALNUM, right_boundary=ALNUM),
    # Keys and tokens of any issuer
    PrivateKeyFamily("private-key", ("-----BEGIN ",), _PEM_LABEL, 0, _PEM_LABEL_MAX, left_boundary=""),
    Family("jwt", ("eyJ",), B64URL, 4, None, left_boundary=B64URL,
           segments=(Segment(".eyJ", B64URL, 4, None), Segment(".", B64URL, 16, None))),
    Family("jwt-base64", _JWT_BASE64_PREFIXES, B64STD + "-_", 40, None, left_boundary=B64STD + "-_"),
    # Contextful's own: served-face reader and writer keys, signed credentials (docs/served.md)
    Family("contextful-key", ("cfr_", "cfw_"), HEX, 16, 16, left_boundary=ALNUM, right_boundary=B64URL,
           segments=(Segment("_", B64URL, 43, 43),)),
    Family("contextful-signed-credential", ("cfc1.",), B64URL, 20, None, left_boundary=B64URL,
           right_boundary=B64URL, segments=(Segment(".", B64URL, 86, 86),)),
)
"""Every family the guard masks, in no significant order (overlaps resolve by position)."""

FAMILY_BY_NAME: dict[str, Family] = {family.name: family for family in FAMILIES}
PREFIXES: tuple[str, ...] = tuple(prefix for family in FAMILIES for prefix in family.prefixes)
"""Every literal a credential starts with: a cell holding none of them holds no credential."""
PREFIX_FAMILIES: tuple[Family, ...] = tuple(family for family in FAMILIES for _ in family.prefixes)
"""The family of each of ``PREFIXES``, by position."""


def scan_text(text: str, prefixes: Iterable[int] | None = None) -> list[Finding]:
    """The credential spans in ``text``, in order and non-overlapping (leftmost, then longest).

    ``prefixes`` (indices into ``PREFIXES``) limits the scan to those prefixes: the ones the
    prefilter saw in this text (every other prefix is absent from it, so the answer is the same).
    """
    found: list[Finding] = []
    for i in range(len(PREFIXES)) if prefixes is None else sorted(prefixes):
        family, prefix = PREFIX_FAMILIES[i], PREFIXES[i]
        pos = text.find(prefix)
        while pos >= 0:
            end = family.match(text, pos, prefix)
            if end > pos:
                found.append(Finding(family.name, pos, end))
                pos = text.find(prefix, end)
            else:
                pos = text.find(prefix, pos + 1)
    if len(found) < 2:
        return found
    found.sort(key=lambda f: (f.start, -f.end))
    kept = [found[0]]
    for finding in found[1:]:
        if finding.start >= kept[-1].end:
            kept.append(finding)
    return kept


def mask_text(text: str, prefixes: Iterable[int] | None = None) -> tuple[str, int]:
    """``text`` with every credential span replaced by its family's token, and the span count
    (``prefixes`` as in :func:`scan_text`)."""
    findings = scan_text(text, prefixes)
    return replace_spans(text, findings), len(findings)


def replace_spans(text: str, findings: list[Finding], *, keep_width: bool = False) -> str:
    """``text`` with each finding's span replaced by its family's token.

    ``keep_width`` fits each token to its span's length (cut, or padded with ``*``), for cells
    whose width is fixed (``fixed_size_binary``); spans are ASCII, so characters are bytes.
    """
    if not findings:
        return text
    parts: list[str] = []
    pos = 0
    for finding in findings:
        parts.append(text[pos:finding.start])
        token = FAMILY_BY_NAME[finding.family].token
        if keep_width:
            width = finding.end - finding.start
            token = token[:width].ljust(width, "*")
        parts.append(token)
        pos = finding.end
    parts.append(text[pos:])
    return "".join(parts)
