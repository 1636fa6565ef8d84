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
- Not covered, having no literal prefix: AWS secret access keys, Twilio auth tokens, bare passwords.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import NamedTuple

DIGITS = string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
WORD = ALNUM + "_"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdefABCDEF"
BASE64 = ALNUM + "+/="

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


FAMILIES: tuple[Family, ...] = (
    Family("aws-access-key-id", ("AKIA", "ASIA"), UPPER_DIGITS, 16, 16,
           left_boundary=ALNUM, right_boundary=ALNUM),
    Family("github-token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), ALNUM, 36, 36,
           left_boundary=ALNUM, right_boundary=ALNUM),
    Family("github-fine-grained-pat", ("github_pat_",), WORD, 82, 82,
           left_boundary=WORD, right_boundary=WORD),
    Family("gitlab-token", ("glpat-",), B64URL, 20, None, left_boundary=B64URL),
    Family("slack-token", ("xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-"), DIGITS, 1, None,
           left_boundary=ALNUM + "-", segments=(Segment("-", ALNUM + "-", 20, None),)),
    Family("slack-webhook", ("hooks.slack.com/services/",), ALNUM, 8, None, left_boundary=ALNUM,
           segments=(Segment("/", ALNUM, 8, None), Segment("/", ALNUM, 16, None))),
    Family("stripe-secret-key", ("sk_live_", "rk_live_", "sk_test_", "rk_test_"), ALNUM, 24, None,
           left_boundary=ALNUM),
    Family("google-api-key", ("AIza",), B64URL, 35, 35, left_boundary=B64URL, right_boundary=B64URL),
    LlmKeyFamily("llm-api-key", ("sk-",), B64URL, LLM_MIN_TAIL, None, left_boundary=B64URL),
    Family("sendgrid-api-key", ("SG.",), B64URL, 22, 22, left_boundary=B64URL, right_boundary=B64URL,
           segments=(Segment(".", B64URL, 43, 43),)),
    Family("twilio-api-key", ("SK",), HEX, 32, 32, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("npm-token", ("npm_",), ALNUM, 36, 36, left_boundary=ALNUM, right_boundary=ALNUM),
    Family("pypi-token", ("pypi-AgEIcHlwaS5vcmc",), B64URL, 50, None, left_boundary=B64URL),
    Family("huggingface-token", ("hf_",), ALNUM, 34, 34, left_boundary=ALNUM, right_boundary=ALNUM),
    PrivateKeyFamily("private-key", ("-----BEGIN ",), _PEM_LABEL, 0, _PEM_LABEL_MAX, left_boundary=""),
    Family("jwt", ("eyJ",), B64URL, 4, None, left_boundary=B64URL,
           segments=(Segment(".eyJ", B64URL, 4, None), Segment(".", B64URL, 16, None))),
)
"""Every family the guard masks, in no significant order (overlaps resolve by position)."""

FAMILY_BY_NAME: dict[str, Family] = {family.name: family for family in FAMILIES}
PREFIXES: tuple[str, ...] = tuple(prefix for family in FAMILIES for prefix in family.prefixes)
"""Every literal a credential starts with: a cell holding none of them holds no credential."""


def scan_text(text: str) -> list[Finding]:
    """The credential spans in ``text``, in order and non-overlapping (leftmost, then longest)."""
    found: list[Finding] = []
    for family in FAMILIES:
        for prefix in family.prefixes:
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


def mask_text(text: str) -> tuple[str, int]:
    """``text`` with every credential span replaced by its family's token, and the span count."""
    findings = scan_text(text)
    if not findings:
        return text, 0
    parts: list[str] = []
    pos = 0
    for finding in findings:
        parts.append(text[pos:finding.start])
        parts.append(FAMILY_BY_NAME[finding.family].token)
        pos = finding.end
    parts.append(text[pos:])
    return "".join(parts), len(findings)
