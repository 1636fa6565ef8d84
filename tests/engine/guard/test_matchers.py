"""The credential catalogue's matchers: literal anchors, boundaries, grammars, linear work.

Credential-shaped inputs are built by concatenation of made-up characters (``"AKIA" + "Q" * 16``),
never written out, so no credential-shaped literal sits in the repository.
"""

from __future__ import annotations

import ast
import doctest
import random
from pathlib import Path

import contextful.engine.guard
import contextful.engine.guard.arrow
import contextful.engine.guard.catalogue
import contextful.engine.guard.escapes
import contextful.engine.guard.names
import pytest
from contextful.engine.guard.catalogue import (
    FAMILIES,
    PREFIXES,
    Family,
    Finding,
    Segment,
    mask_text,
    scan_text,
)

from tests.engine.guard.synthetic import ALNUM, B64URL, CREDENTIALS, chars

GUARD_SOURCES = sorted(Path(contextful.engine.guard.__file__).parent.glob("*.py"))
A32 = "a1B2c3D4" * 4  # 32 ASCII alphanumerics
HEX32 = "0123456789abcdef" * 2


def spans(text: str) -> list[tuple[str, int, int]]:
    return [(f.family, f.start, f.end) for f in scan_text(text)]


# --- run.guard-secrets.matchers -------------------------------------------------------------------


@pytest.mark.clause("run.guard-secrets.matchers")
@pytest.mark.parametrize("source", GUARD_SOURCES, ids=lambda p: p.name)
def test_the_guard_imports_no_regex_module(source: Path) -> None:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"re", "regex", "sre_compile", "sre_parse", "fnmatch"}, source


@pytest.mark.clause("run.guard-secrets.matchers")
def test_every_family_is_anchored_on_a_literal_prefix() -> None:
    names = [family.name for family in FAMILIES]
    assert len(names) == len(set(names))
    for family in FAMILIES:
        assert family.prefixes and all(isinstance(p, str) and p for p in family.prefixes), family.name
        assert family.token == f"[masked:{family.name}]"
    # Every finding starts with one of its family's prefixes, and nothing fires without one.
    for key, draw in CREDENTIALS.items():
        text = f"x {draw(random.Random(key))} y"
        for finding in scan_text(text):
            family = contextful.engine.guard.catalogue.FAMILY_BY_NAME[finding.family]
            assert text.startswith(family.prefixes, finding.start), key
        stripped = text
        for prefix in PREFIXES:
            stripped = stripped.replace(prefix, "")
        assert scan_text(stripped) == [], key


class CountingStr(str):
    """A str that counts the characters the scanner reads through it (finds, slices, indexing)."""

    steps: int

    def __init__(self, value: str) -> None:
        self.steps = 0

    def find(self, sub: str, start: int | None = 0, end: int | None = None) -> int:  # type: ignore[override]
        start = start or 0
        found = str.find(self, sub, start)
        self.steps += max(1, (found + len(sub) if found >= 0 else len(self)) - start)
        return found

    def startswith(self, prefix, start=None, end=None):  # type: ignore[no-untyped-def,override]
        self.steps += max(map(len, prefix)) if isinstance(prefix, tuple) else len(prefix)
        return str.startswith(self, prefix, start or 0)

    def __getitem__(self, key):  # type: ignore[no-untyped-def,override]
        value = str.__getitem__(self, key)
        self.steps += max(1, len(value))
        return value


ADVERSARIAL = [
    "sk-", "sk- ", "sk-proj-", "AKIA", "eyJ", "eyJaaaa.eyJaaaa.", "ghp_", "SG.", "SK", "glpat-", "xoxb-1-",
    "hooks.slack.com/services/", "-----BEGIN RSA PRIVATE KEY-----\n",
    "-----BEGIN PRIVATE KEY-----\n" + "A" * 64 + "\n", " ".join(PREFIXES) + " ", "-".join(PREFIXES) + "-",
]


@pytest.mark.clause("run.guard-secrets.matchers")
@pytest.mark.parametrize("unit", ADVERSARIAL, ids=lambda u: repr(u[:24]))
def test_scanning_work_grows_linearly_with_adversarial_input(unit: str) -> None:
    # Work is counted, not timed (benchmarks hold the timings): the characters the scanner reads
    # per input character must not grow with the input, as they would for a quadratic scan.
    per_char = []
    for size in (1 << 15, 1 << 17):
        text = CountingStr((unit * (size // len(unit) + 1))[:size])
        scan_text(text)
        per_char.append(text.steps / size)
    assert per_char[1] <= per_char[0] * 1.1, per_char
    assert per_char[1] <= 8 * len(PREFIXES), per_char


def test_one_unbounded_candidate_is_read_once() -> None:
    text = CountingStr("sk-" + "a" * (1 << 17))
    scan_text(text)
    assert text.steps <= 8 * len(PREFIXES) * len(text)


# --- run.guard-secrets.llm-candidate --------------------------------------------------------------


@pytest.mark.clause("run.guard-secrets.llm-candidate")
@pytest.mark.parametrize("before", ["", " ", '"', "'", "=", "/", ":", ".", "(", "\n", "é", "中", "🔑"])
def test_a_candidate_starts_at_input_start_or_after_a_byte_outside_the_alphabet(before: str) -> None:
    text = f"{before}sk-{A32}"
    assert spans(text) == [("llm-api-key", len(before), len(text))]


@pytest.mark.clause("run.guard-secrets.llm-candidate")
@pytest.mark.parametrize("before", ["a", "Z", "9", "-", "_", "task-", "ask", "x_", "risk-"])
def test_no_candidate_starts_after_an_alphanumeric_hyphen_or_underscore(before: str) -> None:
    assert scan_text(f"{before}sk-{A32}{A32}") == []


@pytest.mark.clause("run.guard-secrets.llm-candidate")
def test_the_whole_candidate_is_masked_including_a_tail_beyond_32() -> None:
    tail = A32 + "-more_tail-" + A32 + "_x"
    assert mask_text(f"key=sk-{tail}.") == ("key=[masked:llm-api-key].", 1)
    assert mask_text(f"sk-{tail}") == ("[masked:llm-api-key]", 1)


@pytest.mark.clause("run.guard-secrets.llm-candidate")
@pytest.mark.parametrize("after", [".", " ", "é", "'", "/", "!", "+", "="])
def test_the_tail_ends_at_the_first_byte_outside_the_alphabet(after: str) -> None:
    text = f"sk-{A32}-x_y{after}{A32}"
    assert spans(text) == [("llm-api-key", 0, 3 + 32 + 4)]


@pytest.mark.clause("run.guard-secrets.llm-candidate")
def test_a_non_ascii_byte_cuts_the_tail() -> None:
    assert scan_text(f"sk-{A32[:20]}é{A32}") == []


# --- run.guard-secrets.llm-admission --------------------------------------------------------------


@pytest.mark.clause("run.guard-secrets.llm-admission")
def test_exactly_32_alphanumerics_are_admitted_and_31_are_not() -> None:
    assert spans(f"sk-{A32}") == [("llm-api-key", 0, 35)]
    assert scan_text(f"sk-{A32[:31]}") == []
    assert scan_text(f"sk-{A32[:31]} tail") == []


@pytest.mark.clause("run.guard-secrets.llm-admission")
@pytest.mark.parametrize("position", [0, 1, 15, 31])
@pytest.mark.parametrize("byte", ["-", "_"])
def test_a_hyphen_or_underscore_in_the_first_32_bytes_is_not_admitted(position: int, byte: str) -> None:
    tail = A32[:position] + byte + A32 + A32
    assert scan_text(f"sk-{tail}") == []


@pytest.mark.clause("run.guard-secrets.llm-admission")
def test_hyphens_after_the_first_32_bytes_are_admitted_whole() -> None:
    text = f"sk-{A32}-{A32[:5]}_x"
    assert spans(text) == [("llm-api-key", 0, len(text))]


@pytest.mark.clause("run.guard-secrets.llm-admission")
@pytest.mark.parametrize("prefix", ["proj-", "svcacct-", "service-", "admin-", "ant-"])
def test_an_admitted_prefix_permits_the_whole_tail(prefix: str) -> None:
    rest = ("ab-cd_" * 40)[: 32 - len(prefix)]  # a 32-byte tail full of hyphens and underscores
    text = f"sk-{prefix}{rest}"
    assert spans(text) == [("llm-api-key", 0, len(text))]
    assert mask_text(f'"{text}-{rest}"') == ('"[masked:llm-api-key]"', 1)
    # The prefix does not waive the 32 bytes.
    assert scan_text(f"sk-{prefix}{rest[:-1]}") == []


@pytest.mark.clause("run.guard-secrets.llm-admission")
@pytest.mark.parametrize("tail", [
    "projx-" + "ab-cd_" * 8, "Proj-" + "ab-cd_" * 8, "user-" + "ab-cd_" * 8, "proj" + "ab-cd_" * 8,
    "my-long-hyphenated-package-name-xxxx", "learn-intelex-extension-helpers-2024",
])
def test_other_hyphenated_tails_are_not_admitted(tail: str) -> None:
    assert len(tail) >= 32
    assert scan_text(f"pip install sk-{tail}") == []


# --- the tagged families ----------------------------------------------------------------------------


FAMILY_CASES: list[tuple[str, str, list[tuple[str, int, int]]]] = [
    # (case, text, expected spans)
    ("aws exact", "id=AKIA" + "Q7" * 8 + ";", [("aws-access-key-id", 3, 23)]),
    ("aws sts", "ASIA" + "Q7" * 8, [("aws-access-key-id", 0, 20)]),
    ("aws 15", "AKIA" + "Q" * 15 + " ", []),
    ("aws 17", "AKIA" + "Q" * 17, []),
    ("aws lowercase after", "AKIA" + "Q" * 16 + "x", []),
    ("aws inside word", "XAKIA" + "Q" * 16, []),
    ("aws in prose", "keys start with AKIA or ASIA", []),
    ("aws older form", "k=A3TX" + "Q7" * 8 + ";", [("aws-access-key-id", 2, 22)]),
    ("aws older form 16", "A3T" + "Q7" * 8 + " ", []),
    ("aws older form not a key character", "A3T-" + "Q7" * 8, []),
    ("aws abia acca", "ABIA" + "Q7" * 8 + " ACCA" + "Q7" * 8, [("aws-access-key-id", 0, 20), ("aws-access-key-id", 21, 41)]),
    ("gitlab deploy", "gldt-" + "a-b_c" * 4, [("gitlab-token", 0, 25)]),
    ("gitlab runner registration", "GR1348941" + "a-b_c" * 4, [("gitlab-token", 0, 29)]),
    ("shopify", "shpat_" + HEX32, [("shopify-token", 0, 38)]),
    ("shopify not hex", "shpat_" + HEX32[:31] + "g", []),
    ("postman", "PMAK-" + HEX32[:24] + "-" + HEX32 + "ab", [("postman-api-token", 0, 64)]),
    ("postman no dash", "PMAK-" + HEX32[:24] + HEX32 + "abc", []),
    ("1password 6-11", "A3-ABC123-ABCDEFGHIJK-ABCDE-ABCDE-ABCDE", [("1password-secret-key", 0, 39)]),
    ("1password 6-6", "A3-ABC123-ABC123-ABCDE-ABCDE-ABCDE-ABCDE", [("1password-secret-key", 0, 40)]),
    ("1password too long", "A3-ABC123-ABC123-ABCDE-ABCDE-ABCDE-ABCDEF", []),
    ("teams webhook", "https://acme.webhook.office.com/webhookb2/" + "a" * 36 + "@" + "b" * 36
     + "/IncomingWebhook/" + "c" * 32 + "/" + "d" * 36, [("microsoft-teams-webhook", 13, 201)]),
    ("discord webhook", "https://discord.com/api/webhooks/" + "1" * 18 + "/" + "a-_B" * 17,
     [("discord-webhook", 8, 120)]),
    ("discord webhook short token", "https://discord.com/api/webhooks/" + "1" * 18 + "/" + "abc", []),
    ("github", "t=ghp_" + A32 + "abcd", [("github-token", 2, 42)]),
    ("github every prefix", " ".join(p + A32 + "abcd" for p in ("gho_", "ghu_", "ghs_", "ghr_")),
     [("github-token", i * 41, i * 41 + 40) for i in range(4)]),
    ("github 35", "ghp_" + A32 + "abc", []),
    ("github 37", "ghp_" + A32 + "abcde", []),
    ("github short placeholder", "ghp_x", []),
    ("github pat", "github_pat_" + "a" * 22 + "_" + "b" * 59 + " ", [("github-fine-grained-pat", 0, 93)]),
    ("github pat 81", "github_pat_" + "a" * 81 + " ", []),
    ("gitlab 20", "glpat-" + "a-b_c" * 4, [("gitlab-token", 0, 26)]),
    ("gitlab longer", "glpat-" + "ab" * 20 + "'", [("gitlab-token", 0, 46)]),
    ("gitlab 19", "glpat-" + "a" * 19, []),
    ("slack bot", "xoxb-123456789012-1234567890123-" + "Ab" * 12, [("slack-token", 0, 56)]),
    ("slack placeholder", "xoxb-your-bot-token-goes-here-please-now", []),
    ("slack webhook", "https://hooks.slack.com/services/T0AB1CD2E/B0AB1CD2E/" + "Ab3" * 8 + "\"",
     [("slack-webhook", 8, 77)]),
    ("slack webhook short", "https://hooks.slack.com/services/T000/B000/XXXX", []),
    ("stripe live", "sk_live_" + "Ab3" * 8, [("stripe-secret-key", 0, 32)]),
    ("stripe restricted", "rk_live_" + "Ab3" * 30 + ":", [("stripe-secret-key", 0, 98)]),
    ("stripe test", "sk_test_" + "Ab3" * 8, [("stripe-secret-key", 0, 32)]),
    ("stripe 23", "sk_live_" + "a" * 23, []),
    ("stripe publishable", "pk_live_" + "Ab3" * 8, []),
    ("google", "key=AIza" + "a-_" * 11 + "bc&", [("google-api-key", 4, 43)]),
    ("google 34", "AIza" + "a" * 34, []),
    ("google 36", "AIza" + "a" * 36, []),
    ("sendgrid", "SG." + "a" * 22 + "." + "b-" * 21 + "c", [("sendgrid-api-key", 0, 69)]),
    ("sendgrid short", "SG." + "a" * 22 + "." + "b" * 42, []),
    ("sendgrid no dot", "SG." + "a" * 66, []),
    ("twilio key", "SK" + HEX32 + " ", [("twilio-api-key", 0, 34)]),
    ("twilio non-hex", "SK" + HEX32[:31] + "g", []),
    ("twilio in word", "TASK" + HEX32, []),
    ("twilio account sid", "AC" + HEX32, []),
    ("npm", "_authToken=npm_" + A32 + "abcd", [("npm-token", 11, 51)]),
    ("npm config", "npm_config_cache=/tmp", []),
    ("pypi", "pypi-AgEIcHlwaS5vcmc" + "ab-_" * 30, [("pypi-token", 0, 140)]),
    ("pypi short", "pypi-AgEIcHlwaS5vcmc" + "ab" * 20, []),
    ("huggingface", "hf_" + "abcDEFghij" * 3 + "klmn", [("huggingface-token", 0, 37)]),
    ("huggingface identifier", "hf_hub_download", []),
    ("jwt", "Bearer eyJhbGc.eyJzdWIi." + "s" * 20, [("jwt", 7, 44)]),
    ("jwt unsigned", "eyJhbGc.eyJzdWIi.", []),
    ("jwt one segment", "eyJhbGciOiJIUzI1NiJ9", []),
    ("jwt payload not json", "eyJhbGc.abcdefg." + "s" * 20, []),
]


@pytest.mark.parametrize(("case", "text", "expected"), FAMILY_CASES, ids=[c[0] for c in FAMILY_CASES])
def test_family_grammar(case: str, text: str, expected: list[tuple[str, int, int]]) -> None:
    assert spans(text) == expected


def _pem(label: str, body: str) -> str:
    return f"-----BEGIN {label}-----{body}-----END {label}-----"


def test_a_pem_private_key_block_is_masked_whole() -> None:
    body = "\n" + "\n".join(chars(random.Random(i), ALNUM + "+/", 64) for i in range(4)) + "\nAb==\n"
    for label in ("RSA PRIVATE KEY", "PRIVATE KEY", "OPENSSH PRIVATE KEY", "PGP PRIVATE KEY BLOCK"):
        block = _pem(label, body)
        assert mask_text(f"key: {block}\nnext line") == ("key: [masked:private-key]\nnext line", 1)
        escaped = block.replace("\n", "\\n")
        assert mask_text(f'{{"k":"{escaped}\\n"}}') == ('{"k":"[masked:private-key]\\n"}', 1)


def test_a_pem_block_cut_before_its_end_line_is_masked_through_its_body() -> None:
    body = "\n".join(chars(random.Random(i), ALNUM + "+/", 64) for i in range(3))
    assert mask_text(f'{{"k":"-----BEGIN EC PRIVATE KEY-----\n{body}"}}') == ('{"k":"[masked:private-key]"}', 1)


def test_pem_public_blocks_and_bare_headers_are_not_masked() -> None:
    body = "\n" + "\n".join(chars(random.Random(i), ALNUM + "+/", 64) for i in range(3)) + "\n"
    assert scan_text(_pem("PUBLIC KEY", body)) == []
    assert scan_text(_pem("CERTIFICATE", body)) == []
    assert scan_text(_pem("RSA PRIVATE KEY", "\n...\n")) == []
    assert scan_text("a file starts with -----BEGIN RSA PRIVATE KEY----- and ends with an END line") == []


def test_overlapping_findings_keep_the_leftmost_longest() -> None:
    inner = "AKIA" + "Q" * 16
    body = "\n" + chars(random.Random(1), ALNUM, 64) + "\n" + inner + "\n"
    block = _pem("RSA PRIVATE KEY", body)
    assert spans(block) == [("private-key", 0, len(block))]


def test_several_credentials_in_one_cell_are_masked_in_place() -> None:
    aws, npm = "AKIA" + "Q" * 16, "npm_" + A32 + "abcd"
    text = f"é{aws}é and {npm}, then sk-{A32}"
    assert mask_text(text) == (
        "é[masked:aws-access-key-id]é and [masked:npm-token], then [masked:llm-api-key]", 3)


def test_masking_is_idempotent_and_tokens_hold_no_prefix() -> None:
    for family in FAMILIES:
        assert scan_text(family.token) == []
        assert scan_text(f"sk-{family.token}") == []


def test_random_text_without_prefixes_is_never_scanned_into_a_finding() -> None:
    rng = random.Random(7)
    for _ in range(200):
        text = chars(rng, B64URL + " .é/:=", rng.randint(0, 400))
        for finding in scan_text(text):
            assert text.startswith(contextful.engine.guard.catalogue.FAMILY_BY_NAME[finding.family].prefixes, finding.start)


def test_a_family_whose_unbounded_run_escapes_its_left_boundary_is_refused() -> None:
    with pytest.raises(ValueError, match="left boundary"):
        Family("bad", ("x_",), ALNUM, 8, None, left_boundary="")
    with pytest.raises(ValueError, match="lead"):
        Family("bad", ("x_",), ALNUM, 8, 8, left_boundary=ALNUM, segments=(Segment("a", ALNUM, 1, 1),))


def test_finding_is_a_plain_tuple() -> None:
    assert Finding("jwt", 1, 2) == ("jwt", 1, 2)


@pytest.mark.parametrize("module", [contextful.engine.guard, contextful.engine.guard.catalogue, contextful.engine.guard.arrow, contextful.engine.guard.escapes,
                                    contextful.engine.guard.names],
                         ids=lambda m: m.__name__)
def test_module_examples_run(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert result.attempted and not result.failed
