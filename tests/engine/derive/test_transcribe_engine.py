"""The built-in transcribe engine, run as a binding runs it: a child process over the shipped WAVs.

``datasets/speech`` holds short espeak-ng phrases and their spoken text (``phrases.ndjson``). The
engine's transcripts are scored by word error rate against that text (edits over reference
words, summed over the phrases). With the dataset's JSGF grammar the decoder can only hear its
sentences, so the bound is tight; with the bundled language model it mishears synthetic speech
now and then, so the bound is loose. Measured with pocketsphinx 5.1.1: 0.000 with the grammar; 0.242
(8 edits over 33 words) without: "look morning everyone", "third on the kitchen like", and "but we
don't talk estimates over the lazy dog" for "the quick brown fox jumps over the lazy dog". The
engine seeds its dither, so these figures repeat exactly on the same wheel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.wer import edits, word_error_rate

REPO = Path(__file__).resolve().parents[3]
SPEECH = REPO / "datasets" / "speech"
GRAMMAR = SPEECH / "phrases.jsgf"
ENGINE = [sys.executable, "-m", "contextful.engine.derive.engines.transcribe"]


def phrases() -> list[dict[str, str]]:
    return [json.loads(line) for line in (SPEECH / "phrases.ndjson").read_text(encoding="utf-8").splitlines()]


def wav_of(phrase: dict[str, str]) -> Path:
    return (REPO / "datasets" / "example" / phrase["path"]).resolve()  # paths are relative to the example project


def run_all(paths: list[Path], *extra: str) -> list[list[dict[str, Any]]]:
    """The engine's protocol lines for each file, the children running side by side."""
    children = [subprocess.Popen([*ENGINE, *extra, str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL) for p in paths]
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err.decode()
        results.append([json.loads(line) for line in out.decode().splitlines()])
    return results


def transcripts(*extra: str) -> list[tuple[str, str]]:
    shipped = phrases()
    pairs = []
    for phrase, lines in zip(shipped, run_all([wav_of(p) for p in shipped], *extra), strict=True):
        for line in lines:  # every line is a protocol passage
            assert set(line) == {"text", "start_s", "end_s", "confidence", "modality"}, line
            assert line["modality"] == "text" and 0.0 <= line["confidence"] <= 1.0, line
            assert 0.0 <= line["start_s"] < line["end_s"], line
        pairs.append((phrase["text"], " ".join(line["text"] for line in lines)))
    return pairs


def test_edits_count_word_substitutions_insertions_and_deletions() -> None:
    assert word_error_rate([("one two three four five", "well two three four five you")]) == 2 / 5
    assert word_error_rate([("open the door please", "oh and the door please"), ("a b", "a b")]) == 2 / 6
    assert edits([], ["a"]) == 1 and edits(["a", "b"], []) == 2 and edits(["a"], ["a"]) == 0


def test_the_dataset_is_small_16k_mono_and_its_grammar_holds_exactly_its_phrases() -> None:
    shipped = phrases()
    assert 5 <= len(shipped) <= 8 and len({p["text"] for p in shipped}) == len(shipped)
    total = 0
    for phrase in shipped:
        with wave.open(str(wav_of(phrase)), "rb") as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16_000, 1, 2)
        total += wav_of(phrase).stat().st_size
    assert total < 512 * 1024
    body = GRAMMAR.read_text(encoding="utf-8").split("=", 1)[1].rstrip().rstrip(";")
    assert sorted(s.strip() for s in body.split("|")) == sorted(p["text"] for p in shipped)


def test_with_the_phrase_grammar_the_engine_hears_the_spoken_text() -> None:
    pairs = transcripts("--grammar", str(GRAMMAR))
    rate = word_error_rate(pairs)
    print(f"word error rate with the JSGF grammar: {rate:.3f} over {len(pairs)} phrases")
    assert rate <= 0.05, pairs


def test_with_the_bundled_language_model_the_engine_mostly_hears_the_spoken_text() -> None:
    pairs = transcripts()
    rate = word_error_rate(pairs)
    print(f"word error rate with the bundled en-us language model: {rate:.3f} over {len(pairs)} phrases")
    assert rate <= 0.35, pairs


def write_wav(path: Path, samples: np.ndarray, rate: int, width: int) -> None:
    """(frames, channels) floats in -1..1 as a PCM WAV of the given sample width."""
    scaled = np.round(samples * (2 ** (8 * width - 1) - 1)).astype(np.int32)
    if width == 1:
        raw = (scaled + 128).astype(np.uint8).tobytes()
    else:
        raw = scaled.astype("<i4").view(np.uint8).reshape(-1, 4)[:, :width].tobytes()  # little-endian low bytes
    with wave.open(str(path), "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)


def test_any_rate_width_and_channel_count_and_an_abrupt_end_are_heard_alike(tmp_path: Path) -> None:
    phrase = next(p for p in phrases() if p["id"] == "open-the-door")
    with wave.open(str(wav_of(phrase)), "rb") as w:
        mono = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    upsampled = np.interp(np.arange(len(mono) * 44_100 // 16_000) * (16_000 / 44_100), np.arange(len(mono)), mono)
    variants = []
    for width, rate, signal in ((3, 44_100, upsampled), (1, 16_000, mono), (4, 16_000, mono)):
        path = tmp_path / f"{width}-{rate}.wav"
        write_wav(path, np.stack([signal, signal], axis=1), rate, width)  # stereo
        variants.append(path)
    # Speech running to the very end of the file still makes its passage, even when the file ends
    # on a boundary of the segmenter's 30 ms frames (where pocketsphinx's Segmenter flushes nothing).
    cut, loud = tmp_path / "cut.wav", np.flatnonzero(np.abs(mono) > 0.05)[-1] + 1
    write_wav(cut, mono[: loud - loud % 480, None], 16_000, 2)
    heard = run_all([*variants, cut], "--grammar", str(GRAMMAR))
    assert [[line["text"] for line in lines] for lines in heard] == [[phrase["text"]]] * 4
    with wave.open(str(cut), "rb") as w:
        assert heard[-1][0]["end_s"] <= w.getnframes() / 16_000


def test_silence_is_empty_and_a_non_wav_fails_with_one_line(tmp_path: Path) -> None:
    silence = tmp_path / "silence.wav"
    write_wav(silence, np.zeros((32_000, 1)), 16_000, 2)
    assert run_all([silence]) == [[{"status": "empty"}]]
    text = tmp_path / "notes.wav"
    text.write_text("not audio at all\n", encoding="utf-8")
    for path in (text, tmp_path / "absent.wav"):
        proc = subprocess.run([*ENGINE, str(path)], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode != 0 and proc.stdout == ""
        assert len(proc.stderr.strip().splitlines()) == 1 and str(path) in proc.stderr, proc.stderr
