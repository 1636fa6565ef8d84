"""Regenerates the speech dataset: short WAV files of distinct English phrases, for the transcribe engine.

    python -m contextful.datasets.speech.synthesize [OUT_DIR]     # default: this directory

Each phrase of ``PHRASES`` is spoken by Debian's ``espeak-ng`` (voice en-us, its default 175 words
per minute; ``apt-get install espeak-ng``), converted to 16 kHz mono 16-bit with the transcribe
engine's own converter, given a faint deterministic noise floor (Gaussian, standard deviation
``NOISE`` of full scale, seeded per phrase: a real microphone never records exact digital
silence) and written as ``<id>.wav``. Beside them it writes ``phrases.ndjson`` (one object a line:
``id``, ``path`` relative to the example project ``datasets/example``, ``text``: the spoken words,
lowercase) and ``phrases.jsgf``, a JSGF grammar whose sentences are exactly those texts (the
transcribe engine's ``--grammar``).

The committed files were made with espeak-ng 1.51; another espeak-ng version may speak slightly
different bytes. Tests read the committed files and never run this script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np
from contextful.engine.derive.engines.transcribe import RATE, read_wav, to_pcm16

HERE = Path(__file__).resolve().parent
VOICE, WORDS_PER_MINUTE, NOISE = "en-us", 175, 0.004
PHRASES: tuple[tuple[str, str], ...] = (
    ("open-the-door", "open the door please"),
    ("one-to-five", "one two three four five"),
    ("good-morning", "good morning everyone"),
    ("quick-brown-fox", "the quick brown fox jumps over the lazy dog"),
    ("cup-of-coffee", "i would like a cup of coffee"),
    ("kitchen-light", "turn on the kitchen light"),
)


def speak(text: str, seed: int) -> bytes:
    """16 kHz mono 16-bit PCM of ``text`` spoken by espeak-ng, over a seeded noise floor."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(WORDS_PER_MINUTE), "-w", str(out), text], check=True)
        samples, rate = read_wav(out)
    samples = samples + np.random.default_rng(seed).normal(0.0, NOISE, samples.shape)
    return to_pcm16(samples, rate)


def write_wav(path: Path, pcm: bytes) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm)


def grammar(texts: list[str]) -> str:
    """A JSGF grammar whose public rule matches exactly the given sentences."""
    return "#JSGF V1.0;\ngrammar phrases;\npublic <phrase> = " + "\n    | ".join(texts) + ";\n"


def synthesize(out: Path = HERE) -> list[dict[str, str]]:
    """Writes every phrase's WAV, ``phrases.ndjson`` and ``phrases.jsgf`` under ``out``; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for seed, (ident, text) in enumerate(PHRASES):
        write_wav(out / f"{ident}.wav", speak(text, seed))
        manifest.append({"id": ident, "path": f"../speech/{ident}.wav", "text": text})
    (out / "phrases.ndjson").write_text("".join(json.dumps(row) + "\n" for row in manifest), encoding="utf-8")
    (out / "phrases.jsgf").write_text(grammar([text for _, text in PHRASES]), encoding="utf-8")
    return manifest


if __name__ == "__main__":
    synthesize(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
