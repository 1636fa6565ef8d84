"""Per-family precision and recall of the credential catalogue on the reviewed fixture corpus.

``fixtures/positives.tsv`` places synthetic credentials in realistic contexts (log lines, JSON,
URLs, code, CSV cells, start and end of a cell, several per cell, unicode neighbours);
``fixtures/negatives.tsv`` holds hard negatives (hashes, uuids, base64 blobs, ``sk-`` package
names and slugs, prefixes in prose and inside words, near misses of every grammar). Each template
is drawn ``DRAWS`` times from seeded generators (``synthetic.py``). A finding counts as a true
positive only when family, start and end all equal the placed credential's.

Run with ``-s`` to see the table.
"""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest
from contextful.engine.guard import guard_table, mask_message, mask_name
from contextful.engine.guard.catalogue import FAMILIES, Finding, mask_text, scan_text

from tests.engine.guard.synthetic import (
    CREDENTIALS,
    DECOYS,
    near_misses,
    placeholders,
    read_fixture,
    render,
)

DRAWS = 4
RECALL_FLOOR = 1.0
PRECISION_FLOOR = 1.0  # every family scored 1.000 precision and recall before the catalogue grew (2026-12-01)
NAMES = [family.name for family in FAMILIES]
NEAR_MISS_CONTEXTS = ("id {} end", '{{"token":"{}"}}', "{}", "key={};")
"""Where the near misses generated from each family's grammar (``synthetic.near_misses``) are placed."""


def _positive_templates() -> list[tuple[str, str, str]]:
    """``(case id, families column, template)``, with ``*`` lines instantiated per family."""
    cases = []
    for number, label, template in read_fixture("positives.tsv"):
        if label == "*":
            for name in NAMES:
                cases.append((f"positives:{number}:{name}", name, template.replace("<<*>>", f"<<{name}>>")))
        else:
            cases.append((f"positives:{number}", label, template))
    return cases


def _score() -> tuple[Counter[str], Counter[str], Counter[str], list[str]]:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    misses: list[str] = []
    for case, _, template in _positive_templates():
        for draw in range(DRAWS):
            text, expected = render(template, random.Random(f"{case}:{draw}"))
            found = scan_text(text)
            for finding in found:
                (tp if finding in expected else fp)[finding.family] += 1
            for finding in expected:
                if finding not in found:
                    fn[finding.family] += 1
            if found != expected:
                misses.append(f"{case} draw {draw}: expected {expected}, found {found} in {text!r}")
    for number, category, template in read_fixture("negatives.tsv"):
        for draw in range(DRAWS):
            text, _ = render(template, random.Random(f"negatives:{number}:{draw}"), decoys=True)
            for finding in scan_text(text):
                fp[finding.family] += 1
                misses.append(f"negatives:{number} ({category}) draw {draw}: {finding} in {text!r}")
    for family in FAMILIES:
        for draw in range(DRAWS):
            rng = random.Random(f"near-miss:{family.name}:{draw}")
            for kind, decoy in near_misses(family, rng).items():
                for text in NEAR_MISS_CONTEXTS:
                    text = text.format(decoy)
                    for finding in scan_text(text):
                        fp[finding.family] += 1
                        misses.append(f"near miss {family.name}:{kind} draw {draw}: {finding} in {text!r}")
    return tp, fp, fn, misses


def _table(tp: Counter[str], fp: Counter[str], fn: Counter[str]) -> tuple[str, dict[str, tuple[float, float]]]:
    rows = [f"{'family':<26} {'tp':>5} {'fp':>4} {'fn':>4} {'precision':>9} {'recall':>7}"]
    scores = {}
    for name in NAMES:
        found, expected = tp[name] + fp[name], tp[name] + fn[name]
        precision = tp[name] / found if found else 1.0
        recall = tp[name] / expected if expected else 0.0
        scores[name] = (precision, recall)
        rows.append(f"{name:<26} {tp[name]:>5} {fp[name]:>4} {fn[name]:>4} {precision:>9.3f} {recall:>7.3f}")
    return "\n".join(rows), scores


@pytest.mark.clause("run.guard-secrets.matchers")
def test_every_family_meets_its_precision_and_recall_floor() -> None:
    tp, fp, fn, misses = _score()
    table, scores = _table(tp, fp, fn)
    print("\nsecret guard, per family, on fixtures/positives.tsv + negatives.tsv "
          f"({DRAWS} draws per template)\n{table}")
    failing = {name: s for name, s in scores.items() if s[0] < PRECISION_FLOOR or s[1] < RECALL_FLOOR}
    assert not failing, f"{failing}\n{table}\n" + "\n".join(misses[:20])


def test_fixtures_cover_every_family_and_name_their_placeholders() -> None:
    per_family: Counter[str] = Counter()
    for case, label, template in _positive_templates():
        keys = placeholders(template)
        assert keys and all(key in CREDENTIALS for key in keys), case
        families = [key.split(":")[0] for key in keys]
        assert set(label.split(",")) == set(families), case
        per_family.update(families)
    for _, category, template in read_fixture("negatives.tsv"):
        assert all(key in DECOYS for key in placeholders(template)), category
    # Every family is exercised in every generic context plus lines of its own.
    assert set(per_family) == set(NAMES)
    assert min(per_family.values()) >= 25, per_family


def test_masking_the_positives_leaves_no_credential_and_is_idempotent() -> None:
    for case, _, template in _positive_templates():
        text, expected = render(template, random.Random(f"{case}:mask"))
        masked, spans = mask_text(text)
        assert spans == len(expected), case
        for finding in expected:
            assert text[finding.start:finding.end] not in masked, case
            assert f"[masked:{finding.family}]" in masked, case
        assert mask_text(masked) == (masked, 0), case
        # What lies outside the credentials stays as it was.
        kept = [text[a.end:b.start] for a, b in zip([Finding("", 0, 0), *expected], expected)]
        assert all(piece in masked for piece in kept), case


# --- the new shapes: escaped renderings, names, map keys, binary (issue 11) --------------------------

SHAPES = ("json-escaped", "url-encoded", "column-name", "field-name", "map-key", "binary")


def _json_escaped(value: str, at: int) -> str:
    """``value`` as JSON-in-a-string writes it: ``/`` as ``\\/``, and the character at ``at`` as ``\\u00XX``."""
    return "".join(f"\\u{ord(c):04x}" if i == at else ("\\/" if c == "/" else c) for i, c in enumerate(value))


def _url_encoded(value: str, at: int) -> str:
    """``value`` percent-encoded: every non-alphanumeric character, and the one at ``at`` too."""
    return "".join(f"%{ord(c):02X}" if (i == at or not c.isalnum()) and ord(c) < 128 else c
                   for i, c in enumerate(value))


def _shapes(value: str, rng: random.Random | None) -> dict[str, tuple[str, str]]:
    """``shape -> (text holding value escaped, what the guard must make of it)`` for one value.

    A credential gets its escape at a random position; a near miss (``rng`` None) at its first
    character, so that neither reading of the text, as written or decoded, shows a credential.
    """
    at = rng.randrange(len(value)) if rng is not None else 0
    json_form, url_form = _json_escaped(value, at), _url_encoded(value, at)
    return {"json-escaped": ('{"v":"' + json_form + '"}', '{"v":"' + mask_message(value) + '"}'),
            "url-encoded": (f"q={url_form}&x=1", f"q={mask_message(value)}&x=1")}


def _arrow_shapes(value: str) -> dict[str, tuple[object, object]]:
    """What the guard leaves of ``value`` placed as a column name, a field name, a map key and binary."""
    table = pa.table({f"c {value}": [1], "s": pa.array([{f"f {value}": 1}]),
                      "m": pa.array([[(f"k {value}", 1)]], pa.map_(pa.string(), pa.int64())),
                      "b": pa.array([f"b {value}".encode()], pa.binary())})
    out = guard_table(table).table
    return {"column-name": (out.schema.names[0], mask_name(f"c {value}")),
            "field-name": (out.schema.field("s").type.field(0).name, mask_name(f"f {value}")),
            "map-key": (out.column("m").to_pylist()[0][0][0], mask_name(f"k {value}")),
            "binary": (out.column("b").to_pylist()[0], mask_message(f"b {value}").encode())}


@pytest.mark.clause("run.guard-secrets.matchers")
def test_every_family_is_found_in_every_new_shape_and_near_misses_stay() -> None:
    tp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    misses: list[str] = []
    for family in FAMILIES:
        for draw in range(DRAWS):
            rng = random.Random(f"shapes:{family.name}:{draw}")
            value = CREDENTIALS[family.name](rng)
            got = {shape: (mask_message(text), want) for shape, (text, want) in _shapes(value, rng).items()}
            got.update(_arrow_shapes(value))
            for shape, (out, want) in got.items():
                ok = out == want and value not in str(out)
                (tp if ok else fn)[shape] += 1
                if not ok:
                    misses.append(f"{family.name} {shape} draw {draw}: {out!r}, wanted {want!r}")
            for kind, decoy in near_misses(family, rng).items():
                for shape, (text, _) in _shapes(decoy, None).items():
                    if mask_message(text) != text:
                        fp[shape] += 1
                        misses.append(f"{family.name}:{kind} {shape}: {mask_message(text)!r}")
                for shape, (out, _) in _arrow_shapes(decoy).items():
                    if decoy not in (out.decode() if isinstance(out, bytes) else str(out)):
                        fp[shape] += 1
                        misses.append(f"{family.name}:{kind} {shape}: {out!r}")
    rows = [f"{'shape':<14} {'tp':>5} {'fp':>4} {'fn':>4}"]
    rows += [f"{shape:<14} {tp[shape]:>5} {fp[shape]:>4} {fn[shape]:>4}" for shape in SHAPES]
    print("\nsecret guard, every family in each new shape\n" + "\n".join(rows))
    recall = sum(tp.values()) / (sum(tp.values()) + sum(fn.values()))
    precision = sum(tp.values()) / (sum(tp.values()) + sum(fp.values()))
    assert recall >= RECALL_FLOOR and precision >= PRECISION_FLOOR, "\n".join(misses[:20])
