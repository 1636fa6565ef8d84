"""Word error rate: how far a transcript is from the spoken text."""

from __future__ import annotations


def edits(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance: substitutions, insertions and deletions turning one into the other."""
    row = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        diagonal, row[0] = row[0], i
        for j, hyp in enumerate(hypothesis, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref != hyp))
    return row[-1]


def word_error_rate(pairs: list[tuple[str, str]]) -> float:
    """Edits over reference words, summed over (reference, hypothesis) pairs."""
    return sum(edits(r.split(), h.split()) for r, h in pairs) / sum(len(r.split()) for r, _ in pairs)
